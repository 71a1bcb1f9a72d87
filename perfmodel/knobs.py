"""User knobs -> one validated :class:`~perfmodel.strategy.Strategy` (the boundary check).

Contract: :func:`strategy_from_knobs` takes the knobs a person types (a command line, a CSV row,
a notebook cell), checks each against the model and the GPU count, derives what was left out
(``dp``, ``num_microbatches``, the schedule) and builds the pytree. A bad knob raises one
:class:`~simbase.errors.AisimError` with ``source=None`` and ``field`` set to the parameter's own
name (``num_gpus``, ``tp``, ``micro_batch_size``, ...); the caller relabels it (a CLI flag, a
CSV column) and names the source. Nothing here knows who called it.
"""

from __future__ import annotations

from perfmodel.choices import RECOMPUTE_ALIASES, Dtype, Recompute, Schedule, ZeroStage
from perfmodel.strategy import Strategy, make_strategy
from simbase.errors import AisimError, bad_value

TP_RULES = ("divides", "distir")


def _check_positive(**values: int | None) -> None:
    """Each value is a positive integer, or raise naming its field."""
    for field, val in values.items():
        if val is None or val < 1 or int(val) != val:
            raise bad_value(None, field, val, "a positive integer")


def _check_tp(tp: int, num_heads: int, num_kv_heads: int, tp_rule: str) -> None:
    """tp splits attention: it divides the heads and KV heads (Megatron's split, Shoeybi et al.
    2019 §3), or, under DistIR's rule, is at most the number of heads."""
    if tp_rule == "distir":
        if tp > num_heads:
            raise bad_value(
                None,
                "tp",
                tp,
                f"at most the number of attention heads ({num_heads}; DistIR's rule)",
            )
    elif num_heads % tp or num_kv_heads % tp:
        raise bad_value(
            None,
            "tp",
            tp,
            f"a divisor of the number of attention heads ({num_heads}"
            + (f") and KV heads ({num_kv_heads})" if num_kv_heads != num_heads else ")"),
        )


def _derive_dp(num_gpus: int, tp: int, pp: int, dp: int | None) -> int:
    """dp = num_gpus / (tp·pp), after checking that tp·pp divides the GPU count."""
    if num_gpus % (tp * pp):
        field, value = ("tp", tp) if num_gpus % tp else ("pp", pp)
        raise bad_value(
            None,
            field,
            value,
            "tp·pp dividing the number of GPUs",
            hint=f"tp·pp = {tp}·{pp} = {tp * pp} is not a divisor of {{num_gpus}}={num_gpus}",
        )
    if dp is None:
        return num_gpus // (tp * pp)
    if dp * tp * pp != num_gpus:
        raise bad_value(None, "dp", dp, f"the number of GPUs / (tp·pp) = {num_gpus // (tp * pp)}")
    return dp


def _derive_microbatches(
    dp: int, micro_batch_size: int, global_batch: int | None, num_microbatches: int | None
) -> int:
    """num_microbatches = global_batch / (dp·micro_batch_size) (gradient accumulation steps)."""
    if num_microbatches is None:
        if global_batch is None:
            global_batch = dp * micro_batch_size
        if global_batch % (dp * micro_batch_size):
            raise bad_value(
                None,
                "global_batch",
                global_batch,
                f"a multiple of dp·micro_batch_size = {dp}·{micro_batch_size} = "
                f"{dp * micro_batch_size}",
            )
        return global_batch // (dp * micro_batch_size)
    if global_batch is not None and global_batch != dp * micro_batch_size * num_microbatches:
        raise bad_value(
            None,
            "global_batch",
            global_batch,
            f"dp·micro_batch_size·num_microbatches = {dp * micro_batch_size * num_microbatches}",
        )
    return num_microbatches


def _check_schedule(
    schedule: Schedule, interleave: int, pp: int, num_layers: int, num_microbatches: int
) -> None:
    """The interleaved 1F1B schedule (Narayanan et al. SC21 §2.2.2) needs pp > 1, v >= 2 chunks
    with pp·v dividing the layers and a multiple of pp microbatches; other schedules have v = 1."""
    if schedule == Schedule.INTERLEAVED:
        if interleave < 2:
            raise bad_value(
                None, "interleave", interleave, "at least 2 chunks for the interleaved schedule"
            )
        if pp < 2 or num_layers % (pp * interleave):
            raise bad_value(
                None,
                "interleave",
                interleave,
                f"a number of chunks with pp·interleave dividing the {num_layers} layers (pp={pp})",
            )
        if num_microbatches % pp:
            raise bad_value(
                None,
                "num_microbatches",
                num_microbatches,
                f"a multiple of pp={pp} for the interleaved schedule",
            )
    elif interleave != 1:
        raise bad_value(None, "interleave", interleave, "1 unless the schedule is interleaved")


