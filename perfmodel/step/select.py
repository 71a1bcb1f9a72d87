"""``where`` for the step function's scalars, and a stack behaviour as the step function reads it.

The step function is thousands of scalar operations traced under ``vmap``; ``jnp.where`` is
itself a jitted function, so each call adds a nested program to trace, lower and compile.
:func:`where` gives the same values (the same dtype promotion for the step function's float32
and boolean operands) with one ``select_n`` each, and a Python ``True``/``False`` condition (a
choice fixed at trace time) picks its branch without tracing anything.

:func:`behaviour` reads a stack behaviour: its value fixed at trace time (a Python value, so
the step function branches in Python and compiles one side), or, where a grid evaluates the
rows of several stacks of one preset in one program (the preset's rules give each row its
behaviour: torchtitan's FSDP policy under pipelining, Megatron's TP overlap with sequence
parallelism), the rule's cases as traced selects on the row's knobs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from perfmodel.specs.stack_preset import OPERATORS, Rule
from perfmodel.specs.strategy import Strategy, leaves_of


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


def is_off(x) -> bool:
    """Whether ``x`` is a value fixed at trace time that is false (nothing to compile)."""
    return not isinstance(x, jax.Array) and not x


def both(a, b):
    """``a and b`` where ``b`` may be a Python boolean fixed at trace time (then ``a`` or
    ``False``, nothing traced)."""
    if not isinstance(b, jax.Array):
        return a if b else False
    return a & b


def either(a, b):
    """``a or b`` for Python booleans (fixed at trace time), else traced."""
    if not isinstance(a, jax.Array) and not isinstance(b, jax.Array):
        return bool(a) or bool(b)
    return jnp.logical_or(a, b)


def negate(a):
    """``not a`` for a Python boolean, else traced."""
    return (not a) if not isinstance(a, jax.Array) else jnp.logical_not(a)


def behaviour(s: Strategy, name: str, f: Callable[[Any], Any] = lambda v: v):
    """``f`` of the stack behaviour ``name`` of strategy ``s``: ``f(value)`` where the stack
    fixes it, or, where it holds a preset's :class:`~perfmodel.specs.stack_preset.Rule` (a
    program for several stacks of one preset), ``f`` of each case's value selected by the
    first case whose condition holds for the row's knobs (the last case always holds), as
    :meth:`~perfmodel.specs.stack_preset.StackPreset.partition` assigns a row its stack."""
    value = getattr(s.stack, name)
    if not isinstance(value, Rule):
        return f(value)
    codes = leaves_of(s)
    out = f(value.cases[-1][1])
    for cond, case in reversed(value.cases[:-1]):
        holds = True
        for knob, op, code in cond.tests:
            holds = holds & OPERATORS[op](codes[knob], code)
        out = where(holds, f(case), out)
    return out
