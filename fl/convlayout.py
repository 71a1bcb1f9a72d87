"""Convolutions in the one layout that XLA:CPU runs fast in every computation.

Contract: :func:`canonical_convs` turns a function into one that computes the same values with
every convolution of its jaxpr rewritten as ``transpose -> NHWC/HWIO->NHWC convolution ->
transpose`` (for any number of spatial dimensions, group counts, strides, padding and dilations
unchanged). :func:`cpu_canonical_convs` does so only where the default backend is the CPU.

Why: XLA:CPU runs a convolution through Eigen's fast kernel only when its dimension numbers are
NHWC input, HWIO kernel and NHWC output (``PotentiallyImplementedAsEigenConvolution``); any other
falls to an unoptimised elemental loop. The pass that transposes other convolutions into that
form, ``xla::cpu::ConvCanonicalization``, walks only the entry computation, so a convolution in
a ``while`` body (``lax.scan``, ``fori_loop``, ``while_loop``) or a ``cond`` branch keeps the
slow loop. A flax ``nn.Conv`` is NHWC/HWIO, but JAX's gradients of it are not (the input
gradient's kernel is ``01oi``, the kernel gradient's operands ``f01b_i01o->01bf``), and local
training runs its steps in a loop: a simple-cnn SGD step on a batch of 10 took 30-60 ms alone
and 1-1.7 s inside a ``lax.scan`` (jax 0.10.2, a shared 2-core CPU). This is jax-ml/jax#12868
("Convolution is significantly slower inside a loop body (CPU)"; its reporter notes that the
channel-last form does not suffer); ``fl/SOURCES.md`` has the measurements. Writing the
transposes into the program does what ``ConvCanonicalization`` does in the entry computation,
wherever the convolution lives: the steps in a loop compute what the same steps unrolled compute
(bit for bit in ``tests/fl/test_convlayout.py``'s case), which differs from the elemental loop's
sums in float rounding only.

The rewrite inlines convolutions out of ``jit`` calls in the function; convolutions inside other
higher-order primitives (``scan``, ``cond``, ``custom_vjp`` bodies, ``remat``) are left as they
are (still correct, not faster).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
from jax import lax
from jax.extend import core as jcore

_CONV = jcore.primitives.conv_general_dilated_p
_CALLS = {jcore.primitives.jit_p: "jaxpr", jcore.primitives.closed_call_p: "call_jaxpr"}


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def _transpose(x, perm: tuple[int, ...]):
    return x if perm == tuple(range(len(perm))) else lax.transpose(x, perm)


def canonical_conv(lhs, rhs, *, dimension_numbers: lax.ConvDimensionNumbers, **params):
    """``conv_general_dilated_p`` with ``dimension_numbers`` (a :class:`lax.ConvDimensionNumbers`:
    ``(batch, feature, spatial...)`` positions of the input and output, ``(out, in, spatial...)``
    of the kernel) computed as a channel-last convolution between transposes."""
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    n = len(lhs_spec)
    lhs_perm = (lhs_spec[0], *lhs_spec[2:], lhs_spec[1])  # -> N, spatial..., C
    rhs_perm = (*rhs_spec[2:], rhs_spec[1], rhs_spec[0])  # -> spatial..., I, O
    out_perm = (out_spec[0], *out_spec[2:], out_spec[1])  # the output's axes in N..C order
    canonical = lax.ConvDimensionNumbers(
        lhs_spec=(0, n - 1, *range(1, n - 1)),
        rhs_spec=(n - 1, n - 2, *range(n - 2)),
        out_spec=(0, n - 1, *range(1, n - 1)),
    )
    out = _CONV.bind(
        _transpose(lhs, lhs_perm),
        _transpose(rhs, rhs_perm),
        dimension_numbers=canonical,
        **params,
    )
    return _transpose(out, _inverse(out_perm))


def _call_body(eqn):
    """The closed jaxpr called by a ``jit`` or ``closed_call`` equation (else ``None``)."""
    key = _CALLS.get(eqn.primitive)
    return None if key is None else eqn.params[key]


def _has_conv(jaxpr) -> bool:
    """Whether ``jaxpr`` or a ``jit`` call in it has a convolution."""
    for eqn in jaxpr.eqns:
        body = _call_body(eqn)
        if eqn.primitive is _CONV or (body is not None and _has_conv(body.jaxpr)):
            return True
    return False


def _bind(eqn, invals):
    """``eqn``'s primitive applied to ``invals`` (what ``jax.core.eval_jaxpr`` does)."""
    bind_params = eqn.primitive.get_bind_params(eqn.params)
    subfuns = ()
    if isinstance(bind_params, tuple):  # older jax: (subfuns, params)
        subfuns, bind_params = bind_params
    with eqn.ctx.manager:
        outs = eqn.primitive.bind(*subfuns, *invals, **bind_params)
    return outs if eqn.primitive.multiple_results else [outs]


def _eval(jaxpr, consts, *args):
    """``jaxpr``'s outputs, with :func:`canonical_conv` for each convolution."""
    env = {}

    def read(v):
        return v.val if isinstance(v, jcore.Literal) else env[v]

    for v, x in zip(jaxpr.constvars, consts, strict=True):
        env[v] = x
    for v, x in zip(jaxpr.invars, args, strict=True):
        env[v] = x
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        body = _call_body(eqn)
        if eqn.primitive is _CONV:
            outs = [canonical_conv(*invals, **eqn.params)]
        elif body is not None and _has_conv(body.jaxpr):  # inlined
            outs = _eval(body.jaxpr, body.consts, *invals)
        else:
            outs = _bind(eqn, invals)
        for v, x in zip(eqn.outvars, outs, strict=True):
            env[v] = x
    return [read(v) for v in jaxpr.outvars]


def canonical_convs(fun: Callable) -> Callable:
    """``fun`` (of arrays and pytrees of arrays) with every convolution that it traces to computed
    by :func:`canonical_conv`; a function without convolutions is returned as it runs."""

    @functools.wraps(fun)
    def wrapped(*args):
        closed, out_shape = jax.make_jaxpr(fun, return_shape=True)(*args)
        if not _has_conv(closed.jaxpr):
            return fun(*args)
        outs = _eval(closed.jaxpr, closed.consts, *jax.tree.leaves(args))
        return jax.tree.unflatten(jax.tree.structure(out_shape), outs)

    return wrapped


def cpu_canonical_convs(fun: Callable) -> Callable:
    """:func:`canonical_convs` where the default backend is the CPU (jax-ml/jax#12868 is an
    XLA:CPU limitation); ``fun`` itself elsewhere."""
    return canonical_convs(fun) if jax.default_backend() == "cpu" else fun