def _parse_zero(zero_stage: object) -> ZeroStage:
    try:
        return ZeroStage.parse(zero_stage, "zero_stage")
    except AisimError:
        raise bad_value(None, "zero_stage", zero_stage, "a ZeRO stage 0, 1, 2 or 3") from None


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
    schedule: str | int | None = None,
    interleave: int = 1,
    zero_stage: int = 0,
    recompute: str | int = "none",
    sequence_parallel: bool = False,
    dtype: str | int = "bf16",
    dp_overlap: bool = True,
    fused_attention: bool = False,
    gpus_per_node: int = 8,
    tp_rule: str = "divides",
) -> Strategy:
    """Validates user knobs and builds one :class:`~perfmodel.strategy.Strategy`.

    Args:
      num_layers, num_heads, num_kv_heads: the model's shape (pass the hidden size as both head
        counts for an MLP, whose tensor-parallel split is over the hidden units).
      num_gpus: devices in all; dp·tp·pp must equal it.
      tp, pp: tensor- and pipeline-parallel degrees.
      dp: data-parallel degree; ``None`` derives ``num_gpus / (tp·pp)``.
      global_batch: samples per optimiser step; ``None`` means ``dp·micro_batch_size`` (one
        microbatch), or ``dp·micro_batch_size·num_microbatches`` when that is given.
      micro_batch_size: samples per microbatch per replica.
      num_microbatches: microbatches per step; ``None`` derives it from ``global_batch``.
      schedule: a :class:`~perfmodel.choices.Schedule` label or code; ``None`` means
        interleaved when ``interleave > 1``, else 1F1B (Narayanan et al. SC21 §2.2).
      interleave: model chunks per device (v).
      zero_stage: 0-3 (Rajbhandari et al. 2020).
      recompute: a :class:`~perfmodel.choices.Recompute` label (``yes``/``no`` mean full/none)
        or code (Korthikanti et al. 2022).
      sequence_parallel, dp_overlap, fused_attention: on/off switches (see ``Strategy``).
      dtype: a :class:`~perfmodel.choices.Dtype` label or code.
      gpus_per_node: devices that share the intra-node tier.
      tp_rule: ``"divides"`` (tp divides the heads and KV heads: Megatron's attention split,
        aisim's model) or ``"distir"`` (at most the number of heads, as DistIR's GPT-2
        transform checks it).

    Returns:
      A :class:`~perfmodel.strategy.Strategy` with scalar float32 leaves.

    Raises:
      AisimError: with ``source=None``, ``field`` = the parameter's name, the bad value and what
        is expected (a ``hint`` may name other fields as ``{field}`` placeholders).
    """
    _check_positive(
        num_gpus=num_gpus, tp=tp, pp=pp, micro_batch_size=micro_batch_size, interleave=interleave
    )
    zero = _parse_zero(zero_stage)
    if tp_rule not in TP_RULES:
        raise bad_value(None, "tp_rule", tp_rule, "one of " + ", ".join(TP_RULES))
    _check_tp(tp, num_heads, num_kv_heads, tp_rule)
    dp = _derive_dp(num_gpus, tp, pp, dp)
    if pp > num_layers:
        raise bad_value(None, "pp", pp, f"at most the number of layers ({num_layers})")
    num_microbatches = _derive_microbatches(dp, micro_batch_size, global_batch, num_microbatches)
    if schedule is None:
        schedule = Schedule.INTERLEAVED if interleave > 1 else Schedule.ONE_F_ONE_B
    sched = Schedule.parse(schedule, "schedule")
    _check_schedule(sched, interleave, pp, num_layers, num_microbatches)
    return make_strategy(
        dp=dp,
        tp=tp,
        pp=pp,
        micro_batch_size=micro_batch_size,
        num_microbatches=num_microbatches,
        interleave=interleave,
        schedule=sched,
        zero_stage=zero,
        recompute=Recompute.parse(recompute, "recompute", aliases=RECOMPUTE_ALIASES),
        sequence_parallel=sequence_parallel,
        dtype=Dtype.parse(dtype, "dtype"),
        dp_overlap=dp_overlap,
        fused_attention=fused_attention,
        gpus_per_node=gpus_per_node,
    )
