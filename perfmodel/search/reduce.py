"""Rank, filter and take the Pareto front of an evaluated strategy grid -> pandas.

Contract: :func:`search` runs the one jitted, sharded evaluation of a
:class:`~perfmodel.search.grid.StrategyGrid` (:func:`perfmodel.search.evaluate.evaluate_grid`) and
reduces it **on the device, inside the same jit**: a masked ``jax.lax.top_k`` of the ranking
score, the best strategy of every sweep point (GPU count × global batch), the Pareto front of
throughput against memory per device, and the counts of feasible and out-of-memory strategies.
Only those few rows travel to the host, where they become :class:`pandas.DataFrame` s in the
shape of :func:`perfmodel.search.report.results_frame`. Infeasible strategies are masked, never
dropped with an error; :func:`infeasible_reasons` and :func:`no_feasible_message` say why.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from perfmodel.search.evaluate import evaluate_grid
from perfmodel.search.grid import StrategyGrid
from perfmodel.search.report import results_frame
from perfmodel.specs.choices import ZeroStage
from perfmodel.specs.constants import Constants
from perfmodel.specs.hardware import HardwareSpec
from perfmodel.specs.model import ModelSpec, host_total_params
from perfmodel.step.breakdown import StepBreakdown
from simbase import units
from simbase.errors import bad_value

if TYPE_CHECKING:
    import pandas as pd

# ranking keys: (StepBreakdown field, larger is better)
RANK_KEYS = {
    "throughput": ("tokens_per_s", True),
    "cost": ("cost_per_million_tokens_usd", False),
    "mfu": ("mfu", True),
}
# model states with mixed-precision (or fp32) Adam, bytes per parameter (Rajbhandari et al. 2020)
MODEL_STATE_BYTES_PER_PARAM = 16.0


def bucket_rows(n: int, minimum: int = 1024) -> int:
    """The padded length of a grid of ``n`` rows: the next power of two (one compile per bucket)."""
    return max(minimum, 1 << max(int(n) - 1, 0).bit_length())


def sweep_points(grid: StrategyGrid) -> tuple[np.ndarray, np.ndarray]:
    """Each row's sweep point (GPU count, global batch) as an id, and the table of points."""
    c = grid.columns
    gpus = (c["dp"] * c["tp"] * c["pp"] * c["cp"]).astype(np.int64)
    gbs = (c["dp"] * c["micro_batch_size"] * c["num_microbatches"]).astype(np.int64)
    if len(gpus) == 0:
        return np.zeros(0, np.int32), np.zeros((0, 2), np.int64)
    pts, inv = np.unique(np.stack([gpus, gbs], axis=1), axis=0, return_inverse=True)
    return inv.reshape(-1).astype(np.int32), pts


def pareto_mask(
    cost: Float[Array, " n"], gain: Float[Array, " n"], ok: Bool[Array, " n"]
) -> Bool[Array, " n"]:
    """Rows that no other row beats: none with ``cost <=`` and ``gain >`` (ties: the first).

    Sort by cost (then gain, descending) and keep the rows whose gain exceeds the running
    maximum of the rows before them. Works inside ``jit``; numpy arrays stay in numpy (a small
    host frame then costs no per-operation compilations).

    Args:
      cost: what to minimise per row (e.g. bytes per device).
      gain: what to maximise per row (e.g. tokens per second).
      ok: rows that may be on the front (infeasible rows never are).

    Returns:
      A boolean mask of the front's rows.
    """
    host = all(isinstance(x, np.ndarray) for x in (cost, gain, ok))
    xp = np if host else jnp
    cost = xp.where(ok, cost, np.inf)
    gain = xp.where(ok, gain, -np.inf)
    order = xp.lexsort((-gain, cost))
    g = gain[order]
    best_before = np.maximum.accumulate(g) if host else jax.lax.cummax(g)
    on_front = g > xp.concatenate([xp.full((1,), -np.inf, g.dtype), best_before[:-1]])
    if host:
        mask = np.zeros(cost.shape, bool)
        mask[order] = on_front
        return mask
    return jnp.zeros(cost.shape, bool).at[order].set(on_front)


