"""The extension point of federated algorithms: what one client does, and how the server
turns the cohort's updates into the next global model.

Contract: an :class:`Algorithm` is data plus up to three pure functions, each written for one
client (or, for ``aggregate``, for the server) and vmapped or jitted by the engine
(:mod:`fl.round`), as FedJAX's ``FederatedAlgorithm`` and pfl-research's algorithms are:

- ``local_grad(grad, params, global_params, ctx: LocalContext) -> grad``: applied to every
  local step's gradient before the client's optax transformation (FedProx adds
  ``μ (w − w_global)``, :func:`proximal_grad`; SCAFFOLD adds ``c − c_i``,
  :func:`control_variate_grad`); ``None``: the gradient as it is.
- ``client_update(params, global_params, ctx: ClientContext) -> update``: what the client
  sends after its local steps (:func:`model_difference` by default; DP-FedAvg clips it,
  :func:`clipped_difference`).
- ``aggregate(update_sum, weight_sum, ctx: AggregateContext) -> mean_update``: the server's
  reduction of ``Σ_k w_k · update_k`` over the kept clients, which the engine streams chunk by
  chunk (:func:`weighted_mean` by default; DP-FedAvg adds Gaussian noise and divides by the
  cohort, :func:`noised_mean`). The server optimiser ``server_opt`` (any optax transformation)
  then takes the step ``params ← params + server_opt(−mean_update)`` (Reddi et al. 2021,
  algorithm 2), skipped in a round where nobody was kept.

``weighting`` says what ``w_k`` is (``size``: the client's samples; ``uniform``: 1 per kept
client). The built-in algorithms (:func:`fl.server.make_algorithm`) are written on these same
fields. :func:`check_algorithm` traces the user's functions with ``jax.vmap`` and ``jax.jit``
on the shapes of a run before it starts, and turns a failure into one error naming the function.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float, Int

from fl import aggregation as agg
from fl.choices import unknown_name
from simbase.errors import AisimError

WEIGHTINGS = ("size", "uniform")
STRAGGLER_POLICIES = ("drop", "partial")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LocalContext:
    """What ``local_grad`` may read besides the gradient and the parameters (one client).

    Attributes:
      mu: the run's ``mu`` (FedProx's proximal weight; any algorithm may use it).
      correction: a pytree like the parameters: SCAFFOLD's ``c − c_i``, zeros otherwise.
      step: the local step (0-based).
    """

    mu: Float[Array, ""]
    correction: object
    step: Int[Array, ""]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ClientContext:
    """What ``client_update`` may read (one client): the round's clip norm (DP-FedAvg), the
    client's samples and the local steps it ran."""

    clip_norm: Float[Array, ""]
    num_samples: Int[Array, ""]
    steps: Int[Array, ""]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AggregateContext:
    """What ``aggregate`` may read: the cohort size, the standard deviation of DP-FedAvg's noise
    on the update sum (``z · C``), and a PRNG key of the round's own."""

    cohort: Float[Array, ""]
    noise_std: Float[Array, ""]
    key: Array


# How the engine vmaps a ClientContext over a chunk's clients.
CLIENT_AXES = ClientContext(clip_norm=None, num_samples=0, steps=0)


def model_difference(params, global_params, ctx: ClientContext):
    """The update of FedAvg: ``params − global_params``."""
    del ctx
    return jax.tree.map(jnp.subtract, params, global_params)


def clipped_difference(params, global_params, ctx: ClientContext):
    """DP-FedAvg's update: the difference scaled to L2 norm at most ``ctx.clip_norm`` (McMahan
    et al. 2018, algorithm 1)."""
    return agg.clip_update(model_difference(params, global_params, ctx), ctx.clip_norm)


def weighted_mean(update_sum, weight_sum: Float[Array, ""], ctx: AggregateContext):
    """``Σ w_k Δ_k / Σ w_k`` (0 when nobody was kept)."""
    del ctx
    return jax.tree.map(lambda s: s / jnp.maximum(weight_sum, 1e-12), update_sum)


def noised_mean(update_sum, weight_sum: Float[Array, ""], ctx: AggregateContext):
    """DP-FedAvg: ``(Σ Δ_k + N(0, (zC)²)) / m`` over the cohort of ``m`` (McMahan et al. 2018)."""
    del weight_sum
    noised = agg.gaussian_noise(update_sum, ctx.key, ctx.noise_std)
    return jax.tree.map(lambda s: s / ctx.cohort, noised)


def proximal_grad(grad, params, global_params, ctx: LocalContext):
    """FedProx: ``g + μ (w − w_global)``, the gradient of ``μ/2 ‖w − w_global‖²`` added (Li et
    al. 2020, eq. 2)."""
    return jax.tree.map(lambda g, w, w0: g + ctx.mu * (w - w0), grad, params, global_params)


