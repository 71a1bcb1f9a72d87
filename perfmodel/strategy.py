"""One parallel strategy as a pytree of scalar leaves, and the codes of its discrete choices.

Knobs that a grid sweeps are array leaves (codes for schedule, recompute and dtype), so a
batch of strategies is the same dataclass with a leading axis (a struct of arrays): that is
what :func:`perfmodel.step_time.evaluate_grid` vmaps over.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from perfmodel.choices import Dtype, Recompute, Schedule
from simbase.errors import bad_value

SCHEDULES = Schedule.labels()
RECOMPUTE = Recompute.labels()
DTYPES = Dtype.labels()
# bytes per element of activations and of communicated tensors, by dtype code; fp8 training
# keeps activations and gradients in 16-bit (Micikevicius et al. 2022, FP8 formats).
ACT_BYTES = (4.0, 4.0, 2.0, 2.0, 2.0)
KNOBS = (
    "dp",
    "tp",
    "pp",
    "micro_batch_size",
    "num_microbatches",
    "interleave",
    "schedule",
    "zero_stage",
    "recompute",
    "sequence_parallel",
    "dtype",
    "dp_overlap",
    "fused_attention",
    "gpus_per_node",
)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Strategy:
    """Parallel degrees and choices of one strategy (scalar leaves; a grid adds an axis).

    Attributes:
      dp, tp, pp: data-, tensor- and pipeline-parallel degrees (dp·tp·pp devices).
      micro_batch_size: samples per microbatch per data-parallel replica.
      num_microbatches: microbatches per replica per optimiser step (gradient accumulation).
      interleave: model chunks per device (v); 1 unless ``schedule`` is interleaved.
      schedule: index into :data:`SCHEDULES`.
      zero_stage: 0-3 (Rajbhandari et al. 2020).
      recompute: index into :data:`RECOMPUTE`.
      sequence_parallel: 1 to shard norms/dropouts over tp (Korthikanti et al. 2022).
      dtype: index into :data:`DTYPES` (compute precision).
      dp_overlap: 1 to overlap the DP gradient reduction with the backward pass.
      fused_attention: 1 for a fused attention kernel (FlashAttention, Dao et al. 2022): the
        s × s scores stay on chip, so they are neither stored nor written to memory, and the
        backward pass recomputes them.
      gpus_per_node: devices that share the intra-node tier.
    """

    dp: Float[Array, "*n"]
    tp: Float[Array, "*n"]
    pp: Float[Array, "*n"]
    micro_batch_size: Float[Array, "*n"]
    num_microbatches: Float[Array, "*n"]
    interleave: Float[Array, "*n"]
    schedule: Float[Array, "*n"]
    zero_stage: Float[Array, "*n"]
    recompute: Float[Array, "*n"]
    sequence_parallel: Float[Array, "*n"]
    dtype: Float[Array, "*n"]
    dp_overlap: Float[Array, "*n"]
    fused_attention: Float[Array, "*n"]
    gpus_per_node: Float[Array, "*n"]

    @property
    def global_batch(self):
        """Samples per optimiser step: dp · micro_batch_size · num_microbatches."""
        return self.dp * self.micro_batch_size * self.num_microbatches

    @property
    def num_gpus(self):
        """Devices used: dp · tp · pp."""
        return self.dp * self.tp * self.pp


def code_of(
    choices: tuple[str, ...], value: str | int | float, field: str, where: str = "strategy"
) -> int:
    """Index of a named choice (``"1f1b"`` -> 1); integers pass through after a range check."""
    if isinstance(value, str):
        key = value.strip().lower()
        aliases = (
            {"true": "full", "false": "none", "yes": "full", "no": "none"}
            if choices is RECOMPUTE
            else {}
        )
        key = aliases.get(key, key)
        if key in choices:
            return choices.index(key)
        raise bad_value(where, field, value, "one of " + ", ".join(choices))
    idx = int(value)
    if not 0 <= idx < len(choices):
        raise bad_value(where, field, value, "one of " + ", ".join(choices))
    return idx


def make_strategy(
    *,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    micro_batch_size: int = 1,
    num_microbatches: int = 1,
    interleave: int = 1,
    schedule: str | int = "1f1b",
    zero_stage: int = 0,
    recompute: str | int = "none",
    sequence_parallel: bool = False,
    dtype: str | int = "bf16",
    dp_overlap: bool = True,
    fused_attention: bool = False,
    gpus_per_node: int = 8,
) -> Strategy:
    """Builds one :class:`Strategy` from Python values (names are converted to codes)."""
    vals = dict(
        dp=dp,
        tp=tp,
        pp=pp,
        micro_batch_size=micro_batch_size,
        num_microbatches=num_microbatches,
        interleave=interleave,
        schedule=code_of(SCHEDULES, schedule, "schedule"),
        zero_stage=zero_stage,
        recompute=code_of(RECOMPUTE, recompute, "recompute"),
        sequence_parallel=float(bool(sequence_parallel)),
        dtype=code_of(DTYPES, dtype, "dtype"),
        dp_overlap=float(bool(dp_overlap)),
        fused_attention=float(bool(fused_attention)),
        gpus_per_node=gpus_per_node,
    )
    return Strategy(**{k: jnp.asarray(float(v), jnp.float32) for k, v in vals.items()})


def stack_strategies(columns: dict[str, np.ndarray]) -> Strategy:
    """A struct-of-arrays :class:`Strategy` from equal-length numpy columns (one per knob)."""
    n = len(next(iter(columns.values())))
    return Strategy(
        **{k: jnp.asarray(np.broadcast_to(np.asarray(columns[k], np.float32), (n,))) for k in KNOBS}
    )


def strategy_to_dict(s: Strategy) -> dict[str, object]:
    """Knobs of one (unbatched) strategy with names instead of codes, for reports."""
    v = {k: float(getattr(s, k)) for k in KNOBS}
    return {
        "dp": int(v["dp"]),
        "tp": int(v["tp"]),
        "pp": int(v["pp"]),
        "micro_batch_size": int(v["micro_batch_size"]),
        "num_microbatches": int(v["num_microbatches"]),
        "interleave": int(v["interleave"]),
        "schedule": SCHEDULES[int(v["schedule"])],
        "zero_stage": int(v["zero_stage"]),
        "recompute": RECOMPUTE[int(v["recompute"])],
        "sequence_parallel": bool(v["sequence_parallel"]),
        "dtype": DTYPES[int(v["dtype"])],
        "dp_overlap": bool(v["dp_overlap"]),
        "fused_attention": bool(v["fused_attention"]),
    }


def strategy_from_knobs(
    *,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    num_gpus: int,
    tp: int = 1,
    pp: int = 1,
    dp: int | None = None,
    global_batch: int | None = None,
    micro_batch_size: int = 1,
    num_microbatches: int | None = None,
    schedule: str | None = None,
    interleave: int = 1,
    zero_stage: int = 0,
    recompute: str = "none",
    sequence_parallel: bool = False,
    dtype: str = "bf16",
    dp_overlap: bool = True,
    fused_attention: bool = False,
    gpus_per_node: int = 8,
    where: str = "command line",
    names: dict[str, str] | None = None,
    tp_rule: str = "divides",
) -> Strategy:
    """Validates user knobs and builds a :class:`Strategy` (dp = gpus / (tp·pp) when omitted).

    ``names`` maps knob names to the option or column names shown in messages. ``tp_rule`` is
    ``"divides"`` (tp divides the heads and KV heads: Megatron's attention split, aisim's model) or
    ``"distir"`` (at most the number of heads, as DistIR's GPT-2 transform checks it).

    Raises:
      AisimError: naming the knob, the bad value and what is expected.
    """
    n = {
        "tp": "tp",
        "pp": "pp",
        "num_gpus": "gpus",
        "global_batch": "global_batch",
        "micro_batch_size": "micro_batch",
        "interleave": "interleave",
        "dp": "dp",
        "num_microbatches": "num_microbatches",
        "zero_stage": "zero",
    } | (names or {})
    for key, val in (
        ("num_gpus", num_gpus),
        ("tp", tp),
        ("pp", pp),
        ("micro_batch_size", micro_batch_size),
        ("interleave", interleave),
    ):
        if val is None or val < 1 or int(val) != val:
            raise bad_value(where, n[key], val, "a positive integer")
    if not 0 <= zero_stage <= 3:
        raise bad_value(where, n["zero_stage"], zero_stage, "a ZeRO stage 0, 1, 2 or 3")
    if tp_rule == "distir":
        if tp > num_heads:
            raise bad_value(
                where,
                n["tp"],
                tp,
                f"at most the number of attention heads ({num_heads}; DistIR's rule)",
            )
    elif num_heads % tp or num_kv_heads % tp:
        raise bad_value(
            where,
            n["tp"],
            tp,
            f"a divisor of the number of attention heads ({num_heads}"
            + (f") and KV heads ({num_kv_heads})" if num_kv_heads != num_heads else ")"),
        )
    if num_gpus % (tp * pp):
        raise bad_value(
            where, n["tp"] + "·" + n["pp"], tp * pp, f"a divisor of {n['num_gpus']}={num_gpus}"
        )
    if dp is None:
        dp = num_gpus // (tp * pp)
    elif dp * tp * pp != num_gpus:
        raise bad_value(where, n["dp"], dp, f"{n['num_gpus']} / (tp·pp) = {num_gpus // (tp * pp)}")
    if pp > num_layers:
        raise bad_value(where, n["pp"], pp, f"at most the number of layers ({num_layers})")
    if num_microbatches is None:
        if global_batch is None:
            global_batch = dp * micro_batch_size
        if global_batch % (dp * micro_batch_size):
            raise bad_value(
                where,
                n["global_batch"],
                global_batch,
                f"a multiple of dp·micro_batch = {dp}·{micro_batch_size} = {dp * micro_batch_size}",
            )
        num_microbatches = global_batch // (dp * micro_batch_size)
    elif global_batch is not None and global_batch != dp * micro_batch_size * num_microbatches:
        raise bad_value(
            where,
            n["global_batch"],
            global_batch,
            f"dp·micro_batch·num_microbatches = {dp * micro_batch_size * num_microbatches}",
        )
    if schedule is None:
        schedule = "interleaved" if interleave > 1 else "1f1b"
    code = code_of(SCHEDULES, schedule, "schedule", where)
    if code == 2:
        if interleave < 2:
            raise bad_value(
                where, n["interleave"], interleave, "at least 2 chunks for the interleaved schedule"
            )
        if pp < 2 or num_layers % (pp * interleave):
            raise bad_value(
                where,
                n["interleave"],
                interleave,
                f"a number of chunks with pp·interleave dividing the {num_layers} layers (pp={pp})",
            )
        if num_microbatches % pp:
            raise bad_value(
                where,
                n["num_microbatches"],
                num_microbatches,
                f"a multiple of pp={pp} for the interleaved schedule",
            )
    elif interleave != 1:
        raise bad_value(where, n["interleave"], interleave, "1 unless --schedule interleaved")
    return make_strategy(
        dp=dp,
        tp=tp,
        pp=pp,
        micro_batch_size=micro_batch_size,
        num_microbatches=num_microbatches,
        interleave=interleave,
        schedule=code,
        zero_stage=zero_stage,
        recompute=code_of(RECOMPUTE, recompute, "recompute", where),
        sequence_parallel=sequence_parallel,
        dtype=code_of(DTYPES, dtype, "dtype", where),
        dp_overlap=dp_overlap,
        fused_attention=fused_attention,
        gpus_per_node=gpus_per_node,
    )


# ---------------------------------------------------------------- grid enumeration


@dataclasses.dataclass(frozen=True)
class StrategyGrid:
    """Every enumerated strategy as numpy columns (a struct of arrays), and what was pruned.

    Attributes:
      columns: one float32 array of length ``n`` per knob in :data:`KNOBS`.
      rejected: reason -> number of candidate combinations pruned for it (divisibility and
        placement rules; memory is judged later, by the step model).
    """

    columns: dict[str, np.ndarray]
    rejected: dict[str, int]

    def __len__(self) -> int:
        return len(self.columns["dp"])

    def strategy(self) -> Strategy:
        """The grid as a :class:`Strategy` whose leaves are numpy arrays of shape ``(n,)``."""
        return Strategy(**{k: self.columns[k] for k in KNOBS})

    def take(self, idx) -> StrategyGrid:
        """The rows ``idx`` (indices or a boolean mask), with the same rejections."""
        return StrategyGrid({k: v[idx] for k, v in self.columns.items()}, self.rejected)


def concat_grids(grids: list[StrategyGrid]) -> StrategyGrid:
    """One grid with the rows of several (a sweep), rejections added up."""
    rejected: dict[str, int] = {}
    for g in grids:
        for k, v in g.rejected.items():
            rejected[k] = rejected.get(k, 0) + v
    cols = {
        k: np.concatenate([g.columns[k] for g in grids]) if grids else np.zeros(0, np.float32)
        for k in KNOBS
    }
    return StrategyGrid(cols, rejected)


def divisors(n: int) -> np.ndarray:
    """Positive divisors of ``n`` in increasing order (vectorised trial division)."""
    d = np.arange(1, math.isqrt(int(n)) + 1)
    d = d[n % d == 0]
    return np.unique(np.concatenate([d, n // d]))


def _cross(rows: dict[str, np.ndarray], name: str, values) -> dict[str, np.ndarray]:
    """Cartesian product of a table of rows with one axis (numpy repeat/tile, no loops)."""
    vals = np.asarray(values, np.int64)
    n = len(next(iter(rows.values())))
    out = {k: np.repeat(v, len(vals)) for k, v in rows.items()}
    out[name] = np.tile(vals, n)
    return out


def _keep(rows, mask, rejected: dict[str, int], reason: str | None):
    bad = int((~mask).sum())
    if bad and reason is not None:
        rejected[reason] = rejected.get(reason, 0) + bad
    return {k: v[mask] for k, v in rows.items()}


def _as_list(values, default) -> tuple[list, bool]:
    if values is None:
        return list(default), False
    return list(values), True


def enumerate_strategies(
    *,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    num_gpus: int | list[int],
    global_batch: int | list[int],
    gpus_per_node: int,
    tp: list[int] | None = None,
    pp: list[int] | None = None,
    micro_batch: list[int] | None = None,
    schedule: list[str] | None = None,
    interleave: list[int] | None = None,
    zero: list[int] | None = None,
    recompute: list[str] | None = None,
    sequence_parallel: list[bool] | None = None,
    dtype: list[str] | None = None,
    dp_overlap: list[bool] | None = None,
    fused_attention: list[bool] | None = None,
    allow_cross_node_tp: bool = False,
    supported_dtypes: list[str] | None = None,
) -> StrategyGrid:
    """Every valid strategy for some GPU counts and global batches, built with numpy.

    The axes are crossed one at a time (``np.repeat``/``np.tile``) and each cross is filtered
    by a vectorised rule, so no Python code runs per configuration:

    - dp·tp·pp = GPUs; tp divides the attention heads and the KV heads (pass the hidden size
      for both for an MLP); tp stays within a node unless ``allow_cross_node_tp``;
    - pp up to the number of layers (uneven stages: the step model uses ``ceil(L/pp)``);
    - the global batch is a multiple of dp, and the micro-batch size divides the per-replica
      batch (``num_microbatches = global_batch / (dp·micro_batch)``);
    - the interleaved schedule needs pp > 1, v >= 2 chunks with pp·v dividing the layers and
      a number of microbatches that is a multiple of pp; other schedules have v = 1, and with
      pp = 1 only one non-interleaved schedule is kept (they are the same);
    - ZeRO 0-3 (only the lowest listed stage when dp = 1), recompute none/selective/full,
      sequence parallelism on/off (off only when tp = 1), the dtypes and the DP overlap.

    ``None`` for a knob means all its values (``dtype``: bf16; ``dp_overlap``: on;
    ``fused_attention``: off).

    Returns:
      A :class:`StrategyGrid`; ``rejected`` counts the pruned (dp, tp, pp) factorisations and
      the pruned values that the caller asked for, by reason.
    """
    rejected: dict[str, int] = {}
    gpus_l = [int(x) for x in np.atleast_1d(num_gpus)]
    gbs_l = [int(x) for x in np.atleast_1d(global_batch)]
    L = int(num_layers)
    rows = _cross({"num_gpus": np.asarray(gpus_l, np.int64)}, "global_batch", gbs_l)

    # ---- tp: the divisors of the GPU count, or the values asked for
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
    if not allow_cross_node_tp:
        rows = _keep(
            rows,
            (rows["tp"] <= gpus_per_node) & (gpus_per_node % rows["tp"] == 0),
            rejected,
            f"tp crosses a node of {gpus_per_node} GPUs (pass --allow-cross-node-tp)",
        )

    # ---- pp: the divisors of gpus / tp (up to the layers), or the values asked for
    pp_l, pp_user = _as_list(pp, np.unique(np.concatenate([divisors(n) for n in gpus_l])))
    rows = _cross(rows, "pp", pp_l)
    rows = _keep(
        rows,
        (rows["num_gpus"] // rows["tp"]) % rows["pp"] == 0,
        rejected,
        "tp·pp does not divide the number of GPUs" if pp_user or tp_user else None,
    )
    rows = _keep(rows, rows["pp"] <= L, rejected, f"pp exceeds the {L} layers")
    rows["dp"] = rows["num_gpus"] // (rows["tp"] * rows["pp"])
    rows = _keep(
        rows,
        rows["global_batch"] % rows["dp"] == 0,
        rejected,
        "the global batch is not a multiple of dp",
    )

    # ---- micro-batch sizes dividing the per-replica batch
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

    # ---- schedule and interleave
    sch_l, sch_user = _as_list(schedule, SCHEDULES)
    sch_codes = sorted({code_of(SCHEDULES, x, "--schedule", "command line") for x in sch_l})
    rows = _cross(rows, "schedule", sch_codes)
    flat = [c for c in sch_codes if c != 2]
    single_stage = rows["pp"] == 1
    keep = ~single_stage | (rows["schedule"] == (1 if 1 in flat else (flat[0] if flat else -1)))
    rows = _keep(rows, keep | (rows["schedule"] == 2), rejected, None)
    rows = _keep(
        rows,
        ~((rows["pp"] == 1) & (rows["schedule"] == 2)),
        rejected,
        "the interleaved schedule needs pp > 1" if sch_user else None,
    )
    v_default = [v for v in divisors(L) if v >= 1]
    v_l, v_user = _as_list(interleave, v_default)
    rows = _cross(rows, "interleave", v_l)
    inter = rows["schedule"] == 2
    rows = _keep(rows, ~inter | (rows["interleave"] >= 2), rejected, None)
    inter = rows["schedule"] == 2
    rows = _keep(
        rows,
        inter | (rows["interleave"] == 1),
        rejected,
        "interleave > 1 needs the interleaved schedule" if v_user and sch_user else None,
    )
    inter = rows["schedule"] == 2
    rows = _keep(
        rows,
        ~inter | (L % (rows["pp"] * rows["interleave"]) == 0),
        rejected,
        f"pp·interleave does not divide the {L} layers" if v_user else None,
    )
    inter = rows["schedule"] == 2
    rows = _keep(
        rows,
        ~inter | (rows["num_microbatches"] % rows["pp"] == 0),
        rejected,
        "the interleaved schedule needs a number of microbatches that is a multiple of pp",
    )

    # ---- ZeRO, recomputation, sequence parallelism, dtype, overlap
    z_l, _ = _as_list(zero, (0, 1, 2, 3))
    rows = _cross(rows, "zero_stage", z_l)
    rows = _keep(rows, (rows["dp"] > 1) | (rows["zero_stage"] == min(z_l)), rejected, None)
    r_l, _ = _as_list(recompute, RECOMPUTE)
    r_codes = sorted({code_of(RECOMPUTE, x, "--recompute", "command line") for x in r_l})
    rows = _cross(rows, "recompute", r_codes)
    sp_l, _ = _as_list(sequence_parallel, (False, True))
    sp_codes = sorted({int(bool(x)) for x in sp_l})
    rows = _cross(rows, "sequence_parallel", sp_codes)
    rows = _keep(
        rows, (rows["tp"] > 1) | (rows["sequence_parallel"] == sp_codes[0]), rejected, None
    )
    rows["sequence_parallel"] = np.where(rows["tp"] > 1, rows["sequence_parallel"], 0)
    d_l, _ = _as_list(dtype, ("bf16",))
    rows = _cross(
        rows, "dtype", sorted({code_of(DTYPES, x, "--dtype", "command line") for x in d_l})
    )
    if supported_dtypes is not None:
        ok = np.isin(rows["dtype"], [code_of(DTYPES, x, "dtype") for x in supported_dtypes])
        rows = _keep(rows, ok, rejected, "the dtype is not supported by the hardware")
    o_l, _ = _as_list(dp_overlap, (True,))
    rows = _cross(rows, "dp_overlap", sorted({int(bool(x)) for x in o_l}))
    fa_l, _ = _as_list(fused_attention, (False,))
    rows = _cross(rows, "fused_attention", sorted({int(bool(x)) for x in fa_l}))
    if 0 in r_codes:  # a fused kernel stores no scores, so selective recomputation equals none
        rows = _keep(
            rows, ~((rows["fused_attention"] == 1) & (rows["recompute"] == 1)), rejected, None
        )
    rows["gpus_per_node"] = np.full(len(rows["dp"]), gpus_per_node, np.int64)
    return StrategyGrid({k: rows[k].astype(np.float32) for k in KNOBS}, rejected)
