"""The strategy search over models × hardware: every valid strategy of each pair, evaluated in
one jit and reduced on the device, merged into one ranking.

Contract: :func:`sweep` takes model and hardware presets (or loaded objects), the GPU counts and
global batches to sweep, and optional restrictions of each knob; it enumerates each pair's grid
(:func:`perfmodel.search.grid.enumerate_strategies`, or DistIR's own grid), runs
:func:`perfmodel.search.reduce.search` on it (all GPU counts and batches of a pair in one evaluation),
and returns a :class:`SweepResult` with named fields: the best strategies, the Pareto front of
throughput against memory, the best strategy of each sweep point, the cheapest hardware per
token, and why strategies were not feasible. It never prints; a ``progress`` callback reports
each pair. Errors are :class:`~simbase.errors.AisimError` data whose ``field`` is a parameter
name of :func:`sweep`; a grid without a feasible strategy raises one with ``usage=False`` that
says why.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from perfmodel.plan.estimate import (
    DEFAULT_HARDWARE,
    DEFAULT_MODEL,
    check_cost_model,
    gpus_per_node_of,
    resolve_hardware,
    resolve_model,
)
from perfmodel.plan.stack_constants import stack_constants
from perfmodel.search import reduce as srch
from perfmodel.search.report import row_to_result
from perfmodel.search.sweep_grid import normalise_knobs, pair_grid, positive_list
from perfmodel.specs.choices import Dtype, Schedule
from perfmodel.specs.constants import Constants
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.knobs import STACK_KNOBS
from perfmodel.specs.model import Model, host_total_params
from perfmodel.specs.stack_preset import load_stack
from perfmodel.step.cost_models import select_step_fn
from simbase import units
from simbase.errors import AisimError, bad_value

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_GPUS = 1024
DEFAULT_GLOBAL_BATCH = 1536
ProgressFn = Callable[[int, int, str], None]


@dataclasses.dataclass(frozen=True)
class PairSearch:
    """The search of one (model, hardware) pair, under one software stack."""

    model: Model
    hardware: Hardware
    result: srch.SearchResult
    stack: Any = None  # what the search ran under (a loaded preset or Stack; None: no stack)


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """A whole sweep, ranked. Every strategy is a dict in the shape of
    :func:`perfmodel.search.report.row_to_result` plus ``model``, ``hardware``, ``cost_model`` and
    ``params``.

    Attributes:
      best: the best strategy (``top[0]``).
      top: the best strategies over every pair, best first.
      evaluated, feasible: strategy counts over every grid.
      seconds: wall time of the sweep.
      pareto: the Pareto front of tokens/s against memory per device, by memory.
      infeasible_reasons: reason -> number of strategies (out of memory, pruned by a rule).
      lifted_by: reason (a key of ``infeasible_reasons``) -> the :func:`sweep` parameter that
        lifts the rule (``allow_cross_node_tp``), so that a front end can say what to pass.
      best_per_point: the best strategy of each (model, hardware, GPU count, global batch), when
        there is more than one such point (else empty).
      pareto_gpus: the Pareto front of tokens/s against GPUs over ``best_per_point``, when the
        GPU count was swept (else empty).
      cost_by_hardware: the cheapest strategy per token of each (model, hardware), cheapest
        first, when several hardware were swept (else empty).
      all_feasible: every feasible strategy with its breakdown (``keep_all=True``), else None.
      searches: each pair's own :class:`~perfmodel.search.reduce.SearchResult`.
    """

    best: dict
    top: list[dict]
    evaluated: int
    feasible: int
    seconds: float
    pareto: list[dict]
    infeasible_reasons: dict[str, int]
    best_per_point: list[dict] = dataclasses.field(default_factory=list)
    pareto_gpus: list[dict] = dataclasses.field(default_factory=list)
    cost_by_hardware: list[dict] = dataclasses.field(default_factory=list)
    lifted_by: dict[str, str] = dataclasses.field(default_factory=dict)
    all_feasible: pd.DataFrame | None = None
    searches: tuple[PairSearch, ...] = ()

    @property
    def several_stacks(self) -> bool:
        """Whether the pairs were searched under more than one stack."""
        return _several_stacks(self.searches)

    @property
    def cheapest_hardware(self) -> dict | None:
        """The strategy with the lowest cost per token over the hardware swept, if any."""
        return self.cost_by_hardware[0] if self.cost_by_hardware else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (``aisim perf grid --json``): ``best``, ``top``, ``evaluated``,
        ``feasible``, ``seconds``, ``pareto``, ``infeasible_reasons``, then ``sweep`` (best per
        point), ``pareto_gpus``, ``cost_by_hardware`` and ``cheapest_hardware`` when present."""
        doc: dict[str, Any] = {
            "best": self.best,
            "top": self.top,
            "evaluated": self.evaluated,
            "feasible": self.feasible,
            "seconds": self.seconds,
            "pareto": self.pareto,
            "infeasible_reasons": self.infeasible_reasons,
        }
        if self.best_per_point:
            doc["sweep"] = self.best_per_point
        if self.pareto_gpus:
            doc["pareto_gpus"] = self.pareto_gpus
        if self.cost_by_hardware:
            doc["cost_by_hardware"] = self.cost_by_hardware
            doc["cheapest_hardware"] = self.cheapest_hardware
        return doc


