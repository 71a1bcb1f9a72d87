"""The one place a grid of strategies is vectorised: ``jit(vmap(step_fn))``, sharded over devices.

Contract: :func:`evaluate_grid` takes a struct-of-arrays strategy (leaves of shape ``(n,)``) and
evaluates a one-strategy step function on every row in one compiled program, optionally reducing
the result on the device (:mod:`perfmodel.search.reduce`). :func:`compile_options` picks XLA's
options for the number of rows, and :func:`fast_jit` compiles a short program with them.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from perfmodel.specs.constants import Constants
from perfmodel.specs.hardware import HardwareSpec
from perfmodel.specs.model import ModelSpec
from perfmodel.specs.strategy import Strategy
from perfmodel.step.step_time import step_time
from simbase.xla_options import FAST_CPU_COMPILE, fast_cpu_options

# Grids up to this many rows compile for a fast start on XLA:CPU (see compile_options).
FAST_COMPILE_ROWS = 1 << 18
# LLVM at -O0 and XLA:CPU's classic loop emitters (simbase.xla_options): the step function
# compiles in about a third of the time and runs about 5x slower per row
_FAST_COMPILE = FAST_CPU_COMPILE


def compile_options(rows: int, platform: str | None = None) -> dict | None:
    """XLA options for evaluating the step function over ``rows`` strategies, or None (defaults).

    A small grid (an estimate, the GPT-3 175B grid's 18,000 rows) spends most of its time
    compiling the step function, not running it. ``benchmarks/grid_throughput.py`` measures both
    sides: the fast compilation saves about a second and a half once and costs well under a
    microsecond per row, so it pays off up to a couple of million rows; above
    :data:`FAST_COMPILE_ROWS` the default optimisation is used. Only XLA:CPU is
    tuned this way; accelerators compile with their defaults.

    Args:
      rows: how many strategies the compiled program evaluates per call.
      platform: the JAX platform (default: that of the first device).
    """
    return None if rows > FAST_COMPILE_ROWS else fast_cpu_options(platform)


def stack_rows(trees) -> object:
    """Pytrees of one structure (strategies, model specs) stacked on a new leading axis as
    float32 numpy columns. Built on the host: stacking jax arrays leaf by leaf is a dispatched
    operation per leaf and row (seconds for the few thousand candidate strategies of the shipped
    runs), and the compiled program takes numpy columns as they are."""
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x, np.float32) for x in xs]), *trees)


def padded_to_power_of_two(items: list) -> list:
    """``items`` with its last repeated up to the next power of two in length: a batch of any
    size then compiles one program per size class."""
    return items + items[-1:] * ((1 << (len(items) - 1).bit_length()) - len(items))


def fast_jit(fun, **jit_kwargs):
    """``jax.jit(fun, **jit_kwargs)`` compiled with :func:`compile_options` for one row: for a
    program that runs briefly on few rows (an estimate, a memory check, a small fit), where
    compiling is most of the time. Built on the first call, when the backend is known, so that
    importing a module that defines one does not start JAX's backend."""
    jitted = None

    @functools.wraps(fun)
    def call(*args, **kwargs):
        nonlocal jitted
        if jitted is None:
            jitted = jax.jit(fun, compiler_options=compile_options(1), **jit_kwargs)
        return jitted(*args, **kwargs)

    return call


def evaluate_grid(
    m: ModelSpec,
    hw: HardwareSpec,
    c: Constants,
    grid: Strategy,
    *,
    step_fn=None,
    min_rows: int = 0,
    trim: bool = True,
    reduce=None,
    row_args: tuple = (),
):
    """:func:`step_time` over a struct-of-arrays grid (leading axis ``n``): one ``jit(vmap)``.

    The grid axis is sharded over every JAX device (``jax.devices()``: one CPU, the GPUs of a
    host, or all the devices of a multi-host cluster) with a 1-D ``jax.sharding`` mesh. Rows
    are padded, by repeating the last strategy, to ``max(n, min_rows)`` rounded up to a
    multiple of the device count, so that a sweep can reuse one compiled shape.

    Args:
      m: model dimensions (shared by every row).
      hw: device and link numbers (shared by every row).
      c: constants (shared by every row).
      grid: a :class:`Strategy` whose leaves have shape ``(n,)``.
      step_fn: the one-strategy function to vectorise (default :func:`step_time`; see
        :func:`perfmodel.step.cost_models.select_step_fn`).
      min_rows: pad to at least this many rows (a bucket size).
      trim: drop the padding rows from the result (``False`` keeps them: the caller masks
        rows ``>= n``, and the arrays stay sharded on the devices).
      reduce: optional ``reduce(breakdown, n, *row_args) -> pytree``, a hashable function run
        inside the same ``jit`` on the padded, sharded breakdown (a top-k or a Pareto front),
        so that XLA keeps only what it needs and little leaves the devices.
      row_args: arrays of shape ``(n,)`` for ``reduce``, padded and sharded like the grid.

    Returns:
      A :class:`StepBreakdown` with leaves of shape ``(n,)`` (or the padded length), or what
      ``reduce`` returns.
    """
    fn = step_time if step_fn is None else step_fn
    n = int(grid.layout.dp.shape[0])
    devices = jax.devices()
    rows = -(-max(n, int(min_rows), 1) // len(devices)) * len(devices)
    sharding = jax.sharding.NamedSharding(
        jax.sharding.Mesh(np.asarray(devices), ("n",)), jax.sharding.PartitionSpec("n")
    )

    def place(leaf):
        host = np.asarray(leaf)
        if rows > n:
            host = np.concatenate([host, np.repeat(host[-1:], rows - n, axis=0)])
        # every process holds the whole (deterministic) grid and hands each device its slice
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])

    placed = jax.tree.map(place, grid)
    evaluate = _evaluate_grid if compile_options(rows) is None else _evaluate_grid_fast_compile
    if reduce is not None:
        return evaluate(
            fn,
            reduce,
            m,
            hw,
            c,
            placed,
            np.int32(n),
            tuple(place(a) for a in row_args),
        )
    out = evaluate(fn, None, m, hw, c, placed, None, ())
    if trim and rows != n:
        out = jax.tree.map(lambda x: x[:n], out)
    return out


def _evaluate_grid_impl(fn, reduce, m, hw, c, grid, n, row_args):
    out = jax.vmap(fn, in_axes=(None, None, None, 0))(m, hw, c, grid)
    return out if reduce is None else reduce(out, n, *row_args)


_evaluate_grid = jax.jit(_evaluate_grid_impl, static_argnums=(0, 1))
_evaluate_grid_fast_compile = jax.jit(
    _evaluate_grid_impl, static_argnums=(0, 1), compiler_options=_FAST_COMPILE
)