def control_variate_grad(grad, params, global_params, ctx: LocalContext):
    """SCAFFOLD: ``g + c − c_i`` (Karimireddy et al. 2020, algorithm 1, line 10)."""
    del params, global_params
    return jax.tree.map(jnp.add, grad, ctx.correction)


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """A federated algorithm (see module).

    Attributes:
      name: its name (in the summary).
      server_opt: the optax transformation applied to the pseudo-gradient ``−mean_update``.
      local_grad: ``(grad, params, global_params, LocalContext) -> grad`` or ``None``.
      client_update: ``(params, global_params, ClientContext) -> update``.
      aggregate: ``(update_sum, weight_sum, AggregateContext) -> mean_update``.
      weighting: ``size`` (weight ``n_k``) or ``uniform`` (1 per kept client).
      straggler_policy: ``drop`` (stragglers are discarded) or ``partial`` (their partial work
        is kept, FedProx).
      scaffold: the engine keeps SCAFFOLD's control variates for the population (option II of
        Karimireddy et al. 2020) and passes ``c − c_i`` as ``LocalContext.correction``.
      dp: the engine counts the updates within the clip norm and adapts the clip norm
        (DP-FedAvg; Andrew et al. 2021), and the privacy report is made.
    """

    name: str
    server_opt: optax.GradientTransformation
    local_grad: Callable | None = None
    client_update: Callable = model_difference
    aggregate: Callable = weighted_mean
    weighting: str = "size"
    straggler_policy: str = "drop"
    scaffold: bool = False
    dp: bool = False


def _qualname(fn) -> str:
    mod = getattr(fn, "__module__", None) or "?"
    return f"{mod}.{getattr(fn, '__qualname__', repr(fn))}"


def _trace(what: str, fn, make) -> object:
    """``make()`` (a trace of ``fn``); a failure becomes one :class:`AisimError` naming ``fn``."""
    try:
        return make()
    except AisimError:
        raise
    except Exception as e:  # any failure to trace is the user's function's, reported as one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise AisimError(
            field="algorithm",
            value=_qualname(fn),
            expected=f"a {what} that jax.jit and jax.vmap can trace ({type(e).__name__}: {first})",
        ) from None


def _same_structure(what: str, fn, out, like) -> None:
    if jax.tree.structure(out) != jax.tree.structure(like) or any(
        a.shape != b.shape for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(like), strict=True)
    ):
        raise AisimError(
            field="algorithm",
            value=_qualname(fn),
            expected=f"a {what} that returns a pytree shaped like the model's parameters",
        )


def check_algorithm(alg: Algorithm, params) -> None:
    """Traces ``alg``'s functions as the engine runs them (vmapped over two clients, jitted) on
    abstract values shaped like ``params``; raises one :class:`AisimError` naming the first
    function that cannot be traced or returns the wrong shape."""
    if alg.weighting not in WEIGHTINGS:
        raise unknown_name("weighting", alg.weighting, WEIGHTINGS, "weighting")
    if alg.straggler_policy not in STRAGGLER_POLICIES:
        raise unknown_name("straggler_policy", alg.straggler_policy, STRAGGLER_POLICIES, "policy")
    p = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    two = jax.tree.map(lambda x: jax.ShapeDtypeStruct((2, *x.shape), x.dtype), p)
    f32, i32 = jax.ShapeDtypeStruct((), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32)
    if alg.local_grad is not None:
        ctx = LocalContext(mu=f32, correction=two, step=i32)
        run = jax.jit(jax.vmap(alg.local_grad, in_axes=(0, 0, None, LocalContext(None, 0, None))))
        out = _trace("local_grad", alg.local_grad, lambda: jax.eval_shape(run, two, two, p, ctx))
        _same_structure("local_grad", alg.local_grad, out, two)
    per_client = jax.ShapeDtypeStruct((2,), jnp.int32)
    cctx = ClientContext(clip_norm=f32, num_samples=per_client, steps=per_client)
    run = jax.jit(jax.vmap(alg.client_update, in_axes=(0, None, CLIENT_AXES)))
    out = _trace("client_update", alg.client_update, lambda: jax.eval_shape(run, two, p, cctx))
    _same_structure("client_update", alg.client_update, out, two)
    actx = AggregateContext(cohort=f32, noise_std=f32, key=jax.eval_shape(jax.random.key, 0))
    run = jax.jit(alg.aggregate)
    out = _trace("aggregate", alg.aggregate, lambda: jax.eval_shape(run, p, f32, actx))
    _same_structure("aggregate", alg.aggregate, out, p)