def sweep(
    models: str | Model | Sequence[str | Model] | None = None,
    hardware: str | Hardware | Sequence[str | Hardware] | None = None,
    *,
    num_gpus: int | Sequence[int] | None = None,
    global_batch: int | Sequence[int] | None = None,
    gpus_per_node: int | None = None,
    constants: Constants | Callable[..., Constants] | None = None,
    cost_model: str = "aisim",
    top: int = 10,
    rank_by: str = "throughput",
    keep_all: bool = False,
    allow_cross_node_tp: bool = False,
    progress: ProgressFn | None = None,
    stack=None,
    **knobs: Sequence[Any] | None,
) -> SweepResult:
    """Searches every valid strategy of each (model, hardware) pair and ranks them together.

    Each pair is one jitted evaluation of its whole grid (every GPU count and global batch
    together), reduced on the device by :func:`perfmodel.search.reduce.search`; only the top rows, the
    best of each sweep point and the Pareto front come back.

    Args:
      models: model presets or :class:`Model` s (default ``gpt3-175b``).
      hardware: hardware presets or :class:`Hardware` (default ``a100-80gb``); with several,
        ``cost_by_hardware`` ranks them by price per token.
      num_gpus: the GPU count(s) to sweep (default 1024).
      global_batch: samples per optimiser step, one or several (default 1536).
      gpus_per_node: devices per node (default: each hardware preset's).
      constants: the model's constants for every hardware, or a function of the hardware that
        returns them (a calibrated profile; with several stacks, of the hardware and the
        stack); default each stack's, else each hardware preset's own.
      cost_model: ``aisim`` or ``distir`` (DistIR's formulas, constants and grid: power-of-two
        degrees, one microbatch when pp = 1).
      top: how many of the best strategies to keep.
      rank_by: ``throughput`` (tokens/s), ``cost`` ($ per million tokens) or ``mfu``.
      keep_all: also return every feasible strategy (``all_feasible``).
      allow_cross_node_tp: let tensor parallelism span nodes.
      progress: called as ``progress(i, total, "model on hardware")`` before each pair.
      stack: the software stack: a preset's name, a stack file, a
        :class:`~perfmodel.specs.stack_preset.StackPreset` or a
        :class:`~perfmodel.specs.stack.Stack` (default: the registry's behaviours, with each
        model preset's attention kernel). A preset also brings its recipe defaults and, unless
        ``constants`` is given, its constants for each hardware
        (:func:`~perfmodel.plan.stack_constants.stack_constants`). A list of stacks searches
        every pair under each, ranked together, each row naming its ``stack``: stacks are
        sweep points like hardware.
      **knobs: restrictions of the grid's axes by registry name or alias
        (:data:`perfmodel.search.sweep_grid.GRID_KNOBS`), each a list of values; a stack
        knob's values are crossed as stacks of their own; None means every valid value (or
        the default, for the knobs a grid does not cross by default).

    Returns:
      A :class:`SweepResult`.

    Raises:
      AisimError: a bad argument (``field`` = its name), or no feasible strategy
        (``usage=False``, with why: the memory the model states need, or the rules that
        pruned the grid).
    """
    t0 = time.perf_counter()
    _check_options(cost_model, rank_by, top)
    grid_knobs = normalise_knobs(knobs)
    gpus_l, batch_l = _sweep_points(num_gpus, global_batch)
    pairs = _pairs(models, hardware)
    stacks = sweep_stacks(stack)
    requests = [
        _PairRequest(
            gpus_l, batch_l, grid_knobs, gpus_per_node, allow_cross_node_tp, one, constants,
            cost_model, top, rank_by, keep_all, several_stacks=len(stacks) > 1,
        )
        for one in stacks
    ]  # fmt: skip
    frames = _Frames()
    searches = _search_pairs(pairs, requests, frames, progress)
    if sum(s.result.feasible for s in searches) == 0:
        raise _nothing_feasible(searches)
    several_hardware = len({hw.name for _, hw in pairs}) > 1
    return _assemble(searches, frames, top, rank_by, several_hardware=several_hardware, since=t0)


