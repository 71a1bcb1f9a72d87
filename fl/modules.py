"""A model as the engine sees it, made from a flax module (linen or NNX), an ``init``/``apply``
pair, or a factory named by an import path; its costs come from the module itself.

Contract: a :class:`Model` is ``init(key) -> params`` and ``apply(params, x[batch ...]) ->
outputs[batch ...]``, pure and jittable, plus the :class:`~fl.tasks.Task` it is trained for and
its costs: the parameter count (from ``jax.eval_shape`` of ``init``), float32 bytes, training
FLOPs per sample (3 × the forward FLOPs that XLA's cost analysis of the lowered ``apply``
reports for one sample, the usual 2:1 backward to forward ratio, Kaplan et al. 2020; XLA counts
a loop's body once, so a recurrent model should pass ``flops_per_sample``) and activation floats
per sample (the temporaries XLA allocates for one sample's gradient), which size the chunks of
clients trained at once. :func:`model_from_linen`, :func:`model_from_nnx` and
:func:`model_from_functions` build one; :func:`model_from_path` imports ``PACKAGE.MODULE:FACTORY``
and calls ``FACTORY(input_shape, num_outputs)`` (``rngs=`` too for an NNX module). Failures are
one :class:`~simbase.errors.AisimError` naming the ``model_module`` and what went wrong.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import os
import sys
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

from fl.tasks import CLASSIFICATION, Task
from simbase.errors import AisimError, bad_value


@dataclasses.dataclass(frozen=True)
class Model:
    """A model with its task and costs (see module).

    Attributes:
      name: model name.
      apply: ``(params, x[batch *features]) -> outputs[batch ...]``.
      init: ``(key) -> params``.
      num_params: number of parameters.
      param_bytes: float32 bytes of the parameters (what a client downloads and uploads).
      train_flops_per_sample: FLOPs of one sample's forward and backward pass.
      activation_floats_per_sample: floats of activations kept for the backward pass.
      task: what it is trained for (loss and accuracy).
    """

    name: str
    apply: Callable
    init: Callable
    num_params: int
    param_bytes: float
    train_flops_per_sample: float
    activation_floats_per_sample: float
    task: Task = CLASSIFICATION


def forward_flops(apply: Callable, params, x) -> float:
    """Forward FLOPs of ``apply(params, x)`` from XLA's cost analysis of the lowered function."""
    cost = jax.jit(apply).lower(params, x).cost_analysis()
    if isinstance(cost, list | tuple):
        cost = cost[0]
    return float((cost or {}).get("flops", 0.0))


def gradient_temp_floats(apply: Callable, params, x) -> float:
    """Floats of the temporaries XLA allocates for the gradient of ``sum(apply(params, x))``
    (the activations kept for the backward pass), or the input and output sizes when the
    backend does not report memory."""
    grad = jax.jit(jax.grad(lambda p: jnp.sum(apply(p, x).astype(jnp.float32))))
    try:
        mem = grad.lower(params).compile().memory_analysis()
        return float(mem.temp_size_in_bytes) / 4.0
    except Exception:  # a backend without memory analysis: the input and the output
        out = jax.eval_shape(apply, params, x)
        return float(x.size + sum(math.prod(o.shape) for o in jax.tree.leaves(out)))


# LLVM at -O1 for a program that runs once per run: a model's initialisation (its initialisers'
# polynomials and one threefry hash per layer) compiles in a third to a fifth of the time of
# XLA:CPU's default -O2, which was 1-6 s of every FL run's start, and gives the same bits on every
# built-in model (tests/fl/test_models.py); -O0 does not (it rounds erf_inv's polynomial
# differently).
_RUN_ONCE_OPTIONS = {"xla_backend_optimization_level": 1}


def _run_once_jit(fun: Callable) -> Callable:
    """``jax.jit(fun)`` compiled with :data:`_RUN_ONCE_OPTIONS` on XLA:CPU (accelerators use their
    defaults); decided at the first call, when the backend is known."""
    jitted = None

    def call(*args):
        nonlocal jitted
        if any(isinstance(a, jax.core.Tracer) for a in jax.tree.leaves(args)):
            return fun(*args)  # inside a transformation (eval_shape): options are top-level only
        if jitted is None:
            cpu = jax.default_backend() == "cpu"
            jitted = jax.jit(fun, compiler_options=_RUN_ONCE_OPTIONS if cpu else None)
        return jitted(*args)

    call.__wrapped__ = fun
    return call


