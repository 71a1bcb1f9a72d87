"""User knobs -> one validated :class:`~perfmodel.strategy.Strategy` (the boundary check).

Contract: :func:`strategy_from_knobs` takes the knobs a person types (a command line, a CSV row,
a notebook cell), checks each against the model and the GPU count, derives what was left out
(``dp``, ``num_microbatches``, the schedule) and builds the pytree. A bad knob raises one
:class:`~simbase.errors.AisimError` with ``source=None`` and ``field`` set to the parameter's own
name (``num_gpus``, ``tp``, ``micro_batch_size``, ...); the caller relabels it (a CLI flag, a
CSV column) and names the source. Nothing here knows who called it.
"""

from __future__ import annotations

from perfmodel.choices import (
    RECOMPUTE_ALIASES,
    AttentionKernel,
    CpComm,
    Dtype,
    MoeDispatch,
    Recompute,
    RecomputeModule,
    Schedule,
    ZeroStage,
)
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


def _derive_dp(num_gpus: int, tp: int, pp: int, dp: int | None, cp: int = 1) -> int:
    """dp = num_gpus / (tp·cp·pp), after checking that tp·cp·pp divides the GPU count
    (Megatron-Core's rank order tp-cp-dp-pp)."""
    model_parallel = tp * cp * pp
    names = "tp·pp" if cp == 1 else "tp·cp·pp"
    if num_gpus % model_parallel:
        if num_gpus % tp:
            field, value = "tp", tp
        elif num_gpus % (tp * cp):
            field, value = "cp", cp
        else:
            field, value = "pp", pp
        degrees = f"{tp}·{pp}" if cp == 1 else f"{tp}·{cp}·{pp}"
        raise bad_value(
            None,
            field,
            value,
            f"{names} dividing the number of GPUs",
            hint=f"{names} = {degrees} = {model_parallel} is not a divisor of "
            f"{{num_gpus}}={num_gpus}",
        )
    if dp is None:
        return num_gpus // model_parallel
    if dp * model_parallel != num_gpus:
        raise bad_value(
            None, "dp", dp, f"the number of GPUs / ({names}) = {num_gpus // model_parallel}"
        )
    return dp


def _check_cp(cp: int, seq_len: int | None) -> None:
    """Load-balanced causal context parallelism cuts the sequence into 2·cp chunks, two per
    rank (Megatron-Core's ``get_batch_on_this_cp_rank``), so 2·cp divides the sequence."""
    if cp > 1 and seq_len is not None and seq_len % (2 * cp):
        raise bad_value(
            None,
            "cp",
            cp,
            f"a degree with 2·cp dividing the sequence length ({seq_len} tokens): each rank "
            "takes two of 2·cp load-balanced chunks",
        )


def _check_experts(ep: int, etp: int, num_experts: int, tp: int, cp: int, dp: int) -> None:
    """Expert parallelism folds into a stage's tp·cp·dp ranks (Megatron-Core's MoE parallel
    folding): ep divides the routed experts and ep·etp divides tp·cp·dp; a dense model has
    ep = etp = 1."""
    if num_experts < 1:
        for field, val in (("ep", ep), ("etp", etp)):
            if val != 1:
                raise bad_value(None, field, val, "1: the model has no experts (num_experts = 0)")
        return
    if num_experts % ep:
        raise bad_value(None, "ep", ep, f"a divisor of the {num_experts} routed experts")
    ranks = tp * cp * dp
    if ranks % (ep * etp):
        field, value = ("ep", ep) if ranks % ep else ("etp", etp)
        raise bad_value(
            None,
            field,
            value,
            f"ep·etp dividing the tp·cp·dp = {tp}·{cp}·{dp} = {ranks} ranks of a stage",
            hint=f"ep·etp = {ep}·{etp} = {ep * etp}",
        )


def _check_shard(shard_size: int, zero: ZeroStage, dp: int, cp: int) -> None:
    """An HSDP shard group (0 = every dp·cp rank) needs ZeRO-3 and divides dp·cp."""
    if shard_size < 0 or int(shard_size) != shard_size:
        raise bad_value(None, "shard_size", shard_size, "0 (all dp·cp ranks) or a positive integer")
    if shard_size == 0:
        return
    if zero != ZeroStage.PARAMETERS:
        raise bad_value(
            None,
            "shard_size",
            shard_size,
            "0 unless the ZeRO stage is 3: only ZeRO-3/FSDP shards parameters within groups",
        )
    if (dp * cp) % shard_size:
        raise bad_value(
            None, "shard_size", shard_size, f"a divisor of dp·cp = {dp}·{cp} = {dp * cp}"
        )