def _sweep_points(num_gpus, global_batch) -> tuple[list[int], list[int]]:
    """The GPU counts and global batches to sweep (default 1024 and 1536), validated."""
    gpus_l = positive_list(DEFAULT_GPUS if num_gpus is None else num_gpus, "num_gpus")
    batch_l = positive_list(
        DEFAULT_GLOBAL_BATCH if global_batch is None else global_batch, "global_batch"
    )
    return gpus_l, batch_l


@dataclasses.dataclass(frozen=True)
class _PairRequest:
    """What the search of every (model, hardware) pair is asked (the :func:`sweep` arguments
    of the same names): its grid's points and knobs, its constants and how to rank."""

    num_gpus: list[int]
    global_batch: list[int]
    knobs: dict[str, list | None]
    gpus_per_node: int | None
    allow_cross_node_tp: bool
    stack: Any
    constants: Any
    cost_model: str
    top: int
    rank_by: str
    keep_all: bool
    several_stacks: bool = False


def sweep_stacks(stack) -> list:
    """The stacks a sweep runs under: one (as given), or each of a list or tuple, loaded (two
    of one name are an error)."""
    if isinstance(stack, list | tuple):
        loaded = [load_stack(s) for s in stack] or [None]
        names = [getattr(s, "name", None) for s in loaded]
        if len(set(names)) < len(names):
            raise bad_value(None, "stack", ",".join(map(str, names)), "different stacks")
        return loaded
    return [stack]


def _search_pairs(pairs, requests: list[_PairRequest], frames: _Frames, progress):
    """Searches each pair under each stack in turn (:func:`_search_pair`), calling
    ``progress`` before each and once at the end."""
    searches, n = [], len(pairs) * len(requests)
    for request in requests:
        under = f" under {request.stack.name}" if request.several_stacks else ""
        for m, hw in pairs:
            if progress is not None:
                progress(len(searches), n, f"{m.name} on {hw.name}{under}")
            searches.append(_search_pair(m, hw, request, frames))
    if progress is not None:
        progress(n, n, "")
    return searches


def _search_pair(m: Model, hw: Hardware, request: _PairRequest, frames: _Frames) -> PairSearch:
    """Searches one pair's grid on the device and adds its frames, tagged with the model and
    hardware, to ``frames`` (every feasible row too, with ``keep_all``)."""
    gpn = gpus_per_node_of(hw, request.gpus_per_node)
    grid = pair_grid(
        m, hw, request.num_gpus, request.global_batch, gpn, request.knobs, request.cost_model,
        request.allow_cross_node_tp, request.stack,
    )  # fmt: skip
    consts = _constants_for(hw, request.constants, request.stack, request.several_stacks)
    step_fn = select_step_fn(request.cost_model)
    r = srch.search(
        m.spec, hw.spec, consts, grid, step_fn=step_fn, k=request.top, rank_by=request.rank_by
    )
    tag = dict(
        model=m.name,
        hardware=hw.name,
        cost_model=request.cost_model,
        params=float(host_total_params(m.spec)),
    )
    frames.add(r, tag)
    if request.keep_all and r.feasible:
        every = srch.feasible_frame(m.spec, hw.spec, consts, grid, step_fn=step_fn)
        frames.all.append(every.assign(**tag))
    return PairSearch(m, hw, r, request.stack)


def _several_stacks(searches) -> bool:
    return len({id(s.stack) for s in searches}) > 1


def search_of(result: SweepResult, row: dict[str, Any]) -> PairSearch:
    """The pair search that reported ``row``: its model and hardware, and its ``stack`` where
    the sweep ran under several."""
    several = result.several_stacks
    for p in result.searches:
        if (p.model.name, p.hardware.name) == (row["model"], row["hardware"]) and (
            not several or p.stack.name == row.get("stack")
        ):
            return p
    raise KeyError((row["model"], row["hardware"], row.get("stack")))