def model_from_functions(
    init: Callable,
    apply: Callable,
    input_shape: tuple[int, ...],
    *,
    name: str = "custom",
    task: Task = CLASSIFICATION,
    input_dtype=jnp.float32,
    flops_per_sample: float | None = None,
    activation_floats_per_sample: float | None = None,
) -> Model:
    """A :class:`Model` from ``init(key) -> params`` and ``apply(params, x) -> outputs``.

    Args:
      init: the parameters for a PRNG key.
      apply: the outputs of a batch ``x[batch *input_shape]``.
      input_shape: the shape of one sample.
      name: the model's name in the summary.
      task: the loss and accuracy (:mod:`fl.tasks`).
      input_dtype: the dtype of the features (float32; int32 for token ids).
      flops_per_sample: training FLOPs of one sample, when XLA's count is wrong (loops).
      activation_floats_per_sample: floats kept for the backward pass, likewise.
    """
    x1 = jnp.zeros((1, *input_shape), input_dtype)
    params = jax.eval_shape(init, jax.random.key(0))
    n_params = sum(math.prod(p.shape) for p in jax.tree.leaves(params))
    if flops_per_sample is None:
        flops_per_sample = 3.0 * forward_flops(apply, params, x1)
    if activation_floats_per_sample is None:
        activation_floats_per_sample = gradient_temp_floats(apply, params, x1)
    return Model(
        name=name,
        apply=apply,
        init=_run_once_jit(init),
        num_params=int(n_params),
        param_bytes=4.0 * n_params,
        train_flops_per_sample=float(flops_per_sample),
        activation_floats_per_sample=float(activation_floats_per_sample),
        task=task,
    )


def model_from_linen(
    module: nn.Module, input_shape: tuple[int, ...], input_dtype=jnp.float32, **kw
) -> Model:
    """A :class:`Model` from a flax linen module (``module.init(key, x)``, ``module.apply``);
    keyword arguments as :func:`model_from_functions`."""
    x1 = jnp.zeros((1, *input_shape), input_dtype)
    kw.setdefault("name", type(module).__name__.lower())
    return model_from_functions(
        lambda key: module.init(key, x1), module.apply, input_shape, input_dtype=input_dtype, **kw
    )


def model_from_nnx(
    build: Callable[[nnx.Rngs], nnx.Module], input_shape: tuple[int, ...], **kw
) -> Model:
    """A :class:`Model` from ``build(rngs) -> nnx.Module``: the parameters are the module's
    ``nnx.Param`` state (trained); any other state is held at its initial value. Keyword
    arguments as :func:`model_from_functions`."""
    graphdef, _, rest = nnx.split(nnx.eval_shape(lambda: build(nnx.Rngs(0))), nnx.Param, ...)
    fixed = nnx.split(build(nnx.Rngs(0)), nnx.Param, ...)[2] if jax.tree.leaves(rest) else rest

    def init(key):
        return nnx.split(build(nnx.Rngs(key)), nnx.Param, ...)[1]

    def apply(params, x):
        return nnx.merge(graphdef, params, fixed)(x)

    kw.setdefault("name", "nnx")
    return model_from_functions(init, apply, input_shape, **kw)


def import_object(path: str, field: str):
    """``PACKAGE.MODULE:NAME`` imported (the working directory is searched first, as ``python``
    does for a script); one :class:`AisimError` on ``field`` when it cannot be."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr.isidentifier():
        raise bad_value(None, field, path, "an import path PACKAGE.MODULE:NAME")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # the user's module failed to import: one line, no traceback
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise bad_value(
            None, field, path, f"an importable module ({type(e).__name__}: {msg})"
        ) from None
    if not hasattr(module, attr):
        raise bad_value(None, field, path, f"a name that {module_name} defines")
    return getattr(module, attr)


def model_from_path(
    path: str,
    input_shape: tuple[int, ...],
    num_outputs: int,
    task: Task = CLASSIFICATION,
    input_dtype=jnp.float32,
) -> Model:
    """The model of ``--model-module PACKAGE.MODULE:FACTORY``: ``FACTORY(input_shape,
    num_outputs)`` returns a linen module, a :class:`Model`, or an ``(init, apply)`` pair; a
    factory with an ``rngs`` parameter returns an NNX module built with those ``rngs``."""
    factory = import_object(path, "model_module")
    if not callable(factory):
        raise bad_value(None, "model_module", path, "a callable FACTORY(input_shape, num_outputs)")
    kw = dict(name=path, task=task, input_dtype=input_dtype)
    try:
        if "rngs" in inspect.signature(factory).parameters:
            return model_from_nnx(
                lambda rngs: factory(input_shape, num_outputs, rngs=rngs), input_shape, **kw
            )
        made = factory(input_shape, num_outputs)
        if isinstance(made, Model):
            return made
        if isinstance(made, nn.Module):
            return model_from_linen(made, input_shape, **kw)
        if isinstance(made, tuple) and len(made) == 2 and all(map(callable, made)):
            return model_from_functions(*made, input_shape, **kw)
    except AisimError:
        raise
    except Exception as e:  # the user's model failed to build or trace: one line
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise bad_value(
            None,
            "model_module",
            path,
            f"a model that builds and traces ({type(e).__name__}: {msg})",
        ) from None
    raise bad_value(
        None,
        "model_module",
        path,
        f"a factory returning a flax module, an fl.Model or (init, apply), not {type(made).__name__}",
    )