def _score(out: StepBreakdown, rank_by: str):
    key, larger = RANK_KEYS[rank_by]
    v = getattr(out, key)
    return v if larger else -v


@functools.lru_cache(maxsize=64)
def _reducer(k: int, num_points: int, front_size: int, rank_by: str):
    """The on-device reduction run inside :func:`evaluate_grid`'s jit (cached: one per shape)."""

    def reduce(
        out: StepBreakdown,
        n: Int[Array, ""],
        point: Float[Array, " rows"],
        zero3: Float[Array, " rows"],
    ):
        rows = jnp.arange(out.step_time_s.shape[0])
        real = rows < n
        valid = real & (out.valid > 0)
        ok = valid & (out.feasible > 0)
        raw = _score(out, rank_by)
        score = jnp.where(ok & jnp.isfinite(raw), raw, -jnp.inf)
        top_val, top_idx = jax.lax.top_k(score, k)
        pt = point.astype(jnp.int32)
        if num_points <= 32:  # a few sweep points: dense masked argmax, fused by XLA (no scatter)
            per = jnp.where(
                pt[None, :] == jnp.arange(num_points)[:, None], score[None, :], -jnp.inf
            )
            best_idx = jnp.argmax(per, axis=1)
            best_idx = jnp.where(jnp.isfinite(jnp.max(per, axis=1)), best_idx, rows.shape[0])
        else:
            best = jax.ops.segment_max(score, pt, num_segments=num_points)
            is_best = ok & (score == best[pt]) & jnp.isfinite(score)
            best_idx = jax.ops.segment_min(
                jnp.where(is_best, rows, rows.shape[0]), pt, num_segments=num_points
            )
        if front_size:
            front = pareto_mask(out.memory_per_device_bytes, out.tokens_per_s, ok)
            (front_idx,) = jnp.nonzero(front, size=front_size, fill_value=rows.shape[0])
        else:  # no Pareto front asked for (skips the sort)
            front, front_idx = jnp.zeros((1,), bool), jnp.full((1,), rows.shape[0])
        mem = out.memory_per_device_bytes
        small = jnp.stack(
            [
                jnp.argmin(jnp.where(valid, mem, jnp.inf)),
                jnp.argmin(jnp.where(valid & (zero3 > 0), mem, jnp.inf)),
            ]
        )

        counts = dict(
            feasible=ok.sum(),
            out_of_memory=(valid & ~(out.fits_memory > 0)).sum(),
            invalid=(real & ~valid).sum(),
            pareto=front.sum(),
            valid_zero3=(valid & (zero3 > 0)).sum(),
            valid=valid.sum(),
        )
        picked = dict(top_idx=top_idx, best_idx=best_idx, front_idx=front_idx, small_idx=small)
        # the picked rows' whole breakdowns, gathered in the same jit: one compilation for the
        # search (a second jit over the picked rows compiled the step function again)
        at = jnp.clip(jnp.concatenate(list(picked.values())), 0, rows.shape[0] - 1)
        return dict(
            top_val=top_val,
            counts=counts,
            rows=jax.tree.map(lambda a: a[at], out),
            **picked,
        )

    return reduce