def _check_options(cost_model: str, rank_by: str, top: int) -> None:
    """Validates the options that do not depend on the model or hardware."""
    check_cost_model(cost_model)
    if rank_by not in srch.RANK_KEYS:
        raise bad_value(None, "rank_by", rank_by, "one of " + ", ".join(srch.RANK_KEYS))
    if top < 1:
        raise bad_value(None, "top", top, "a positive integer")


def _pairs(models, hardware) -> list[tuple[Model, Hardware]]:
    """Every (model, hardware) to search, loaded."""

    def as_list(x, default):
        if x is None:
            return [default]
        return [x] if isinstance(x, str | Model | Hardware) else list(x) or [default]

    model_list = [
        m if isinstance(m, Model) else resolve_model(m) for m in as_list(models, DEFAULT_MODEL)
    ]
    hw_list = [resolve_hardware(h) for h in as_list(hardware, DEFAULT_HARDWARE)]
    return [(m, hw) for m in model_list for hw in hw_list]


def _constants_for(hw: Hardware, constants, stack=None, several_stacks=False) -> Constants:
    """The constants given (a callable of the hardware, and of the stack too when the sweep
    has several), else a stack preset's for this hardware (fitted, or carried over from its
    other hardware), else the hardware preset's."""
    if callable(constants) and several_stacks:
        return constants(hw, stack)
    if constants is None:
        return stack_constants(load_stack(stack), hw).constants
    return constants(hw) if callable(constants) else constants


@dataclasses.dataclass
class _Frames:
    """The host frames of every pair, tagged with the model and hardware, to merge."""

    top: list[pd.DataFrame] = dataclasses.field(default_factory=list)
    pareto: list[pd.DataFrame] = dataclasses.field(default_factory=list)
    points: list[pd.DataFrame] = dataclasses.field(default_factory=list)
    all: list[pd.DataFrame] = dataclasses.field(default_factory=list)

    def add(self, r: srch.SearchResult, tag: dict) -> None:
        for frame, bucket in (
            (r.top, self.top),
            (r.pareto, self.pareto),
            (r.best_per_point, self.points),
        ):
            if not frame.empty:
                bucket.append(frame.assign(**tag))


def _lifted_by(searches: list[PairSearch]) -> dict[str, str]:
    """Rule -> the parameter that lifts it, over every pair's grid."""
    return {k: v for s in searches for k, v in s.result.grid.lifted_by.items()}


def _nothing_feasible(searches: list[PairSearch]) -> AisimError:
    """Why no pair has a feasible strategy, one reason per hardware (``usage=False``); when
    a grid is empty because of a rule that a parameter lifts, the hint names it."""
    msgs = [
        srch.no_feasible_message(
            s.result, s.model.name, float(s.hardware.spec.memory_capacity_bytes)
        )
        for s in searches
    ]
    if len(msgs) > 1:
        several = _several_stacks(searches)
        msgs = [
            f"{s.hardware.name}{f' under {s.stack.name}' if several else ''}: {m}"
            for s, m in zip(searches, msgs, strict=True)
        ]
    empty = [s for s in searches if s.result.evaluated == 0]
    lifts = {
        p for s in empty for r, p in s.result.grid.lifted_by.items() if r in s.result.grid.rejected
    }
    hint = "pass " + " or ".join("{" + p + "}" for p in sorted(lifts)) if lifts else None
    return AisimError("; ".join(dict.fromkeys(msgs)), hint=hint, usage=False)


def _assemble(
    searches: list[PairSearch],
    frames: _Frames,
    top: int,
    rank_by: str,
    *,
    several_hardware: bool,
    since: float,
) -> SweepResult:
    """Merges the pairs' frames into one ranking, the fronts and the per-hardware costs."""
    import pandas as pd

    key, larger = srch.RANK_KEYS[rank_by]
    top_df = (
        pd.concat(frames.top, ignore_index=True)
        .sort_values(key, ascending=not larger, kind="stable")
        .head(top)
        .reset_index(drop=True)
    )
    front = srch.pareto_frame(
        pd.concat(frames.pareto, ignore_index=True), "memory_per_device_bytes"
    )
    points = pd.concat(frames.points, ignore_index=True) if frames.points else pd.DataFrame()
    caps = [float(s.hardware.spec.memory_capacity_bytes) / units.GIB for s in searches]
    results = [s.result for s in searches]
    reasons = srch.infeasible_reasons(results, caps)
    top_rows = _results(top_df)
    many_points = len(points) > 1
    return SweepResult(
        best=top_rows[0],
        top=top_rows,
        evaluated=int(sum(r.evaluated for r in results)),
        feasible=int(sum(r.feasible for r in results)),
        seconds=time.perf_counter() - since,
        pareto=_results(front),
        infeasible_reasons=reasons,
        lifted_by={k: v for k, v in _lifted_by(searches).items() if k in reasons},
        best_per_point=_results(points) if many_points else [],
        pareto_gpus=_gpu_front(points) if many_points else [],
        cost_by_hardware=_cost_by_hardware(points) if several_hardware else [],
        all_feasible=pd.concat(frames.all, ignore_index=True) if frames.all else None,
        searches=tuple(searches),
    )


