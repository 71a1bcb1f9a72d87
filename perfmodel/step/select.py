"""``where`` for the step function's scalars: ``jax.lax.select`` without ``jnp.where``'s nested jit.

The step function is thousands of scalar operations traced under ``vmap``; ``jnp.where`` is
itself a jitted function, so each call adds a nested program to trace, lower and compile.
:func:`where` gives the same values (the same dtype promotion for the step function's float32
and boolean operands) with one ``select_n`` each, and a Python ``True``/``False`` condition (a
choice fixed at trace time) picks its branch without tracing anything.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def _operand(x, like):
    if isinstance(x, bool) or getattr(x, "dtype", None) == jnp.bool_:
        return (
            jnp.asarray(x, jnp.bool_)
            if getattr(like, "dtype", None) == jnp.bool_ or isinstance(like, bool)
            else jnp.asarray(x, jnp.float32)
        )
    return jnp.asarray(x, jnp.float32)


def where(cond, on, off):
    """``on`` where ``cond`` holds, else ``off`` (float32, or boolean when both are)."""
    if cond is True:
        return on
    if cond is False:
        return off
    a, b = _operand(on, off), _operand(off, on)
    c = jnp.asarray(cond, jnp.bool_)
    if a.shape == b.shape == c.shape:
        return lax.select(c, a, b)
    c, a, b = jnp.broadcast_arrays(c, a, b)
    return lax.select(c, a, b)
