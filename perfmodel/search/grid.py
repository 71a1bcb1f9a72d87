"""Every valid strategy of a search as numpy columns (:class:`StrategyGrid`), built without loops.

Contract: :func:`enumerate_strategies` crosses one knob at a time into a table of rows
(``np.repeat``/``np.tile``) and filters each cross with a vectorised rule, counting what each
rule pruned (:attr:`StrategyGrid.rejected`). The software-stack knobs are not columns: each
combination of the stack values asked for is one :class:`~perfmodel.specs.stack.Stack`, a sweep
point compiled on its own, and its rows are those where its values matter
(:attr:`perfmodel.specs.knobs.Knob.applies`) and are allowed (``requires``). The stacks a preset's
rules give different rows (torchtitan's FSDP policy with and without pipelining) share one
program (:meth:`StrategyGrid.by_program`): the rules become traced selects on each row's knobs,
so a preset with four such rules compiles once, not up to sixteen times. Memory is not
judged here: the step model masks the strategies that do not fit. A bad knob value raises
:class:`~simbase.errors.AisimError` with ``source=None`` and the knob's registry name as
``field``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from perfmodel.specs.choices import RECOMPUTE_ALIASES, Dtype, Recompute, Schedule, ZeroStage
from perfmodel.specs.knobs import BY_NAME, LEAF_KNOBS, STACK_KNOBS, canonical
from perfmodel.specs.stack import Stack
from perfmodel.specs.stack_preset import (
    AUTO,
    TRACED_BEHAVIOURS,
    StackPreset,
    program_key,
    shared_program,
)
from perfmodel.specs.strategy import Strategy, leaf_codes, stack_strategies
from perfmodel.step.recompute import selective_redoes_nothing
from simbase.errors import bad_value

Rows = dict[str, np.ndarray]
LEAF_NAMES = tuple(k.name for k in LEAF_KNOBS)


@dataclasses.dataclass(frozen=True)
class StrategyGrid:
    """Every enumerated strategy as numpy columns (a struct of arrays), and what was pruned.

    Attributes:
      columns: one float32 array of length ``n`` per leaf knob of the registry, and
        ``stack_id``, each row's index into ``stacks``.
      stacks: the software stacks of the grid (each compiles its own program).
      rejected: reason -> number of candidate combinations pruned for it (divisibility and
        placement rules; memory is judged later, by the step model).
      lifted_by: reason -> the :func:`enumerate_strategies` argument that lifts the rule (for
        example ``allow_cross_node_tp``), so that a front end can say what to pass.
      rules: for each stack, the preset rules that chose its behaviours row by row (those
        :func:`perfmodel.step.select.behaviour` can trace; empty: none), by which stacks of
        one preset share a program (:meth:`by_program`).
    """

    columns: dict[str, np.ndarray]
    rejected: dict[str, int]
    lifted_by: dict[str, str] = dataclasses.field(default_factory=dict)
    stacks: tuple = (Stack(),)
    rules: tuple = ()

    def __len__(self) -> int:
        return len(self.columns["dp"])

    def stack_ids(self) -> np.ndarray:
        """Each row's index into :attr:`stacks`."""
        ids = self.columns.get("stack_id")
        return np.zeros(len(self), np.int64) if ids is None else ids.astype(np.int64)

    def by_stack(self) -> list[tuple[int, np.ndarray]]:
        """(stack index, the rows of that stack) for each stack that has rows."""
        ids = self.stack_ids()
        return [(i, np.flatnonzero(ids == i)) for i in range(len(self.stacks)) if (ids == i).any()]

    def program_of(self, stack):
        """A program stack that evaluates any row of the grid's ``stack`` (the stack itself
        where it is not one of the grid's or no rule chose it): every behaviour its preset's
        rules chose per row held as the rule (:func:`~perfmodel.specs.stack_preset.
        program_key`)."""
        if stack not in self.stacks or not self.rules:
            return stack
        return program_key(stack, self.rules[self.stacks.index(stack)])

    def by_program(self) -> list[tuple[Any, np.ndarray]]:
        """(program stack, its rows) for each compiled program the grid needs: the stacks that
        differ only in behaviours their preset's rules chose row by row share one, whose
        stack holds each such behaviour as the rule (traced per row) where its stacks differ
        and as their common value where they do not."""
        groups: dict[Any, list[int]] = {}
        for i, _ in self.by_stack():
            groups.setdefault(self.program_of(self.stacks[i]), []).append(i)
        ids = self.stack_ids()
        return [
            (
                shared_program(key, [self.stacks[i] for i in members]),
                np.flatnonzero(np.isin(ids, members)),
            )
            for key, members in groups.items()
        ]

    def program_strategy(self, program) -> Strategy:
        """The whole grid as one struct-of-arrays strategy under the ``program`` stack (one of
        :meth:`by_program`'s, for the rows it lists)."""
        return stack_strategies({k: self.columns[k] for k in LEAF_NAMES}, program)

    def strategy(self) -> Strategy:
        """The grid as a :class:`~perfmodel.specs.strategy.Strategy` whose leaves have shape
        ``(n,)`` (a grid of one stack; see :meth:`by_stack`)."""
        groups = self.by_stack()
        if len(groups) > 1:
            raise ValueError("a grid of several stacks is one strategy per stack: use by_stack()")
        stack = self.stacks[groups[0][0]] if groups else self.stacks[0]
        return stack_strategies({k: self.columns[k] for k in LEAF_NAMES}, stack)

    def take(self, idx) -> StrategyGrid:
        """The rows ``idx`` (indices or a boolean mask), with the same rejections."""
        return dataclasses.replace(self, columns={k: v[idx] for k, v in self.columns.items()})