def _to_host(x) -> np.ndarray:
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    if x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """One grid reduced on the device; the frames are in :func:`results_frame` shape.

    Attributes:
      model: the model spec (for messages).
      grid: the enumerated strategies (``evaluated = len(grid)``).
      top: the top-k feasible strategies, best first.
      best_per_point: the best feasible strategy of each sweep point (GPU count × global
        batch) that has one, by GPU count.
      pareto: the Pareto front of throughput against memory per device, by memory.
      smallest: the valid strategy with the smallest memory per device, then the smallest
        ZeRO-3 one (0-2 rows; for the "nothing fits" message).
      feasible, out_of_memory, invalid: counts over the grid.
      pareto_truncated: the front had more rows than were brought back.
    """

    model: ModelSpec
    grid: StrategyGrid
    top: pd.DataFrame
    best_per_point: pd.DataFrame
    pareto: pd.DataFrame
    smallest: pd.DataFrame
    feasible: int
    out_of_memory: int
    invalid: int
    pareto_truncated: bool

    @property
    def evaluated(self) -> int:
        return len(self.grid)


def _frame(grid: StrategyGrid, host_out, idx: np.ndarray, keep: np.ndarray) -> pd.DataFrame:
    keep = np.asarray(keep, bool)
    sub = jax.tree.map(lambda a: np.asarray(a)[keep], host_out)
    return stack_results_frame(grid.take(np.asarray(idx)[keep].astype(np.int64)), sub)


def stack_results_frame(grid: StrategyGrid, out) -> pd.DataFrame:
    """:func:`~perfmodel.search.report.results_frame` of a grid's rows and their breakdown
    (host arrays, one per row), each row labelled with its own stack (a program may have
    evaluated the rows of several)."""
    groups = grid.by_stack()
    if len(groups) <= 1:
        return results_frame(grid.strategy(), out)
    import pandas as pd

    frames = [
        results_frame(grid.take(rows).strategy(), jax.tree.map(lambda a, r=rows: a[r], out))
        for _, rows in groups
    ]
    order = np.argsort(np.concatenate([rows for _, rows in groups]), kind="stable")
    return pd.concat(frames, ignore_index=True).iloc[order].reset_index(drop=True)


def search(
    m: ModelSpec,
    hw: HardwareSpec,
    c: Constants,
    grid: StrategyGrid,
    *,
    step_fn=None,
    k: int = 10,
    rank_by: str = "throughput",
    front_size: int = 256,
) -> SearchResult:
    """Evaluates a whole grid in one jit per software stack and reduces it on the device
    (top-k, per sweep point, Pareto front, counts): only those rows are transferred to the
    host, where the stacks' results are merged (:func:`merge_results`).

    Args:
      m: the model spec.
      hw: the hardware spec.
      c: the constants.
      grid: the strategies (:func:`perfmodel.search.grid.enumerate_strategies`).
      step_fn: the one-strategy cost model (default :func:`perfmodel.step.step_time.step_time`).
      k: how many of the best strategies to keep.
      rank_by: a key of :data:`RANK_KEYS` (tokens/s, cost per million tokens, MFU).
      front_size: at most this many Pareto rows come back.

    Returns:
      A :class:`SearchResult` (frames in :func:`~perfmodel.search.report.results_frame` shape).

    Raises:
      AisimError: ``field="rank_by"`` for an unknown ranking.
    """
    if rank_by not in RANK_KEYS:
        raise bad_value(None, "rank_by", rank_by, "one of " + ", ".join(RANK_KEYS))
    programs = grid.by_program()
    if len(programs) > 1:
        parts = [
            _search_stack(m, hw, c, grid.take(rows), program, step_fn, k, rank_by, front_size)
            for program, rows in programs
        ]
        return merge_results(parts, grid, k, rank_by)
    program = programs[0][0] if programs else grid.stacks[0]
    return _search_stack(m, hw, c, grid, program, step_fn, k, rank_by, front_size)


