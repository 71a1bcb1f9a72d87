"""Every valid strategy of a search as numpy columns (:class:`StrategyGrid`), built without loops.

Contract: :func:`enumerate_strategies` crosses one knob at a time into a table of rows
(``np.repeat``/``np.tile``) and filters each cross with a vectorised rule, counting what each
rule pruned (:attr:`StrategyGrid.rejected`). Memory is not judged here: the step model masks the
strategies that do not fit. A bad knob value (an unknown schedule, recompute mode or dtype)
raises :class:`~simbase.errors.AisimError` with ``source=None`` and the parameter's name as
``field``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from perfmodel.choices import (
    RECOMPUTE_ALIASES,
    AttentionKernel,
    CpComm,
    Dtype,
    MoeDispatch,
    Recompute,
    Schedule,
    ZeroStage,
)
from perfmodel.strategy import KNOBS, Strategy, with_default_knobs

Rows = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class StrategyGrid:
    """Every enumerated strategy as numpy columns (a struct of arrays), and what was pruned.

    Attributes:
      columns: one float32 array of length ``n`` per knob in :data:`~perfmodel.strategy.KNOBS`.
      rejected: reason -> number of candidate combinations pruned for it (divisibility and
        placement rules; memory is judged later, by the step model).
      lifted_by: reason -> the :func:`enumerate_strategies` argument that lifts the rule (for
        example ``allow_cross_node_tp``), so that a front end can say what to pass.
    """

    columns: dict[str, np.ndarray]
    rejected: dict[str, int]
    lifted_by: dict[str, str] = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.columns["dp"])

    def strategy(self) -> Strategy:
        """The grid as a :class:`~perfmodel.strategy.Strategy` whose leaves have shape ``(n,)``."""
        return Strategy(**{k: self.columns[k] for k in KNOBS})

    def take(self, idx) -> StrategyGrid:
        """The rows ``idx`` (indices or a boolean mask), with the same rejections."""
        return StrategyGrid(
            {k: v[idx] for k, v in self.columns.items()}, self.rejected, self.lifted_by
        )


def concat_grids(grids: list[StrategyGrid]) -> StrategyGrid:
    """One grid with the rows of several (a sweep), rejections added up."""
    rejected: dict[str, int] = {}
    lifted_by: dict[str, str] = {}
    for g in grids:
        for k, v in g.rejected.items():
            rejected[k] = rejected.get(k, 0) + v
        lifted_by.update(g.lifted_by)
    cols = {
        k: np.concatenate([g.columns[k] for g in grids]) if grids else np.zeros(0, np.float32)
        for k in KNOBS
    }
    return StrategyGrid(cols, rejected, lifted_by)


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
    """Sorted distinct codes of labels or codes of a :class:`~perfmodel.choices.Choice`."""
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
    z_l = [int(ZeroStage.parse(z, "zero")) for z in z_l]  # in the order asked for
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


def _cross_precision(rows, rejected, dtype, supported_dtypes, dp_overlap):
    """Dtypes (those the hardware supports, when it says) and the DP-overlap switch."""
    d_l, _ = _as_list(dtype, (Dtype.BF16.label,))
    rows = _cross(rows, "dtype", _codes(Dtype, d_l, "dtype"))
    if supported_dtypes is not None:
        ok = np.isin(rows["dtype"], _codes(Dtype, supported_dtypes, "supported_dtypes"))
        rows = _keep(rows, ok, rejected, "the dtype is not supported by the hardware")
    o_l, _ = _as_list(dp_overlap, (True,))
    return _cross(rows, "dp_overlap", _switch_codes(o_l))


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


def _cross_switch(rows, rejected, name, values, default, applies):
    """An on/off (or coded) knob; where it does not apply (``applies`` false for a row) every
    setting is the same, so only one is kept: the default if listed, else the lowest code."""
    codes = sorted({int(v) for v in (default if values is None else values)})
    kept = int(default[0]) if int(default[0]) in codes else codes[0]
    rows = _cross(rows, name, codes)
    return _keep(rows, applies(rows) | (rows[name] == kept), rejected, None)


def _cross_modern_switches(rows, rejected, switches):
    """TP overlap (matters only when tp > 1), the MoE dispatcher and its overlap (ep > 1: with
    ep = 1 no token leaves its rank), CP communication (cp > 1), FSDP resharding (ZeRO-3),
    fp32 gradient reduction (crossed only when asked; otherwise the dtype's default) and the
    MoE imbalance, eager elementwise kernels and the attention kernel (a fused kernel only).
    ``switches`` maps each knob to (values asked for or ``None``, default)."""
    rules = {
        "tp_overlap": lambda r: r["tp"] > 1,
        "moe_dispatch": lambda r: r["ep"] > 1,
        "moe_overlap": lambda r: r["ep"] > 1,
        "cp_comm": lambda r: r["cp"] > 1,
        "fsdp_reshard": lambda r: r["zero_stage"] == ZeroStage.PARAMETERS,
        "eager": lambda r: np.ones(len(r["dp"]), bool),
        "attention_kernel": lambda r: r["fused_attention"] > 0,
    }
    for name, applies in rules.items():
        values, default = switches[name]
        rows = _cross_switch(rows, rejected, name, values, default, applies)
    if switches["grad_reduce_fp32"][0] is not None:
        rows = _cross(rows, "grad_reduce_fp32", _switch_codes(switches["grad_reduce_fp32"][0]))
    imb_l, _ = _as_list(switches["moe_imbalance"][0], (1.0,))
    return _cross(rows, "moe_imbalance", sorted({float(x) for x in imb_l}), np.float64)


def _cross_fused_attention(rows, rejected, fused_attention, r_codes):
    """Fused attention (Dao et al. 2022) stores no s × s scores, so selective recomputation
    equals none: that pair is dropped when none is in the grid."""
    fa_l, _ = _as_list(fused_attention, (False,))
    rows = _cross(rows, "fused_attention", _switch_codes(fa_l))
    if Recompute.NONE in r_codes:
        rows = _keep(
            rows,
            ~((rows["fused_attention"] == 1) & (rows["recompute"] == Recompute.SELECTIVE)),
            rejected,
            None,
        )
    return rows


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
    cp: list[int] | None = None,
    ep: list[int] | None = None,
    etp: list[int] | None = None,
    shard_size: list[int] | None = None,
    recompute_layers: list[int] | None = None,
    tp_overlap: list[bool] | None = None,
    grad_reduce_fp32: list[bool] | None = None,
    moe_imbalance: list[float] | None = None,
    moe_dispatch: list[str] | None = None,
    moe_overlap: list[bool] | None = None,
    cp_comm: list[str] | None = None,
    fsdp_reshard: list[bool] | None = None,
    eager: list[bool] | None = None,
    attention_kernel: list[str] | None = None,
    num_experts: int = 0,
    seq_len: int | None = None,
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
      sequence parallelism on/off (off only when tp = 1), the dtypes and the DP overlap;
    - an HSDP ``shard_size`` > 0 needs ZeRO-3 and divides dp·cp; ``recompute_layers`` > 0
      needs full recomputation and at most ceil(L/pp) layers;
    - a switch that cannot matter for a row (TP overlap at tp = 1, the MoE dispatcher and
      overlap at ep = 1, the CP exchange at cp = 1, resharding without ZeRO-3) keeps only one
      value (its default when listed).

    ``None`` for a knob means all its values (``dtype``: bf16; ``dp_overlap``: on;
    ``fused_attention``: off), except the knobs of today's runs, which are not crossed unless
    asked: ``cp``, ``etp`` 1, ``shard_size`` 0, ``recompute_layers`` 0, TP and MoE overlap
    off, ``moe_imbalance`` 1, all-to-all dispatch, p2p CP exchange, resharding on, and
    ``grad_reduce_fp32`` by dtype (:func:`~perfmodel.strategy.default_grad_reduce_fp32`);
    ``ep`` is 1 for a dense model and every divisor of ``num_experts`` up to
    :data:`MAX_DEFAULT_EP` for a MoE model. Schedules, recompute modes and dtypes are labels or codes of
    :class:`~perfmodel.choices.Schedule`, :class:`~perfmodel.choices.Recompute` and
    :class:`~perfmodel.choices.Dtype`.

    Args:
      num_layers: the model's layers.
      num_heads: the model's attention heads (an MLP: its hidden size).
      num_kv_heads: the model's key/value heads (an MLP: its hidden size).
      num_gpus: device counts to sweep (one or several; every pair with a batch is searched).
      global_batch: samples per optimiser step to sweep (one or several).
      gpus_per_node: devices per node (tp stays within one unless ``allow_cross_node_tp``).
      tp: tensor-parallel degrees to try (``None``: all that can work).
      pp: pipeline-parallel degrees to try (``None``: all that can work).
      micro_batch: microbatch sizes to try (``None``: all that can work).
      interleave: model chunks per device to try (``None``: all that can work).
      zero: ZeRO stages to try (``None``: all).
      schedule: schedule labels or codes to try.
      recompute: recompute labels or codes to try.
      dtype: dtype labels or codes to try.
      sequence_parallel: sequence-parallel settings to try.
      dp_overlap: DP-overlap settings to try.
      fused_attention: fused-attention settings to try.
      allow_cross_node_tp: let tensor-parallel groups span nodes.
      supported_dtypes: the dtypes the hardware has (others are pruned), or ``None``.
      cp: context-parallel degrees to try.
      ep: expert-parallel degrees to try.
      etp: expert tensor-parallel degrees to try.
      shard_size: ZeRO-3 shard group sizes to try (0: all dp·cp ranks).
      recompute_layers: recomputed layers per stage to try (0: all).
      tp_overlap: TP-overlap settings to try.
      moe_overlap: MoE dispatch-overlap settings to try.
      fsdp_reshard: reshard-after-forward settings to try.
      grad_reduce_fp32: fp32 gradient-reduction settings to try.
      moe_imbalance: busiest expert rank's routed tokens over the mean (>= 1) to try.
      moe_dispatch: :class:`~perfmodel.choices.MoeDispatch` labels or codes to try.
      cp_comm: :class:`~perfmodel.choices.CpComm` labels or codes to try.
      eager: eager-mode (unfused elementwise) settings to try (default off).
      attention_kernel: :class:`~perfmodel.choices.AttentionKernel` labels or codes to try
        (default cudnn).
      num_experts: the model's routed experts (0: dense).
      seq_len: the model's sequence length in tokens (``None``: an MLP, which has cp = 1).

    Returns:
      A :class:`StrategyGrid`; ``rejected`` counts the pruned (dp, tp, pp) factorisations and
      the pruned values that the caller asked for, by reason.

    Raises:
      AisimError: an unknown schedule, recompute mode or dtype (``field`` = the argument).
    """
    rejected: dict[str, int] = {}
    gpus_l = [int(x) for x in np.atleast_1d(num_gpus)]
    gbs_l = [int(x) for x in np.atleast_1d(global_batch)]
    L = int(num_layers)
    rows = _cross({"num_gpus": np.asarray(gpus_l, np.int64)}, "global_batch", gbs_l)
    rows, tp_user = _cross_tp(
        rows, rejected, gpus_l, tp, num_heads, num_kv_heads, gpus_per_node, allow_cross_node_tp
    )
    rows, cp_user = _cross_cp(rows, rejected, cp, seq_len)
    rows = _cross_pp(rows, rejected, gpus_l, pp, tp_user, L, cp_user)
    rows = _cross_experts(rows, rejected, ep, etp, int(num_experts))
    rows = _cross_micro_batch(rows, rejected, micro_batch)
    rows, sch_user = _cross_schedule(rows, rejected, schedule)
    rows = _cross_interleave(rows, rejected, interleave, sch_user, L)
    rows, r_codes = _cross_memory_knobs(rows, rejected, zero, recompute, sequence_parallel)
    rows = _cross_shard(rows, rejected, shard_size)
    rows = _cross_recompute_layers(rows, rejected, recompute_layers, L)
    rows = _cross_precision(rows, rejected, dtype, supported_dtypes, dp_overlap)
    rows = _cross_fused_attention(rows, rejected, fused_attention, r_codes)
    switches = {
        "tp_overlap": (_opt(tp_overlap, _switch_codes), (0,)),
        "moe_dispatch": (
            _opt(moe_dispatch, lambda v: _codes(MoeDispatch, v, "moe_dispatch")),
            (0,),
        ),
        "moe_overlap": (_opt(moe_overlap, _switch_codes), (0,)),
        "cp_comm": (_opt(cp_comm, lambda v: _codes(CpComm, v, "cp_comm")), (0,)),
        "fsdp_reshard": (_opt(fsdp_reshard, _switch_codes), (1,)),
        "eager": (_opt(eager, _switch_codes), (0,)),
        "attention_kernel": (
            _opt(attention_kernel, lambda v: _codes(AttentionKernel, v, "attention_kernel")),
            (0,),
        ),
        "grad_reduce_fp32": (grad_reduce_fp32, None),
        "moe_imbalance": (moe_imbalance, (1.0,)),
    }
    rows = _cross_modern_switches(rows, rejected, switches)
    rows["gpus_per_node"] = np.full(len(rows["dp"]), gpus_per_node, np.int64)
    lifted_by = {}
    if _cross_node_reason(gpus_per_node) in rejected:
        lifted_by[_cross_node_reason(gpus_per_node)] = "allow_cross_node_tp"
    rows = with_default_knobs(rows)
    return StrategyGrid({k: rows[k].astype(np.float32) for k in KNOBS}, rejected, lifted_by)


def _opt(values, parse):
    """``parse(values)``, or ``None`` when nothing was asked for."""
    return None if values is None else parse(values)
