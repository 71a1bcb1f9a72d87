"""One parallel strategy as a pytree of scalar leaves (:class:`Strategy`), and its builders.

Knobs that a grid sweeps are array leaves (the :mod:`perfmodel.choices` codes for schedule, ZeRO
stage, recompute and dtype), so a batch of strategies is the same dataclass with a leading axis
(a struct of arrays): that is what :func:`perfmodel.step_time.evaluate_grid` vmaps over. User
knobs are validated in :mod:`perfmodel.knobs`; grids are enumerated in :mod:`perfmodel.grid`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from perfmodel.choices import (
    RECOMPUTE_ALIASES,
    AttentionKernel,
    CpComm,
    Dtype,
    MoeDispatch,
    Recompute,
    RecomputeModule,
    Schedule,
)

SCHEDULES = Schedule.labels()
RECOMPUTE = Recompute.labels()
DTYPES = Dtype.labels()
# bytes per element of activations and of communicated tensors, indexed by Dtype code; fp8
# training keeps activations and gradients in 16-bit (Micikevicius et al. 2022, FP8 formats).
_ACT_BYTES = {Dtype.FP32: 4.0, Dtype.TF32: 4.0, Dtype.BF16: 2.0, Dtype.FP16: 2.0, Dtype.FP8: 2.0}
ACT_BYTES = tuple(_ACT_BYTES[d] for d in Dtype)
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
    "cp",
    "ep",
    "etp",
    "shard_size",
    "recompute_layers",
    "tp_overlap",
    "grad_reduce_fp32",
    "moe_imbalance",
    "moe_dispatch",
    "moe_overlap",
    "cp_comm",
    "fsdp_reshard",
    "param_remainders",
    "recompute_modules",
    "logit_bytes",
    "fsdp_step_gather",
    "eager",
    "attention_kernel",
    "fsdp_fp32_params",
)
# what a knob left out means: the dense, 2022-style strategy (tables built before a knob existed
# stay valid); ``grad_reduce_fp32`` has no single default (see :func:`default_grad_reduce_fp32`)
KNOB_DEFAULTS = {
    "cp": 1.0,
    "ep": 1.0,
    "etp": 1.0,
    "shard_size": 0.0,
    "recompute_layers": 0.0,
    "tp_overlap": 0.0,
    "moe_imbalance": 1.0,
    "moe_dispatch": 0.0,
    "moe_overlap": 0.0,
    "cp_comm": 0.0,
    "fsdp_reshard": 1.0,
    "param_remainders": 0.0,
    "recompute_modules": 0.0,
    "logit_bytes": 4.0,
    "fsdp_step_gather": 0.0,
    "eager": 0.0,
    "attention_kernel": 0.0,
    "fsdp_fp32_params": 0.0,
}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Strategy:
    """Parallel degrees and choices of one strategy (scalar leaves; a grid adds an axis).

    Attributes:
      dp: data-parallel degree.
      tp: tensor-parallel degree.
      pp: pipeline-parallel degree (dp·tp·pp·cp devices).
      micro_batch_size: samples per microbatch per data-parallel replica.
      num_microbatches: microbatches per replica per optimiser step (gradient accumulation).
      interleave: model chunks per device (v); 1 unless ``schedule`` is interleaved.
      schedule: a :class:`~perfmodel.choices.Schedule` code.
      zero_stage: a :class:`~perfmodel.choices.ZeroStage` code, 0-3 (Rajbhandari et al. 2020).
      recompute: a :class:`~perfmodel.choices.Recompute` code.
      sequence_parallel: 1 to shard norms/dropouts over tp (Korthikanti et al. 2022).
      dtype: a :class:`~perfmodel.choices.Dtype` code (compute precision).
      dp_overlap: 1 to overlap the DP gradient reduction with the backward pass.
      fused_attention: 1 for a fused attention kernel (FlashAttention, Dao et al. 2022): the
        s × s scores stay on chip, so they are neither stored nor written to memory, and the
        backward pass recomputes them.
      gpus_per_node: devices that share the fast (scale-up) tier: a node, or an NVLink domain
        larger than a node (GB200 NVL72).
      cp: context-parallel degree: the sequence split over cp ranks (load-balanced causal
        chunks), ranks ordered tp-cp-dp-pp as in Megatron-Core.
      ep: expert-parallel degree: routed experts split over ep ranks, folded into the tp·cp·dp
        ranks of a stage (Megatron-Core's MoE parallel folding).
      etp: expert tensor-parallel degree: each expert's GEMMs split over etp ranks.
      shard_size: ZeRO-3/FSDP shard group size; 0 shards over all dp·cp ranks, a divisor of
        dp·cp shards within groups and replicates across them (HSDP).
      recompute_layers: with full recomputation, the layers of a stage recomputed (0 = all).
      tp_overlap: 1 to overlap tensor-parallel collectives with the GEMMs (userbuffers).
      grad_reduce_fp32: 1 to accumulate and reduce gradients in fp32 (Megatron-Core's default
        with bf16), 0 to keep them in the 16-bit dtype.
      moe_imbalance: routed tokens on the busiest expert rank over the mean (1 = balanced).
      moe_dispatch: a :class:`~perfmodel.choices.MoeDispatch` code (all-to-all or all-gather).
      moe_overlap: 1 when the token dispatch and combine overlap compute.
      cp_comm: a :class:`~perfmodel.choices.CpComm` code (p2p ring or all-gather of K/V).
      fsdp_reshard: 1 to free gathered parameters after the forward (FSDP's default), so the
        backward gathers them again.
      param_remainders: 1 when the optimizer keeps each bf16 weight's fp32 master copy as the
        16 low-order bits it lacks (Apex/Transformer Engine ``store_param_remainders``: bf16
        weight + 16-bit remainder = the fp32 value), 2 bytes per parameter instead of 4; only
        bf16 training can (the default of NeMo's Apex distributed Adam for bf16 weights).
      recompute_modules: a sum of :class:`~perfmodel.choices.RecomputeModule` flags, the
        submodules selective recomputation also discards and redoes (Megatron-Core's
        ``--recompute-modules``); 0 = the attention core only.
      logit_bytes: bytes per logit the loss holds at its peak on the last stage: 4 for a fused
        fp32 softmax cross-entropy (Korthikanti et al. 2022 §4.3, Megatron), 12 for an unfused
        fp32 one (the log-softmax output kept for the backward, the loss gradient and the
        log-softmax's input gradient: torchtitan's ``cross_entropy(pred.float(), labels)``),
        16 for that loss under PyTorch's ``loss_parallel`` (TP, uncompiled), whose backward
        also holds the sum ``grad_input + exp(x)`` beside the product.
      fsdp_step_gather: 1 when ZeRO-3/FSDP keeps the parameters gathered and the gradients
        unreduced across the microbatches of a step (PyTorch pipelining's no-sync for FSDP2
        stages: one all-gather and one reduce-scatter per step, the stage's unsharded weights
        and gradients held throughout).
      eager: 1 when the norms, rotary embedding, activation and residual adds run as PyTorch
        eager mode's separate kernels with fp32 upcasts (:mod:`perfmodel.eager`), 0 when they
        are fused (Megatron-Core's fused kernels, or ``torch.compile``).
      attention_kernel: an :class:`~perfmodel.choices.AttentionKernel` code: cuDNN's fused
        attention (the constants' reference) or FlashAttention-2 (at the hardware's
        ``fa2_attention_ratio`` of its speed).
      fsdp_fp32_params: 1 when ZeRO-3 keeps the sharded parameters in fp32 as the optimizer's
        master weights and casts them to the compute dtype at each all-gather (PyTorch FSDP's
        mixed precision: "the optimizer step uses the sharded parameter in the original
        dtype"), so no sharded 16-bit copy is kept and the sharded gradients are fp32;
        0 for a sharded 16-bit copy beside an fp32 master in the optimizer (DeepSpeed ZeRO-3,
        Megatron-FSDP).
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
    cp: Float[Array, "*n"]
    ep: Float[Array, "*n"]
    etp: Float[Array, "*n"]
    shard_size: Float[Array, "*n"]
    recompute_layers: Float[Array, "*n"]
    tp_overlap: Float[Array, "*n"]
    grad_reduce_fp32: Float[Array, "*n"]
    moe_imbalance: Float[Array, "*n"]
    moe_dispatch: Float[Array, "*n"]
    moe_overlap: Float[Array, "*n"]
    cp_comm: Float[Array, "*n"]
    fsdp_reshard: Float[Array, "*n"]
    param_remainders: Float[Array, "*n"]
    recompute_modules: Float[Array, "*n"]
    logit_bytes: Float[Array, "*n"]
    fsdp_step_gather: Float[Array, "*n"]
    eager: Float[Array, "*n"]
    attention_kernel: Float[Array, "*n"]
    fsdp_fp32_params: Float[Array, "*n"]

    @property
    def global_batch(self):
        """Samples per optimiser step: dp · micro_batch_size · num_microbatches."""
        return self.dp * self.micro_batch_size * self.num_microbatches

    @property
    def num_gpus(self):
        """Devices used: dp · tp · pp · cp."""
        return self.dp * self.tp * self.pp * self.cp


def default_grad_reduce_fp32(dtype: str | int) -> bool:
    """Megatron-Core's rule: bf16 (and fp8, whose master weights are bf16) training accumulates
    and reduces gradients in fp32 (``accumulate_allreduce_grads_in_fp32``); fp16 and fp32
    training keep the gradient in the compute dtype."""
    return Dtype.parse(dtype, "dtype") in (Dtype.BF16, Dtype.FP8)


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
) -> Strategy:
    """Builds one :class:`Strategy` from Python values, without validation (see
    :func:`perfmodel.knobs.strategy_from_knobs` for user input).

    Args:
      dp: data-parallel degree.
      tp: tensor-parallel degree.
      pp: pipeline-parallel degree.
      micro_batch_size: samples per microbatch per replica.
      num_microbatches: microbatches per replica per step.
      interleave: model chunks per device.
      schedule: a :class:`~perfmodel.choices.Schedule` label or code (``"1f1b"``).
      zero_stage: ZeRO stage 0-3.
      recompute: a :class:`~perfmodel.choices.Recompute` label or code (``yes``/``no`` mean
        full/none).
      sequence_parallel: shard norms and dropouts over tp.
      dtype: a :class:`~perfmodel.choices.Dtype` label or code (``"bf16"``).
      dp_overlap: overlap the DP gradient reduction with the backward pass.
      fused_attention: a fused attention kernel.
      gpus_per_node: devices on the scale-up tier.
      cp: context-parallel degree.
      ep: expert-parallel degree.
      etp: expert tensor-parallel degree.
      shard_size: ZeRO-3 shard group (0: all dp·cp ranks).
      recompute_layers: layers per stage recomputed under full recomputation (0: all).
      tp_overlap: overlap TP collectives with GEMMs.
      grad_reduce_fp32: fp32 gradient accumulation and reduction; ``None`` applies
        :func:`default_grad_reduce_fp32`.
      moe_imbalance: busiest expert rank's routed tokens over the mean.
      moe_dispatch: a :class:`~perfmodel.choices.MoeDispatch` label or code.
      moe_overlap: overlap token dispatch with compute.
      cp_comm: a :class:`~perfmodel.choices.CpComm` label or code.
      fsdp_reshard: free gathered parameters after the forward.
      param_remainders: keep 16-bit remainders of the bf16 weights as the fp32 master copy.
      recompute_modules: :class:`~perfmodel.choices.RecomputeModule` names (a list or a
        comma-separated string) or their code.
      logit_bytes: bytes per logit held at the loss's peak (4: fused fp32 softmax).
      fsdp_step_gather: FSDP gathers and reduce-scatters once per step, not per microbatch.
      eager: PyTorch eager mode's unfused elementwise kernels (no ``torch.compile``).
      attention_kernel: an :class:`~perfmodel.choices.AttentionKernel` label or code.
      fsdp_fp32_params: ZeRO-3's sharded parameters are the fp32 master weights (PyTorch FSDP).

    Returns:
      A :class:`Strategy` with scalar float32 leaves.

    Raises:
      AisimError: an unknown schedule, recompute mode, dtype or communication choice (``field``
        names it).
    """
    if grad_reduce_fp32 is None:
        grad_reduce_fp32 = default_grad_reduce_fp32(dtype)
    vals = dict(
        dp=dp,
        tp=tp,
        pp=pp,
        micro_batch_size=micro_batch_size,
        num_microbatches=num_microbatches,
        interleave=interleave,
        schedule=Schedule.parse(schedule, "schedule"),
        zero_stage=zero_stage,
        recompute=Recompute.parse(recompute, "recompute", aliases=RECOMPUTE_ALIASES),
        sequence_parallel=float(bool(sequence_parallel)),
        dtype=Dtype.parse(dtype, "dtype"),
        dp_overlap=float(bool(dp_overlap)),
        fused_attention=float(bool(fused_attention)),
        gpus_per_node=gpus_per_node,
        cp=cp,
        ep=ep,
        etp=etp,
        shard_size=shard_size,
        recompute_layers=recompute_layers,
        tp_overlap=float(bool(tp_overlap)),
        grad_reduce_fp32=float(bool(grad_reduce_fp32)),
        moe_imbalance=moe_imbalance,
        moe_dispatch=MoeDispatch.parse(moe_dispatch, "moe_dispatch"),
        moe_overlap=float(bool(moe_overlap)),
        cp_comm=CpComm.parse(cp_comm, "cp_comm"),
        fsdp_reshard=float(bool(fsdp_reshard)),
        param_remainders=float(bool(param_remainders)),
        recompute_modules=RecomputeModule.parse(recompute_modules, "recompute_modules"),
        logit_bytes=logit_bytes,
        fsdp_step_gather=float(bool(fsdp_step_gather)),
        eager=float(bool(eager)),
        attention_kernel=AttentionKernel.parse(attention_kernel, "attention_kernel"),
        fsdp_fp32_params=float(bool(fsdp_fp32_params)),
    )
    return Strategy(**{k: jnp.asarray(float(v), jnp.float32) for k, v in vals.items()})


def with_default_knobs(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The columns plus every knob they lack, at its default (:data:`KNOB_DEFAULTS`;
    ``grad_reduce_fp32`` from each row's dtype, :func:`default_grad_reduce_fp32`)."""
    out = dict(columns)
    n = len(next(iter(columns.values())))
    for k, v in KNOB_DEFAULTS.items():
        if k not in out:
            out[k] = np.full(n, v, np.float32)
    if "grad_reduce_fp32" not in out:
        dt = np.asarray(out["dtype"], np.float32)
        out["grad_reduce_fp32"] = ((dt == Dtype.BF16) | (dt == Dtype.FP8)).astype(np.float32)
    return out


def stack_strategies(columns: dict[str, np.ndarray]) -> Strategy:
    """A struct-of-arrays :class:`Strategy` from equal-length numpy columns (one per knob; a
    knob left out takes its default, :func:`with_default_knobs`)."""
    n = len(next(iter(columns.values())))
    columns = with_default_knobs(columns)
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
        "schedule": Schedule(int(v["schedule"])).label,
        "zero_stage": int(v["zero_stage"]),
        "recompute": Recompute(int(v["recompute"])).label,
        "sequence_parallel": bool(v["sequence_parallel"]),
        "dtype": Dtype(int(v["dtype"])).label,
        "dp_overlap": bool(v["dp_overlap"]),
        "fused_attention": bool(v["fused_attention"]),
        "cp": int(v["cp"]),
        "ep": int(v["ep"]),
        "etp": int(v["etp"]),
        "shard_size": int(v["shard_size"]),
        "recompute_layers": int(v["recompute_layers"]),
        "tp_overlap": bool(v["tp_overlap"]),
        "grad_reduce_fp32": bool(v["grad_reduce_fp32"]),
        "moe_imbalance": v["moe_imbalance"],
        "moe_dispatch": MoeDispatch(int(v["moe_dispatch"])).label,
        "moe_overlap": bool(v["moe_overlap"]),
        "cp_comm": CpComm(int(v["cp_comm"])).label,
        "fsdp_reshard": bool(v["fsdp_reshard"]),
        "param_remainders": bool(v["param_remainders"]),
        "recompute_modules": RecomputeModule.label_of(v["recompute_modules"]),
        "logit_bytes": v["logit_bytes"],
        "fsdp_step_gather": bool(v["fsdp_step_gather"]),
        "eager": bool(v["eager"]),
        "attention_kernel": AttentionKernel(int(v["attention_kernel"])).label,
        "fsdp_fp32_params": bool(v["fsdp_fp32_params"]),
    }