def _check_recompute_layers(
    recompute_layers: int, recompute: Recompute, num_layers: int, pp: int
) -> None:
    """Partial full recomputation (Megatron's ``--recompute-num-layers``) recomputes at most the
    layers of the busiest stage (ceil(L/pp) with uneven stages); 0 means all of them."""
    if recompute_layers < 0 or int(recompute_layers) != recompute_layers:
        raise bad_value(
            None, "recompute_layers", recompute_layers, "0 (every layer) or a positive integer"
        )
    if recompute_layers == 0:
        return
    if recompute != Recompute.FULL:
        raise bad_value(None, "recompute_layers", recompute_layers, "0 unless recompute is full")
    per_stage = -(-num_layers // pp)
    if recompute_layers > per_stage:
        raise bad_value(
            None,
            "recompute_layers",
            recompute_layers,
            f"at most the {per_stage} layers of a stage ({num_layers} layers, pp={pp})",
        )


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
    """The interleaved 1F1B schedule (Narayanan et al. SC21 §2.2.2) needs pp > 1, v >= 2 chunks,
    no more pp·v chunks than the layers plus the embedding and the loss (an uneven split is a
    custom Megatron-Core ``--pipeline-model-parallel-layout``), and a multiple of pp
    microbatches; other schedules have v = 1."""
    if schedule == Schedule.INTERLEAVED:
        if interleave < 2:
            raise bad_value(
                None, "interleave", interleave, "at least 2 chunks for the interleaved schedule"
            )
        # every chunk holds a layer, the embedding or the loss, as the step model's validity
        chunks = pp * interleave
        if pp < 2 or chunks > num_layers + 2:
            raise bad_value(
                None,
                "interleave",
                interleave,
                f"at most {num_layers + 2} chunks in all (pp·interleave, pp={pp}): the "
                f"{num_layers} layers, the embedding and the loss",
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
    cp: int = 1,
    ep: int = 1,
    etp: int = 1,
    shard_size: int = 0,
    recompute_layers: int = 0,
    tp_overlap: bool = False,
    grad_reduce_fp32: bool | None = None,
    moe_imbalance: float = 1.0,
    moe_dispatch: str | int = "alltoall",
    moe_overlap: bool = False,
    cp_comm: str | int = "p2p",
    fsdp_reshard: bool = True,
    param_remainders: bool = False,
    recompute_modules: object = 0,
    logit_bytes: float = 4.0,
    fsdp_step_gather: bool = False,
    eager: bool = False,
    attention_kernel: str | int = "cudnn",
    fsdp_fp32_params: bool = False,
    num_experts: int = 0,
    seq_len: int | None = None,
) -> Strategy:
    """Validates user knobs and builds one :class:`~perfmodel.strategy.Strategy`.

    Args:
      num_layers: the model's layers.
      num_heads: the model's attention heads (an MLP: its hidden size, since its
        tensor-parallel split is over the hidden units).
      num_kv_heads: the model's key/value heads (an MLP: its hidden size).
      num_gpus: devices in all; dp·tp·pp·cp must equal it.
      tp: tensor-parallel degree.
      pp: pipeline-parallel degree.
      dp: data-parallel degree; ``None`` derives ``num_gpus / (tp·cp·pp)``.
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
      sequence_parallel: shard norms and dropouts over tp (see ``Strategy``).
      dp_overlap: overlap the DP gradient reduction with the backward pass.
      fused_attention: a fused attention kernel (FlashAttention).
      dtype: a :class:`~perfmodel.choices.Dtype` label or code.
      gpus_per_node: devices that share the intra-node tier.
      tp_rule: ``"divides"`` (tp divides the heads and KV heads: Megatron's attention split,
        aisim's model) or ``"distir"`` (at most the number of heads, as DistIR's GPT-2
        transform checks it).
      cp: context-parallel degree; 2·cp divides ``seq_len`` (load-balanced causal chunks).
      ep: expert-parallel degree; divides ``num_experts``, 1 for a dense model.
      etp: expert tensor-parallel degree; ep·etp divides tp·cp·dp (Megatron-Core's MoE
        parallel folding).
      shard_size: ZeRO-3 shard group (0: all dp·cp ranks; a divisor of dp·cp for HSDP).
      recompute_layers: layers per stage recomputed under ``recompute="full"`` (0: all; at
        most ceil(num_layers/pp)).
      tp_overlap: overlap tensor-parallel collectives with the GEMMs.
      moe_overlap: overlap the MoE token dispatch and combine with compute.
      fsdp_reshard: free gathered parameters after the forward (FSDP's default).
      param_remainders: the optimizer keeps 16-bit remainders of the bf16 weights instead of
        fp32 master weights (2 bytes per parameter less; bf16 only).
      recompute_modules: submodules selective recomputation also redoes (names of
        :class:`~perfmodel.choices.RecomputeModule`, Megatron-Core's ``--recompute-modules``);
        needs ``recompute="selective"``.
      logit_bytes: bytes per logit the loss holds at its peak (4: a fused fp32 softmax
        cross-entropy; 12: an unfused fp32 one; 16: PyTorch's ``loss_parallel`` under TP,
        uncompiled), more than 0.
      fsdp_step_gather: ZeRO-3 keeps parameters gathered and gradients unreduced across the
        step's microbatches (one all-gather and reduce-scatter per step); needs zero_stage 3.
      eager: the elementwise ops run as PyTorch eager mode's separate kernels
        (:mod:`perfmodel.eager`); off: fused (Megatron-Core, ``torch.compile``).
      attention_kernel: an :class:`~perfmodel.choices.AttentionKernel` label or code
        (``cudnn`` or ``fa2``).
      fsdp_fp32_params: ZeRO-3 keeps the sharded parameters in fp32 as the master weights and
        no sharded 16-bit copy (PyTorch FSDP's mixed precision); needs zero_stage 3 and no
        ``param_remainders``.
      grad_reduce_fp32: fp32 gradient reduction; ``None`` follows the dtype
        (:func:`~perfmodel.strategy.default_grad_reduce_fp32`).
      moe_imbalance: busiest expert rank's routed tokens over the mean, at least 1.
      moe_dispatch: a :class:`~perfmodel.choices.MoeDispatch` label or code.
      cp_comm: a :class:`~perfmodel.choices.CpComm` label or code.
      num_experts: the model's routed experts (0: dense), for the ep checks.
      seq_len: the model's sequence length in tokens, for the cp check (``None``: unchecked).

    Returns:
      A :class:`~perfmodel.strategy.Strategy` with scalar float32 leaves.

    Raises:
      AisimError: with ``source=None``, ``field`` = the parameter's name, the bad value and what
        is expected (a ``hint`` may name other fields as ``{field}`` placeholders).
    """
    _check_positive(
        num_gpus=num_gpus,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        etp=etp,
        micro_batch_size=micro_batch_size,
        interleave=interleave,
    )
    zero = _parse_zero(zero_stage)
    rec = Recompute.parse(recompute, "recompute", aliases=RECOMPUTE_ALIASES)
    if tp_rule not in TP_RULES:
        raise bad_value(None, "tp_rule", tp_rule, "one of " + ", ".join(TP_RULES))
    _check_tp(tp, num_heads, num_kv_heads, tp_rule)
    _check_cp(cp, seq_len)
    dp = _derive_dp(num_gpus, tp, pp, dp, cp)
    if pp > num_layers:
        raise bad_value(None, "pp", pp, f"at most the number of layers ({num_layers})")
    _check_experts(ep, etp, num_experts, tp, cp, dp)
    _check_shard(shard_size, zero, dp, cp)
    _check_recompute_layers(recompute_layers, rec, num_layers, pp)
    if not moe_imbalance >= 1.0:
        raise bad_value(
            None, "moe_imbalance", moe_imbalance, "at least 1.0 (1.0 = perfectly balanced)"
        )
    if param_remainders and Dtype.parse(dtype, "dtype") != Dtype.BF16:
        raise bad_value(
            None,
            "param_remainders",
            param_remainders,
            "off unless dtype is bf16 (remainders complete bf16 weights to fp32)",
        )
    modules = RecomputeModule.parse(recompute_modules, "recompute_modules")
    if modules and rec != Recompute.SELECTIVE:
        raise bad_value(
            None,
            "recompute_modules",
            recompute_modules,
            "none unless recompute is selective (they refine selective recomputation)",
        )
    if not logit_bytes > 0:
        raise bad_value(None, "logit_bytes", logit_bytes, "more than 0 bytes per logit")
    if fsdp_step_gather and zero != ZeroStage.PARAMETERS:
        raise bad_value(
            None, "fsdp_step_gather", fsdp_step_gather, "off unless zero_stage is 3 (FSDP)"
        )
    if fsdp_fp32_params and (zero != ZeroStage.PARAMETERS or param_remainders):
        raise bad_value(
            None,
            "fsdp_fp32_params",
            fsdp_fp32_params,
            "off unless zero_stage is 3 (FSDP) without param_remainders",
        )
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
        recompute=rec,
        sequence_parallel=sequence_parallel,
        dtype=Dtype.parse(dtype, "dtype"),
        dp_overlap=dp_overlap,
        fused_attention=fused_attention,
        gpus_per_node=gpus_per_node,
        cp=cp,
        ep=ep,
        etp=etp,
        shard_size=shard_size,
        recompute_layers=recompute_layers,
        tp_overlap=tp_overlap,
        grad_reduce_fp32=grad_reduce_fp32,
        moe_imbalance=moe_imbalance,
        moe_dispatch=MoeDispatch.parse(moe_dispatch, "moe_dispatch"),
        moe_overlap=moe_overlap,
        cp_comm=CpComm.parse(cp_comm, "cp_comm"),
        fsdp_reshard=fsdp_reshard,
        param_remainders=param_remainders,
        recompute_modules=modules,
        logit_bytes=logit_bytes,
        fsdp_step_gather=fsdp_step_gather,
        eager=eager,
        attention_kernel=AttentionKernel.parse(attention_kernel, "attention_kernel"),
        fsdp_fp32_params=fsdp_fp32_params,
    )