def merge_results(parts: list[SearchResult], grid: StrategyGrid, k: int, rank_by: str):
    """One :class:`SearchResult` from those of a grid's stacks: the best ``k`` of their tops,
    the best of each sweep point, the Pareto front of their fronts, the counts added up."""
    import pandas as pd

    key, larger = RANK_KEYS[rank_by]

    def cat(frames):
        frames = [f for f in frames if not f.empty]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def ranked(df):
        return df if df.empty else df.sort_values(key, ascending=not larger, kind="stable")

    top = ranked(cat([p.top for p in parts])).head(k).reset_index(drop=True)
    best = ranked(cat([p.best_per_point for p in parts]))
    if not best.empty:
        best = best.drop_duplicates(["num_gpus", "global_batch_size"])
        best = best.sort_values("num_gpus", kind="stable").reset_index(drop=True)
    small = cat([p.smallest for p in parts])
    if not small.empty:
        small = small.sort_values("memory_per_device_bytes", kind="stable")
        zero3 = small[small["zero_stage"] == int(ZeroStage.PARAMETERS)]
        small = cat([small.head(1), zero3.head(1)])
    return SearchResult(
        model=parts[0].model,
        grid=grid,
        top=top,
        best_per_point=best,
        pareto=pareto_frame(cat([p.pareto for p in parts]), "memory_per_device_bytes"),
        smallest=small,
        feasible=sum(p.feasible for p in parts),
        out_of_memory=sum(p.out_of_memory for p in parts),
        invalid=sum(p.invalid for p in parts),
        pareto_truncated=any(p.pareto_truncated for p in parts),
    )


def _search_stack(
    m, hw, c, grid: StrategyGrid, program, step_fn, k, rank_by, front_size
) -> SearchResult:
    """:func:`search` of the rows of one program (:meth:`StrategyGrid.by_program`): one jitted
    evaluation and reduction."""
    n = len(grid)
    if n == 0:
        import pandas as pd  # here and in the tables below: not before the program compiles

        empty = pd.DataFrame()
        return SearchResult(
            model=m,
            grid=grid,
            top=empty,
            best_per_point=empty,
            pareto=empty,
            smallest=empty,
            feasible=0,
            out_of_memory=0,
            invalid=0,
            pareto_truncated=False,
        )
    rows = bucket_rows(n)
    point, points = sweep_points(grid)
    reduce = _reducer(max(1, min(int(k), rows)), len(points), min(int(front_size), rows), rank_by)
    zero3 = (grid.columns["zero_stage"] == ZeroStage.PARAMETERS).astype(np.float32)
    res = evaluate_grid(
        m,
        hw,
        c,
        grid.program_strategy(program),
        step_fn=step_fn,
        min_rows=rows,
        reduce=reduce,
        row_args=(point.astype(np.float32), zero3),
    )
    res = jax.tree.map(_to_host, res)
    counts = res["counts"]
    parts = [res["top_idx"], res["best_idx"], res["front_idx"], res["small_idx"]]
    sizes = np.cumsum([0] + [len(p) for p in parts])
    picked = np.clip(np.concatenate(parts), 0, n - 1).astype(np.int64)
    sub = grid.take(picked)
    out = res["rows"]

    def frame(j, keep):
        rows_j = np.arange(sizes[j], sizes[j + 1])[np.asarray(keep, bool)]
        return stack_results_frame(sub.take(rows_j), jax.tree.map(lambda a: a[rows_j], out))

    top = frame(0, np.isfinite(res["top_val"]))
    best = frame(1, res["best_idx"] < n)
    front = frame(2, res["front_idx"] < n)
    front = front.sort_values("memory_per_device_bytes", kind="stable").reset_index(drop=True)
    smallest = frame(3, np.array([counts["valid"] > 0, counts["valid_zero3"] > 0]))
    return SearchResult(
        model=m,
        grid=grid,
        top=top,
        best_per_point=best.sort_values("num_gpus", kind="stable").reset_index(drop=True),
        pareto=front,
        smallest=smallest,
        feasible=int(counts["feasible"]),
        out_of_memory=int(counts["out_of_memory"]),
        invalid=int(counts["invalid"]),
        pareto_truncated=bool(counts["pareto"] > front_size),
    )