def concat_grids(grids: list[StrategyGrid]) -> StrategyGrid:
    """One grid with the rows of several (a sweep), rejections added up and stacks merged."""
    rejected: dict[str, int] = {}
    lifted_by: dict[str, str] = {}
    stacks: list = []
    rules: list = []
    cols: dict[str, list[np.ndarray]] = {k: [] for k in (*LEAF_NAMES, "stack_id")}
    for g in grids:
        for k, v in g.rejected.items():
            rejected[k] = rejected.get(k, 0) + v
        lifted_by.update(g.lifted_by)
        remap = []
        for i, st in enumerate(g.stacks):
            if st not in stacks:
                stacks.append(st)
                rules.append(g.rules[i] if g.rules else ())
            remap.append(stacks.index(st))
        for k in LEAF_NAMES:
            cols[k].append(g.columns[k])
        cols["stack_id"].append(np.asarray(remap, np.float32)[g.stack_ids()])
    out = {
        k: np.concatenate(v).astype(np.float32) if v else np.zeros(0, np.float32)
        for k, v in cols.items()
    }
    return StrategyGrid(out, rejected, lifted_by, tuple(stacks) or (Stack(),), tuple(rules))


def divisors(n: int) -> np.ndarray:
    """Positive divisors of ``n`` in increasing order (vectorised trial division)."""
    d = np.arange(1, math.isqrt(int(n)) + 1)
    d = d[n % d == 0]
    return np.unique(np.concatenate([d, n // d]))


# ---------------------------------------------------------------- table operations


def _cross(rows: Rows, name: str, values, dtype=np.int64) -> Rows:
    """Cartesian product of a table of rows with one axis (numpy repeat/tile, no loops)."""
    vals = np.asarray(values, dtype)
    n = len(next(iter(rows.values())))
    out = {k: np.repeat(v, len(vals)) for k, v in rows.items()}
    out[name] = np.tile(vals, n)
    return out


def _keep(rows: Rows, mask, rejected: dict[str, int], reason: str | None) -> Rows:
    """The rows where ``mask`` holds; the others are counted under ``reason`` (``None``: a
    combination the user did not ask for, or a duplicate, so not worth reporting)."""
    bad = int((~mask).sum())
    if bad and reason is not None:
        rejected[reason] = rejected.get(reason, 0) + bad
    return {k: v[mask] for k, v in rows.items()}


def _as_list(values, default) -> tuple[list, bool]:
    """The values asked for (and ``True``), or the default values (and ``False``)."""
    if values is None:
        return list(default), False
    return list(values), True


def _codes(choice, values, field: str, aliases=None) -> list[int]:
    """Sorted distinct codes of labels or codes of a :class:`~perfmodel.specs.choices.Choice`."""
    return sorted({int(choice.parse(x, field, aliases=aliases)) for x in values})


def _switch_codes(values) -> list[int]:
    """Sorted distinct 0/1 codes of on/off values."""
    return sorted({int(bool(x)) for x in values})


# ---------------------------------------------------------------- the filters, in order


def _cross_tp(rows, rejected, gpus_l, tp, num_heads, num_kv_heads, gpus_per_node, cross_node):
    """tp: the divisors of the GPU count (or the values asked for), dividing the heads and KV
    heads (Megatron's attention split) and, unless ``cross_node``, within one node."""
    tp_l, tp_user = _as_list(tp, np.unique(np.concatenate([divisors(n) for n in gpus_l])))
    rows = _cross(rows, "tp", tp_l)
    rows = _keep(
        rows,
        rows["num_gpus"] % rows["tp"] == 0,
        rejected,
        "tp does not divide the number of GPUs" if tp_user else None,
    )
    rows = _keep(
        rows,
        (num_heads % rows["tp"] == 0) & (num_kv_heads % rows["tp"] == 0),
        rejected,
        f"tp does not divide the {num_heads} attention heads"
        + (f" and {num_kv_heads} KV heads" if num_kv_heads != num_heads else ""),
    )
    if not cross_node:
        rows = _keep(
            rows,
            (rows["tp"] <= gpus_per_node) & (gpus_per_node % rows["tp"] == 0),
            rejected,
            _cross_node_reason(gpus_per_node),
        )
    return rows, tp_user


def _cross_node_reason(gpus_per_node: int) -> str:
    return f"tp crosses a node of {gpus_per_node} GPUs"


def _cross_cp(rows, rejected, cp, seq_len):
    """cp (default 1): dividing gpus / tp, with 2·cp dividing the sequence (each rank takes two
    of 2·cp load-balanced causal chunks, Megatron-Core's ``get_batch_on_this_cp_rank``); an
    MLP (``seq_len=None``) has no sequence to split."""
    cp_l, cp_user = _as_list(cp, (1,))
    rows = _cross(rows, "cp", cp_l)
    rows = _keep(
        rows,
        (rows["num_gpus"] // rows["tp"]) % rows["cp"] == 0,
        rejected,
        "tp·cp does not divide the number of GPUs" if cp_user else None,
    )
    if seq_len is None:
        ok, reason = rows["cp"] == 1, "an MLP has no sequence to split over cp ranks"
    else:
        ok = (rows["cp"] == 1) | (seq_len % (2 * rows["cp"]) == 0)
        reason = f"2·cp does not divide the {seq_len}-token sequence"
    return _keep(rows, ok, rejected, reason), cp_user


def _cross_pp(rows, rejected, gpus_l, pp, tp_user, num_layers, cp_user=False):
    """pp: the divisors of gpus / (tp·cp) (or the values asked for), at most the layers; then
    dp = gpus / (tp·cp·pp) must divide the global batch."""
    pp_l, pp_user = _as_list(pp, np.unique(np.concatenate([divisors(n) for n in gpus_l])))
    rows = _cross(rows, "pp", pp_l)
    names = "tp·cp·pp" if cp_user else "tp·pp"
    rows = _keep(
        rows,
        (rows["num_gpus"] // (rows["tp"] * rows["cp"])) % rows["pp"] == 0,
        rejected,
        f"{names} does not divide the number of GPUs" if pp_user or tp_user or cp_user else None,
    )
    rows = _keep(rows, rows["pp"] <= num_layers, rejected, f"pp exceeds the {num_layers} layers")
    rows["dp"] = rows["num_gpus"] // (rows["tp"] * rows["cp"] * rows["pp"])
    return _keep(
        rows,
        rows["global_batch"] % rows["dp"] == 0,
        rejected,
        "the global batch is not a multiple of dp",
    )


# the routed experts' default ep degrees stop here: Megatron-Core's and DeepSeek's published
# runs use ep <= 64 (DeepSeek-V3 report §3.1: ep 64), and larger degrees only grow the grid
MAX_DEFAULT_EP = 64


def _cross_experts(rows, rejected, ep, etp, num_experts):
    """ep and etp (Megatron-Core's MoE parallel folding): ep divides the routed experts and
    ep·etp divides the tp·cp·dp ranks of a stage; a dense model has ep = etp = 1. ep defaults
    to every divisor of the experts up to :data:`MAX_DEFAULT_EP` (1 for a dense model), etp
    to 1."""
    moe = num_experts > 0
    ep_default = [int(d) for d in divisors(num_experts) if d <= MAX_DEFAULT_EP] if moe else [1]
    ep_l, ep_user = _as_list(ep, ep_default)
    etp_l, etp_user = _as_list(etp, (1,))
    rows = _cross(rows, "ep", ep_l)
    rows = _cross(rows, "etp", etp_l)
    if not moe:
        return _keep(
            rows,
            (rows["ep"] == 1) & (rows["etp"] == 1),
            rejected,
            "the model has no experts (ep or etp > 1)",
        )
    rows = _keep(
        rows,
        num_experts % rows["ep"] == 0,
        rejected,
        f"ep does not divide the {num_experts} experts",
    )
    return _keep(
        rows,
        (rows["tp"] * rows["cp"] * rows["dp"]) % (rows["ep"] * rows["etp"]) == 0,
        rejected,
        "ep·etp does not divide the tp·cp·dp ranks of a stage" if ep_user or etp_user else None,
    )


def _cross_micro_batch(rows, rejected, micro_batch):
    """Micro-batch sizes dividing the per-replica batch; num_microbatches follows."""
    per_replica = rows["global_batch"] // np.maximum(rows["dp"], 1)
    mb_default = (
        np.unique(np.concatenate([divisors(int(b)) for b in np.unique(per_replica)]))
        if len(per_replica)
        else np.ones(1, np.int64)
    )
    mb_l, mb_user = _as_list(micro_batch, mb_default)
    rows = _cross(rows, "micro_batch_size", mb_l)
    rows = _keep(
        rows,
        (rows["global_batch"] // rows["dp"]) % rows["micro_batch_size"] == 0,
        rejected,
        "the micro-batch size does not divide the per-replica batch" if mb_user else None,
    )
    rows["num_microbatches"] = rows["global_batch"] // (rows["dp"] * rows["micro_batch_size"])
    return rows


def _cross_schedule(rows, rejected, schedule):
    """Schedules; with pp = 1 every non-interleaved schedule is the same, so only one is kept
    (1F1B if listed), and the interleaved one needs pp > 1."""
    sch_l, sch_user = _as_list(schedule, Schedule.labels())
    sch_codes = _codes(Schedule, sch_l, "schedule")
    rows = _cross(rows, "schedule", sch_codes)
    inter = int(Schedule.INTERLEAVED)
    flat = [c for c in sch_codes if c != inter]
    one_f_one_b = int(Schedule.ONE_F_ONE_B)
    kept_flat = one_f_one_b if one_f_one_b in flat else (flat[0] if flat else -1)
    keep = (rows["pp"] != 1) | (rows["schedule"] == kept_flat)
    rows = _keep(rows, keep | (rows["schedule"] == inter), rejected, None)
    rows = _keep(
        rows,
        ~((rows["pp"] == 1) & (rows["schedule"] == inter)),
        rejected,
        "the interleaved schedule needs pp > 1" if sch_user else None,
    )
    return rows, sch_user


def _cross_interleave(rows, rejected, interleave, sch_user, num_layers):
    """Chunks per device v (Narayanan et al. SC21 §2.2.2): v >= 2 with pp·v dividing the layers
    and a multiple of pp microbatches for the interleaved schedule, v = 1 for the others."""
    v_l, v_user = _as_list(interleave, [v for v in divisors(num_layers) if v >= 1])
    rows = _cross(rows, "interleave", v_l)

    def inter(r):
        return r["schedule"] == Schedule.INTERLEAVED

    rows = _keep(rows, ~inter(rows) | (rows["interleave"] >= 2), rejected, None)
    rows = _keep(
        rows,
        inter(rows) | (rows["interleave"] == 1),
        rejected,
        "interleave > 1 needs the interleaved schedule" if v_user and sch_user else None,
    )
    rows = _keep(
        rows,
        ~inter(rows) | (num_layers % (rows["pp"] * rows["interleave"]) == 0),
        rejected,
        f"pp·interleave does not divide the {num_layers} layers" if v_user else None,
    )
    return _keep(
        rows,
        ~inter(rows) | (rows["num_microbatches"] % rows["pp"] == 0),
        rejected,
        "the interleaved schedule needs a number of microbatches that is a multiple of pp",
    )


def _cross_memory_knobs(rows, rejected, zero, recompute, sequence_parallel):
    """ZeRO stages (only the lowest listed when dp = 1: nothing to partition), recomputation,
    and sequence parallelism (on only when tp > 1, Korthikanti et al. 2022)."""
    z_l, _ = _as_list(zero, [int(z) for z in ZeroStage])
    z_l = [int(ZeroStage.parse(z, "zero_stage")) for z in z_l]  # in the order asked for
    rows = _cross(rows, "zero_stage", z_l)
    # ZeRO partitions over the dp·cp ranks (Megatron-Core's distributed optimizer)
    dpc = rows["dp"] * rows["cp"]
    rows = _keep(rows, (dpc > 1) | (rows["zero_stage"] == min(z_l)), rejected, None)
    r_l, _ = _as_list(recompute, Recompute.labels())
    r_codes = _codes(Recompute, r_l, "recompute", RECOMPUTE_ALIASES)
    rows = _cross(rows, "recompute", r_codes)
    sp_l, _ = _as_list(sequence_parallel, (False, True))
    sp_codes = _switch_codes(sp_l)
    rows = _cross(rows, "sequence_parallel", sp_codes)
    rows = _keep(
        rows, (rows["tp"] > 1) | (rows["sequence_parallel"] == sp_codes[0]), rejected, None
    )
    rows["sequence_parallel"] = np.where(rows["tp"] > 1, rows["sequence_parallel"], 0)
    return rows, r_codes


def _cross_precision(rows, rejected, dtype, supported_dtypes):
    """Dtypes (those the hardware supports, when it says)."""
    d_l, _ = _as_list(dtype, (Dtype.BF16.label,))
    rows = _cross(rows, "dtype", _codes(Dtype, d_l, "dtype"))
    if supported_dtypes is not None:
        ok = np.isin(rows["dtype"], _codes(Dtype, supported_dtypes, "supported_dtypes"))
        rows = _keep(rows, ok, rejected, "the dtype is not supported by the hardware")
    return rows


def _cross_shard(rows, rejected, shard_size):
    """HSDP shard groups (default 0: shard over every dp·cp rank): a positive size needs
    ZeRO-3 and divides dp·cp."""
    sh_l, _ = _as_list(shard_size, (0,))
    rows = _cross(rows, "shard_size", sh_l)
    hsdp = rows["shard_size"] > 0
    rows = _keep(
        rows,
        ~hsdp | (rows["zero_stage"] == ZeroStage.PARAMETERS),
        rejected,
        "an HSDP shard size needs ZeRO-3",
    )
    sh = np.maximum(rows["shard_size"], 1)
    dpc = rows["dp"] * rows["cp"]
    rows = _keep(
        rows,
        (rows["shard_size"] == 0) | (dpc % sh == 0),
        rejected,
        "the shard size does not divide dp·cp",
    )
    if 0 in sh_l:  # a shard group of all dp·cp ranks is plain ZeRO-3: the same row as 0
        rows = _keep(rows, rows["shard_size"] != rows["dp"] * rows["cp"], rejected, None)
    return rows


def _cross_recompute_layers(rows, rejected, recompute_layers, num_layers):
    """Layers per stage recomputed under full recomputation (default 0: all of them); a
    positive count needs full recomputation and at most ceil(L/pp) layers."""
    k_l, _ = _as_list(recompute_layers, (0,))
    rows = _cross(rows, "recompute_layers", k_l)
    part = rows["recompute_layers"] > 0
    rows = _keep(
        rows,
        ~part | (rows["recompute"] == Recompute.FULL),
        rejected,
        "recompute_layers needs full recomputation",
    )
    per_stage = -(-num_layers // rows["pp"])
    return _keep(
        rows,
        rows["recompute_layers"] <= per_stage,
        rejected,
        "recompute_layers exceeds the layers of a stage",
    )


def _mask(rule, rows: Rows, stack) -> np.ndarray:
    """A knob rule over the rows and one stack's values, as a boolean per row."""
    n = len(rows["dp"])
    values = dict(rows) | {k.name: getattr(stack, k.name) for k in STACK_KNOBS}
    return np.broadcast_to(np.asarray(rule(values), bool), (n,))


def stack_variants(base, values: dict[str, list | None]) -> list:
    """Every combination of the stack values asked for, over ``base`` (a knob not asked for
    keeps the base's value), in the order the values were given."""
    asked = {k.name: values[k.name] for k in STACK_KNOBS if values.get(k.name)}
    names = list(asked)
    out = []
    for combo in itertools.product(*(dict.fromkeys(asked[n]) for n in names)):
        st = dataclasses.replace(base, **dict(zip(names, combo, strict=True)))
        if st not in out:
            out.append(st)
    return out


def _rows_of_stack(rows: Rows, rejected, stack, base, values, r_codes) -> Rows:
    """The rows one stack variant keeps: where each of its values that differs from the kept
    one (the base's value if listed, else the lowest code) matters (``applies``; elsewhere the
    row is a duplicate of the kept value's) and is allowed (``requires``)."""
    keep = np.ones(len(rows["dp"]), bool)
    for knob in STACK_KNOBS:
        listed = values.get(knob.name)
        value = getattr(stack, knob.name)
        if listed and knob.applies is not None:
            base_value = getattr(base, knob.name)
            kept = base_value if base_value in listed else min(listed, key=knob.code)
            if value != kept:
                keep &= _mask(knob.applies, rows, stack)
        if knob.requires is not None and value != knob.default and bool(value):
            ok = _mask(knob.requires[0], rows, stack)
            bad = int((keep & ~ok).sum())
            if bad:
                reason = f"{knob.name} = {knob.text(value)} needs: {knob.requires[1]}"
                rejected[reason] = rejected.get(reason, 0) + bad
            keep &= ok
    if selective_redoes_nothing(stack) and Recompute.NONE in r_codes:
        keep &= rows["recompute"] != Recompute.SELECTIVE
    return {k: v[keep] for k, v in rows.items()}


def _preset_values(preset: StackPreset, v: dict[str, list | None]) -> dict[str, list | None]:
    """The values a stack preset sets where the caller did not: its unconditional recipe
    default for a knob a grid does not cross by default (the dtype), and the ``choices`` of a
    knob the framework cannot run at every value (torchtitan shards with FSDP2 or not at all)."""
    out = dict(v)
    for d in preset.defaults:
        knob = BY_NAME[d.knob]
        if out.get(d.knob) or knob.home == "stack":
            continue
        if d.choices:
            out[d.knob] = list(d.choices)
        elif knob.grid == "default" and d.when is None and d.value != AUTO:
            out[d.knob] = [d.value]
    return out


def parse_lists(knobs: dict[str, Any], where: str | None = None) -> dict[str, list | None]:
    """Lists of values per knob (any registry spelling) parsed by the registry; a single value
    is a list of one, ``None`` or an empty list means "not restricted"."""
    out: dict[str, list | None] = {}
    for name, values in canonical(knobs, where).items():
        if values is None or (
            isinstance(values, Sequence) and not isinstance(values, str) and not values
        ):
            out[name] = None
            continue
        if isinstance(values, str) or not isinstance(values, Sequence):
            values = [values]
        out[name] = [BY_NAME[name].parse(v, where) for v in values]
    return out


def enumerate_strategies(
    *,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    num_gpus: int | list[int],
    global_batch_size: int | list[int] | None = None,
    gpus_per_node: int = 8,
    allow_cross_node_tp: bool = False,
    supported_dtypes: list[str] | None = None,
    num_experts: int = 0,
    seq_len: int | None = None,
    stack=None,
    **knobs: Any,
) -> StrategyGrid:
    """Every valid strategy for some GPU counts and global batches, built with numpy.

    The axes are crossed one at a time (``np.repeat``/``np.tile``) and each cross is filtered
    by a vectorised rule, so no Python code runs per configuration:

    - dp·tp·cp·pp = GPUs; tp divides the attention heads and the KV heads (pass the hidden
      size for both for an MLP); tp stays within a node unless ``allow_cross_node_tp``;
    - 2·cp divides ``seq_len`` (load-balanced causal chunks; an MLP has cp = 1);
    - pp up to the number of layers (uneven stages: the step model uses ``ceil(L/pp)``);
    - the global batch is a multiple of dp, and the micro-batch size divides the per-replica
      batch (``num_microbatches = global_batch / (dp·micro_batch)``);
    - the interleaved schedule needs pp > 1, v >= 2 chunks with pp·v dividing the layers and
      a number of microbatches that is a multiple of pp; other schedules have v = 1, and with
      pp = 1 only one non-interleaved schedule is kept (they are the same);
    - ep divides ``num_experts`` and ep·etp divides tp·cp·dp (Megatron-Core's MoE folding;
      a dense model has ep = etp = 1);
    - ZeRO 0-3 (only the lowest listed stage when dp·cp = 1), recompute none/selective/full,
      sequence parallelism on/off (off only when tp = 1) and the dtypes;
    - an HSDP ``shard_size`` > 0 needs ZeRO-3 and divides dp·cp; ``recompute_layers`` > 0
      needs full recomputation and at most ceil(L/pp) layers;
    - the stack knobs: each combination of the values listed is a stack of its own
      (:func:`stack_variants`), keeping the rows where its values matter and are allowed.

    A knob not given takes every valid value when the registry says so (``grid="all"``: tp,
    pp, micro-batch, schedule, interleave, ZeRO, recompute, sequence parallelism, and ep for a
    MoE model: every divisor of ``num_experts`` up to :data:`MAX_DEFAULT_EP`), else its
    default (dtype bf16, cp 1, ...), and a stack knob the ``stack``'s value.

    Args:
      num_layers: the model's layers.
      num_heads: the model's attention heads (an MLP: its hidden size).
      num_kv_heads: the model's key/value heads (an MLP: its hidden size).
      num_gpus: device counts to sweep (one or several; every pair with a batch is searched).
      global_batch_size: samples per optimiser step to sweep (one or several).
      gpus_per_node: devices per node, or per NVLink domain (tp stays within one unless
        ``allow_cross_node_tp``).
      allow_cross_node_tp: let tensor-parallel groups span nodes.
      supported_dtypes: the dtypes the hardware has (others are pruned), or ``None``.
      num_experts: the model's routed experts (0: dense).
      seq_len: the model's sequence length in tokens (``None``: an MLP, which has cp = 1).
      stack: the base software stack (default: the registry's defaults).
      **knobs: values to try per registry knob (any spelling: ``micro_batch``, ``zero``...).

    Returns:
      A :class:`StrategyGrid`; ``rejected`` counts the pruned (dp, tp, pp) factorisations and
      the pruned values that the caller asked for, by reason.

    Raises:
      AisimError: an unknown knob or a bad value (``field`` = its registry name).
    """
    v, global_batch_size, preset, base = _requested(knobs, global_batch_size, stack)
    rows, rejected, r_codes = _cross_axes(
        v, num_gpus, global_batch_size, num_layers, num_heads, num_kv_heads, gpus_per_node,
        allow_cross_node_tp, supported_dtypes, num_experts, seq_len,
    )  # fmt: skip
    stacks, parts, rules = _stack_parts(rows, rejected, v, base, preset, r_codes)
    return dataclasses.replace(_strategy_grid(stacks, parts, rejected, gpus_per_node), rules=rules)


def _requested(knobs: dict[str, Any], global_batch_size, stack):
    """The values asked for per knob (any spelling; a stack preset's recipe defaults and
    choices where the caller gave none), the global batches (an argument or a knob), the
    preset when ``stack`` is one, and the base stack."""
    knobs = canonical(knobs)  # any spelling: global_batch, micro_batch, zero, ...
    if global_batch_size is None:
        global_batch_size = knobs.pop("global_batch_size", None)
    if global_batch_size is None:
        raise bad_value(None, "global_batch_size", None, "one or several positive integers")
    v = parse_lists(knobs)
    preset = stack if isinstance(stack, StackPreset) else None
    if preset is not None:
        v = _preset_values(preset, v)
    base = stack if isinstance(stack, Stack) else Stack()
    return v, global_batch_size, preset, base


def _cross_axes(
    v, num_gpus, global_batch_size, num_layers, num_heads, num_kv_heads, gpus_per_node,
    allow_cross_node_tp, supported_dtypes, num_experts, seq_len,
):  # fmt: skip
    """The rows of every leaf knob crossed in turn, each cross filtered by its rule (the
    :func:`enumerate_strategies` arguments of the same names; ``v``: the values asked for),
    the count of rows each rule pruned, and the recomputation codes crossed."""
    get = v.get
    rejected: dict[str, int] = {}
    gpus_l = [int(x) for x in np.atleast_1d(num_gpus)]
    gbs_l = [int(x) for x in np.atleast_1d(global_batch_size)]
    L = int(num_layers)
    rows = _cross({"num_gpus": np.asarray(gpus_l, np.int64)}, "global_batch", gbs_l)
    rows, tp_user = _cross_tp(
        rows, rejected, gpus_l, get("tp"), num_heads, num_kv_heads, gpus_per_node,
        allow_cross_node_tp,
    )  # fmt: skip
    rows, cp_user = _cross_cp(rows, rejected, get("cp"), seq_len)
    rows = _cross_pp(rows, rejected, gpus_l, get("pp"), tp_user, L, cp_user)
    rows = _cross_experts(rows, rejected, get("ep"), get("etp"), int(num_experts))
    rows = _cross_micro_batch(rows, rejected, get("micro_batch_size"))
    rows, sch_user = _cross_schedule(rows, rejected, get("schedule"))
    rows = _cross_interleave(rows, rejected, get("interleave"), sch_user, L)
    rows, r_codes = _cross_memory_knobs(
        rows, rejected, get("zero_stage"), get("recompute"), get("sequence_parallel")
    )
    rows = _cross_shard(rows, rejected, get("shard_size"))
    rows = _cross_recompute_layers(rows, rejected, get("recompute_layers"), L)
    rows = _cross_precision(rows, rejected, get("dtype"), supported_dtypes)
    imb_l, _ = _as_list(get("moe_imbalance"), (1.0,))
    rows = _cross(rows, "moe_imbalance", sorted({float(x) for x in imb_l}), np.float64)
    rows["gpus_per_node"] = np.full(len(rows["dp"]), gpus_per_node, np.int64)
    return rows, rejected, r_codes


def _stack_parts(rows: Rows, rejected, v, base, preset, r_codes) -> tuple[list, list[Rows], tuple]:
    """Each stack of the grid, its rows and the preset rules that chose its behaviours per row
    (those the step function can trace, for knobs the caller lists no values of, that give the
    stack's value on every one of its rows): the preset's groups of rows, each crossed with the
    stack values asked for."""
    groups = [(base, rows)]
    if preset is not None:  # the preset's behaviours that depend on the strategy
        groups = [(st, {k: c[m] for k, c in rows.items()}) for st, m in preset.partition(rows)]
    stacks, parts = [], []
    for group_base, group_rows in groups:
        for st in stack_variants(group_base, v):
            stacks.append(st)
            parts.append(_rows_of_stack(group_rows, rejected, st, group_base, v, r_codes))
    if not parts:  # every row was pruned (the preset's groups are empty): an empty grid
        stacks, parts = [base], [rows]
    rules = [
        r for r in (preset.rules if preset is not None else ())
        if r.knob in TRACED_BEHAVIOURS and not v.get(r.knob)
    ]  # fmt: skip
    traced = [
        tuple(r for r in rules if r.gives(getattr(st, r.knob), part))
        for st, part in zip(stacks, parts, strict=True)
    ]
    return stacks, parts, tuple(traced)


def _strategy_grid(stacks: list, parts: list[Rows], rejected, gpus_per_node) -> StrategyGrid:
    """The stacks' rows as one :class:`StrategyGrid` (float32 columns, a leaf knob a part
    lacks at its default, and each row's ``stack_id``)."""
    defaults = leaf_codes({})
    cols = {
        k: np.concatenate([p[k] if k in p else np.full(len(p["dp"]), defaults[k]) for p in parts])
        for k in LEAF_NAMES
    }
    cols["stack_id"] = np.repeat(np.arange(len(stacks)), [len(p["dp"]) for p in parts])
    lifted_by = {}
    if _cross_node_reason(gpus_per_node) in rejected:
        lifted_by[_cross_node_reason(gpus_per_node)] = "allow_cross_node_tp"
    return StrategyGrid(
        {k: c.astype(np.float32) for k, c in cols.items()}, rejected, lifted_by, tuple(stacks)
    )