def _gpu_front(points: pd.DataFrame) -> list[dict]:
    """The Pareto front of tokens/s against GPUs over the best strategy of each point."""
    if len(set(points["num_gpus"])) < 2:
        return []
    return _results(srch.pareto_frame(points, "num_gpus"))


def _cost_by_hardware(points: pd.DataFrame) -> list[dict]:
    """The cheapest strategy per token of each (model, hardware), among the best strategies
    of its sweep points, cheapest first (hardware without a price are left out)."""
    if points.empty:
        return []
    priced = points[np.isfinite(points["cost_per_million_tokens_usd"].to_numpy(float))]
    by_hw = (
        priced.sort_values("cost_per_million_tokens_usd", kind="stable")
        .groupby(["model", "hardware"], sort=False)
        .head(1)
    )
    return _results(by_hw)


def _results(df: pd.DataFrame) -> list[dict]:
    """The rows of a tagged results frame as JSON-ready dicts."""
    out = []
    for _, row in df.iterrows():
        doc = row_to_result(row)
        for k in ("model", "hardware", "cost_model", "params"):
            doc[k] = row[k].item() if hasattr(row[k], "item") else row[k]
        out.append(doc)
    return out


def _stack_tags(r: dict, short: bool) -> str:
    """The tags of the stack behaviours that the registry shows in a strategy's label."""
    tags = (k.tag(r, short) for k in STACK_KNOBS if k.tag is not None and k.name in r)
    return "".join(f" {x}" for x in tags if x)


def strategy_label(r: dict, *, short: bool = True) -> str:
    """One strategy on one line.

    ``short`` (for tables): ``dp32 tp4 pp8 v6 mb1 Z1 SP full`` (dp, tp, pp, the interleave v
    when > 1, the micro-batch size, the ZeRO stage, sequence parallelism, the recomputation),
    plus the schedule when it is GPipe, the dtype when it is not bf16, and the tags of the
    stack behaviours that differ from the registry's (:attr:`perfmodel.specs.knobs.Knob.tag`:
    ``no-ovl`` without the DP overlap, ``FA`` with fused attention). Otherwise the long form:
    ``dp64 tp8 pp2 mbs4 m6 interleaved v12 zero2 selective sp``.
    """
    if not short:
        sched = r["schedule"] + (f" v{r['interleave']}" if r["interleave"] > 1 else "")
        return (
            f"dp{r['dp']} tp{r['tp']} pp{r['pp']} mbs{r['micro_batch_size']} "
            f"m{r['num_microbatches']} {sched} zero{r['zero_stage']} {r['recompute']}"
            + (" sp" if r["sequence_parallel"] else "")
            + (f" {r['dtype']}" if r["dtype"] != Dtype.BF16.label else "")
            + _stack_tags(r, short=False)
            + "".join(f" {k}{r[k]}" for k in ("cp", "ep", "etp") if r.get(k, 1) > 1)
            + (f" shard{r['shard_size']}" if r.get("shard_size", 0) else "")
        )
    parts = [f"dp{r['dp']}", f"tp{r['tp']}", f"pp{r['pp']}"]
    parts += [f"{k}{r[k]}" for k in ("cp", "ep", "etp") if r.get(k, 1) > 1]
    if r.get("shard_size", 0):
        parts.append(f"hsdp{r['shard_size']}")
    if r["interleave"] > 1:
        parts.append(f"v{r['interleave']}")
    if r["schedule"] == Schedule.GPIPE.label:
        parts.append("gpipe")
    parts += [f"mb{r['micro_batch_size']}", f"Z{r['zero_stage']}"]
    if r["sequence_parallel"]:
        parts.append("SP")
    parts.append(r["recompute"])
    if r["dtype"] != Dtype.BF16.label:
        parts.append(r["dtype"])
    return " ".join(parts) + _stack_tags(r, short=True)