def feasible_frame(
    m: ModelSpec, hw: HardwareSpec, c: Constants, grid: StrategyGrid, *, step_fn=None
) -> pd.DataFrame:
    """Every feasible strategy of a grid with its full breakdown (a results file's rows).

    Args:
      m: the model spec.
      hw: the hardware spec.
      c: the constants.
      grid: the strategies.
      step_fn: the one-strategy cost model (default :func:`perfmodel.step.step_time.step_time`).

    Returns:
      A :func:`~perfmodel.search.report.results_frame` of the feasible rows, in grid order.
    """
    import pandas as pd

    if len(grid) == 0:
        return pd.DataFrame()
    frames = []
    for program, rows in grid.by_program():
        sub = grid.take(rows)
        out = evaluate_grid(
            m, hw, c, sub.program_strategy(program), step_fn=step_fn, min_rows=bucket_rows(len(sub))
        )
        out = jax.tree.map(_to_host, out)
        frames.append(_frame(sub, out, np.arange(len(sub)), np.asarray(out.feasible) > 0))
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def pareto_frame(df: pd.DataFrame, cost: str, gain: str = "tokens_per_s") -> pd.DataFrame:
    """The Pareto front of a (small, host) frame: lowest ``cost``, highest ``gain``, by cost."""
    if df.empty:
        return df
    mask = np.asarray(
        pareto_mask(
            df[cost].to_numpy(np.float64), df[gain].to_numpy(np.float64), np.ones(len(df), bool)
        )
    )
    return df[mask].sort_values(cost, kind="stable").reset_index(drop=True)


def infeasible_reasons(results: list[SearchResult], capacities_gib: list[float]) -> dict[str, int]:
    """Why strategies were not feasible: reason -> count (pruned by a rule, or out of memory)."""
    reasons: dict[str, int] = {}

    def add(key, v):
        if v:
            reasons[key] = reasons.get(key, 0) + int(v)

    for r, cap in zip(results, capacities_gib, strict=True):
        add(f"does not fit in {cap:g} GiB per device", r.out_of_memory)
        add("invalid strategy (the cost model's divisibility rules)", r.invalid)
        for k, v in r.grid.rejected.items():
            add(k, v)
    return reasons


def no_feasible_message(r: SearchResult, model_name: str, capacity_bytes: float) -> str:
    """Why a grid has no feasible strategy: the devices per replica that the model states
    need without ZeRO, and the smallest footprint that the grid reaches (ZeRO-3 if it has any).
    """
    if r.evaluated == 0:
        rules = sorted(r.grid.rejected.items(), key=lambda kv: -kv[1])
        why = (
            "; ".join(f"{k} ({v} rejected)" for k, v in rules)
            or "no combination of the given knobs"
        )
        return f"{model_name}: no valid strategy: {why}"
    if r.smallest.empty:
        return f"{model_name}: no valid strategy in the grid (every one breaks a divisibility rule)"
    cap_gib = capacity_bytes / units.GIB
    params = float(host_total_params(r.model))
    states = MODEL_STATE_BYTES_PER_PARAM * params
    need = math.ceil(states / capacity_bytes)
    row = r.smallest.iloc[-1]
    label = "ZeRO-3 " if len(r.smallest) > 1 else ""
    where = (
        f"dp={row['dp']} tp={row['tp']} pp={row['pp']} zero={row['zero_stage']} "
        f"micro-batch={row['micro_batch_size']} recompute={row['recompute']}"
    )
    return (
        f"{model_name}: no strategy fits in {cap_gib:g} GiB per device: its model states "
        f"({MODEL_STATE_BYTES_PER_PARAM:g} B/param × {params / 1e9:.3g}B params = {states / 1e9:.4g} GB) "
        f"need at least {need} × {cap_gib:g} GiB per replica without ZeRO; the smallest "
        f"{label}footprint in this grid is {row['memory_per_device_bytes'] / units.GIB:.1f} GiB "
        f"per device ({where})"
    )
