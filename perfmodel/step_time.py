"""Step time of one strategy as a sum of small named terms; ``evaluate_grid`` vectorises it.

``step_time(model, hw, consts, strategy)`` is pure, jittable, differentiable in every leaf and
written for one strategy with scalar leaves. The pipeline follows Narayanan et al. SC21 §2.2:
``m`` microbatches of the slowest stage, plus a bubble of ``(p-1)/v`` stage-microbatch times
(GPipe and 1F1B ``v = 1``; interleaved 1F1B with ``v`` chunks). Tensor-parallel traffic is the
Megatron 2+2 all-reduces of ``b·s·h`` activations per layer (all-gather + reduce-scatter with
sequence parallelism, the same volume); data-parallel traffic is a gradient all-reduce behind the
last microbatch's backward pass; under ZeRO it is what the partitioning forces: a reduce-scatter
per step (ZeRO-1) or per microbatch (ZeRO-2, 3), weight all-gathers per microbatch (ZeRO-3), and
for ZeRO-1/2 an all-gather of the updated weights after the optimizer step that nothing hides.
Every term is in seconds.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from perfmodel import comm_terms as terms
from perfmodel.breakdown import BREAKDOWN_TERMS as BREAKDOWN_TERMS  # part of this API
from perfmodel.breakdown import StepBreakdown
from perfmodel.choices import AttentionKernel, Dtype, Recompute, Schedule, ZeroStage
from perfmodel.constants import Constants
from perfmodel.eager import eager_elementwise_bytes
from perfmodel.hardware import HardwareSpec
from perfmodel.memory import (
    end_stage_layers,
    expert_data_parallel,
    layers_per_stage,
    memory_per_device,
    shard_group,
    stage_moe_layers,
    stage_params_split,
)
from perfmodel.moe import moe_forward_ops, routed_tokens
from perfmodel.recompute import redone_ops
from perfmodel.roofline import op_time_s
from perfmodel.strategy import ACT_BYTES, Strategy
from perfmodel.torch_ring import torch_ring_ops
from perfmodel.workload import (
    LayerOps,
    ModelSpec,
    OpClass,
    attention_shape,
    layer_forward_ops,
    logits_forward_ops,
    model_flops_per_step,
    moe_layer_count,
    tokens_per_sample,
)

# Adam update traffic per parameter: read gradient, fp32 master, momentum, variance (2+4+4+4)
# and write master, momentum, variance and the 16-bit weight (4+4+4+2) = 28 bytes.
ADAM_BYTES_PER_PARAM = 28.0


def _scaled(op: OpClass, factor) -> OpClass:
    return dataclasses.replace(
        op, flops=op.flops * factor, bytes=op.bytes * factor, kernels=op.kernels * factor
    )


def _divides(d, n):
    return jnp.abs(jnp.round(n / d) * d - n) < 0.5


def validity(m: ModelSpec, hw: HardwareSpec, s: Strategy) -> Float[Array, ""]:
    """Divisibility and support checks of a strategy, as a boolean (never an exception).

    Args:
      m: model dimensions.
      hw: the device (a dtype it has no peak for is unsupported).
      s: one strategy.

    Returns:
      ``True`` when the degrees are positive, tp divides the heads (the hidden units of an
      MLP), pp is at most the layers, the interleaved schedule has a multiple of pp
      microbatches (Narayanan et al. SC21 §2.2.2) and no more ``pp·v`` chunks than the layers
      plus the embedding and the loss (an uneven split is what Megatron-Core runs with
      ``--pipeline-model-parallel-layout``, e.g. DeepSeek-V3's 61 layers on 8 × 2 chunks; the
      busiest stage's ``ceil(L/pp)`` layers set the pace), cp splits the sequence into ``2·cp``
      load-balanced chunks, ep divides the experts and ep·etp the tp·cp·dp ranks of a stage
      (Megatron-Core's folding; a dense model has ep = etp = 1), an HSDP shard group divides
      dp·cp under ZeRO-3 only, and the dtype is supported.
    """
    ok = (
        (s.dp >= 1)
        & (s.tp >= 1)
        & (s.pp >= 1)
        & (s.cp >= 1)
        & (s.ep >= 1)
        & (s.etp >= 1)
        & (s.micro_batch_size >= 1)
        & (s.num_microbatches >= 1)
        & (s.moe_imbalance >= 1.0)
    )
    if m.kind == "transformer":
        ok &= _divides(s.tp, m.num_heads) & _divides(s.tp, m.num_kv_heads)
        ok &= _divides(2.0 * s.cp, m.seq_len) | (s.cp == 1)
        moe = m.num_experts > 0
        ok &= jnp.where(
            moe,
            _divides(s.ep, m.num_experts) & _divides(s.ep * s.etp, s.tp * s.cp * s.dp),
            (s.ep == 1) & (s.etp == 1),
        )
    else:
        ok &= _divides(s.tp, m.hidden_size) & (s.cp == 1) & (s.ep == 1) & (s.etp == 1)
    ok &= s.pp <= m.num_layers
    interleaved = s.schedule == Schedule.INTERLEAVED
    ok &= jnp.where(
        interleaved,
        (s.interleave >= 2)
        & (s.pp > 1)
        & (s.pp * s.interleave <= m.num_layers + 2.0)
        & _divides(s.pp, s.num_microbatches),
        s.interleave == 1,
    )
    ok &= jnp.where(
        s.shard_size > 0,
        (s.zero_stage == ZeroStage.PARAMETERS) & _divides(s.shard_size, s.dp * s.cp),
        True,
    )
    ok &= hw.peak_flops_per_s[s.dtype.astype(jnp.int32)] > 0
    return ok


class _Precision(NamedTuple):
    """What the strategy's dtype sets: bytes per activation element and the peaks."""

    act_bytes: Float[Array, ""]
    nominal_peak: Float[Array, ""]  # the peak MFU is reported against (BF16's for FP8 runs)
    linear_peak: Float[Array, ""]  # the peak weight GEMMs run at (fp32's when none listed)
    half_peak: Float[Array, ""]  # the peak 16-bit GEMMs run at (attention, logits)
    vector_peak: Float[Array, ""]  # fp32: what elementwise ops run at
    fp8: Float[Array, ""]  # FP8 linear layers (Transformer Engine's recipe)


class _Modes(NamedTuple):
    """The strategy's categorical choices as booleans (and the chunks per device)."""

    chunks: Float[Array, ""]  # v: model chunks per device (1 unless interleaved)
    full: Float[Array, ""]  # full recomputation (of every layer, or of recompute_layers)
    selective: Float[Array, ""]  # selective recomputation of the attention core
    fused: Float[Array, ""]  # a fused attention kernel


class _StageCompute(NamedTuple):
    """Compute of the slowest pipeline stage for one microbatch, and its parts."""

    fwd_layer_s: Float[Array, ""]  # the stage's mean layer
    bwd_layer_s: Float[Array, ""]
    stage_mb_s: Float[Array, ""]  # every layer of the stage, logits included, fwd+bwd(+redo)
    num_layers: Float[Array, ""]  # layers on the busiest stage
    dense_layers: Float[Array, ""]  # of which dense
    moe_layers: Float[Array, ""]  # of which MoE
    recomputed: Float[Array, ""]  # layers recomputed under full recomputation
    attn_fwd_s: Float[Array, ""]  # attention core of one layer, forward
    attn_bwd_s: Float[Array, ""]
    gemm_s: Float[Array, ""]  # GEMM time of the stage (what TP overlap can hide behind)
    hw_flops_mb: Float[Array, ""]  # FLOPs one device executes for a microbatch, whole model


def _precision(hw: HardwareSpec, s: Strategy) -> _Precision:
    """Activation bytes (:data:`~perfmodel.strategy.ACT_BYTES`) and peaks of the dtype: FP8
    runs its weight GEMMs at the FP8 peak and everything else at BF16's, and reports MFU
    against BF16's (the convention of Megatron-Core, torchtitan and NVIDIA's tables)."""
    dtype = s.dtype.astype(jnp.int32)
    listed = hw.peak_flops_per_s[dtype]
    fp32_peak = hw.peak_flops_per_s[Dtype.FP32]
    bf16_peak = hw.peak_flops_per_s[Dtype.BF16]
    fp8 = s.dtype == Dtype.FP8
    linear = jnp.where(listed > 0, listed, fp32_peak)
    half = jnp.where(fp8, bf16_peak, linear)
    return _Precision(
        act_bytes=jnp.asarray(ACT_BYTES, jnp.float32)[dtype],
        nominal_peak=jnp.where(fp8 & (listed > 0), bf16_peak, listed),
        linear_peak=linear,
        half_peak=half,
        vector_peak=fp32_peak,
        fp8=jnp.where(fp8, 1.0, 0.0),
    )


def _modes(s: Strategy) -> _Modes:
    """Chunks per device and the recomputation/attention switches of a strategy."""
    full = s.recompute == Recompute.FULL
    fused = s.fused_attention > 0
    return _Modes(
        chunks=jnp.where(s.schedule == Schedule.INTERLEAVED, s.interleave, 1.0),
        full=full,
        # selective recomputation redoes the attention core, which a fused kernel never stores
        selective=(s.recompute == Recompute.SELECTIVE) & ~fused,
        fused=fused,
    )


def _timer(hw: HardwareSpec, c: Constants, prec: _Precision, fused, fa2):
    """``t(op)``: an op class's seconds by its role (:attr:`~perfmodel.workload.OpClass.role`).

    Weight GEMMs run at the linear peak, FP8 ones at ``fp8_matmul_efficiency_ratio`` of the
    16-bit efficiency, saturating at the same time per kernel (the half-size in FLOPs scales
    with the peak); a fused attention kernel at ``attention_efficiency_ratio`` of a GEMM's
    (cuDNN's), and FlashAttention-2 (``fa2``) at the hardware's ``fa2_attention_ratio`` of that;
    the logits GEMM at the 16-bit peak; vector kernels at the fp32 peak.
    """
    bw = hw.memory_bandwidth_bytes_per_s
    peak_ratio = prec.linear_peak / jnp.maximum(prec.half_peak, 1.0)
    lin_c = dataclasses.replace(
        c,
        matmul_efficiency_max=c.matmul_efficiency_max
        * jnp.where(prec.fp8 > 0, c.fp8_matmul_efficiency_ratio, 1.0),
        matmul_half_flops=c.matmul_half_flops * peak_ratio,
    )
    attn_c = dataclasses.replace(
        c,
        matmul_efficiency_max=c.matmul_efficiency_max
        * jnp.where(fused, c.attention_efficiency_ratio, 1.0)
        * jnp.where(fused & fa2, hw.fa2_attention_ratio, 1.0),
    )

    def t(op: OpClass):
        if op.role == "linear":
            return op_time_s(op, lin_c, prec.linear_peak, prec.vector_peak, bw)
        if op.role == "attention":
            return op_time_s(op, attn_c, prec.half_peak, prec.vector_peak, bw)
        return op_time_s(op, c, prec.half_peak, prec.vector_peak, bw)

    return t


def _fp8_casts(m: ModelSpec, s: Strategy, ops, moe_ops, moe_layer: bool) -> tuple[OpClass, OpClass]:
    """Transformer Engine's cast-transpose kernels of one layer (forward, backward): every
    FP8 GEMM's input is cast (and transposed for the weight gradient) from 16 bits, reading 2
    and writing 2 bytes per element, and every output gradient likewise in the backward."""
    h, tp = m.hidden_size, s.tp
    T = s.micro_batch_size * m.seq_len / s.cp
    att = attention_shape(m)
    f, g = m.ffn_hidden_size, 1.0 + m.gated_mlp
    attn_in = T * (h + att.v_dim / tp)
    attn_out_grads = T * ((att.q_dim + att.kv_exchanged) / tp + h)
    if moe_layer:
        r = routed_tokens(m, s.micro_batch_size, tp, s.cp, s.moe_imbalance)
        fe = m.moe_ffn_hidden_size
        mlp_in = r * (h + fe) + T * m.shared_experts * fe / tp
        mlp_out_grads = r * (fe * g + h) + T * m.shared_experts * fe * g / tp
    else:
        mlp_in = T * (h + f / tp)
        mlp_out_grads = T * (f * g / tp + h)
    fwd = 4.0 * (attn_in + mlp_in)
    bwd = 4.0 * (attn_out_grads + mlp_out_grads)
    return (
        OpClass(flops=fwd / 4.0, bytes=fwd, kernels=jnp.asarray(4.0), tensor=False, role="vector"),
        OpClass(flops=bwd / 4.0, bytes=bwd, kernels=jnp.asarray(4.0), tensor=False, role="vector"),
    )


def _with_eager(m: ModelSpec, s: Strategy, ops: LayerOps, act_b) -> LayerOps:
    """The layer's kernels with PyTorch eager mode's unfused elementwise traffic when
    ``s.eager`` (:mod:`perfmodel.eager`; the same FLOPs, more bytes and kernels)."""
    if m.kind != "transformer":
        return ops
    nbytes, kernels = eager_elementwise_bytes(
        m, s.micro_batch_size, s.tp, s.sequence_parallel, act_b, s.cp
    )
    eager = s.eager > 0
    ew = ops.elementwise
    ew = dataclasses.replace(
        ew,
        bytes=jnp.where(eager, nbytes, ew.bytes),
        kernels=jnp.where(eager, kernels, ew.kernels),
    )
    return dataclasses.replace(ops, elementwise=ew)


def _compute_terms(
    m: ModelSpec, s: Strategy, c: Constants, t, prec: _Precision, modes: _Modes
) -> _StageCompute:
    """Compute of the slowest stage for one microbatch: each op class by the roofline, the
    backward pass twice the forward, plus what recomputation redoes (the whole forward of
    ``recompute_layers`` layers, or the attention core: Korthikanti et al. 2022 §5, and the
    forward of the ``recompute_modules``: :mod:`perfmodel.recompute`), a fused
    kernel's backward recomputing Q·Kᵀ (Dao et al. 2022), FP8's cast kernels, and each MoE
    layer's host-bound time (``moe_layer_overhead_s``: a third in the forward, two thirds in
    the backward, the forward's share again when the layer is recomputed). Dense and
    MoE layers are timed apart; the busiest stage holds ``ceil(L/pp)`` layers, or the lighter
    first/last stage with the embedding or the logits when that is slower
    (:func:`perfmodel.memory.end_stage_layers`)."""
    b, tp, act_b = s.micro_batch_size, s.tp, prec.act_bytes
    full, selective, fused = modes.full, modes.selective, modes.fused
    ops = _with_eager(
        m,
        s,
        layer_forward_ops(m, b, tp, s.sequence_parallel, act_b, s.fused_attention, s.cp),
        act_b,
    )
    attn_classes = (ops.qkv, ops.attention, ops.softmax, ops.proj, ops.elementwise)
    # a fused kernel's backward recomputes Q·Kᵀ: half of the attention's forward again
    fa_redo = dataclasses.replace(_scaled(ops.attention, 0.5), kernels=jnp.zeros(()))
    fa_redo_s = jnp.where(fused, t(fa_redo), 0.0)
    # PyTorch's ring attention merges partial outputs and gradients on the compute stream
    ring_f, ring_b = torch_ring_ops(m, s, act_b)
    attn_fwd = sum(t(op) for op in attn_classes) + t(ring_f)
    attn_bwd = sum(t(_scaled(op, 2.0)) for op in attn_classes) + fa_redo_s + t(ring_b)
    core_fwd = t(ops.attention)
    core_bwd = t(_scaled(ops.attention, 2.0)) + fa_redo_s
    moe_ops = moe_forward_ops(m, b, tp, s.cp, s.ep, s.moe_imbalance, act_b)
    moe_classes = (moe_ops.router, moe_ops.experts, moe_ops.shared, moe_ops.elementwise)
    dense_fwd = t(ops.mlp)
    dense_bwd = t(_scaled(ops.mlp, 2.0))
    moe_fwd = sum(t(op) for op in moe_classes)
    moe_bwd = sum(t(_scaled(op, 2.0)) for op in moe_classes)
    fp8 = prec.fp8 > 0
    cast_d = _fp8_casts(m, s, ops, moe_ops, False)
    cast_m = _fp8_casts(m, s, ops, moe_ops, True)
    cast_dense = jnp.where(fp8, t(cast_d[0]) + t(cast_d[1]), 0.0)
    cast_moe = jnp.where(fp8, t(cast_m[0]) + t(cast_m[1]), 0.0)
    attn_core = t(ops.attention) + t(ops.softmax)  # what selective recomputation redoes
    sel_redo = jnp.where(selective, attn_core, 0.0)
    # the forward of what the recompute modules discarded, again in the backward (0 without)
    redone = redone_ops(m, s, ops, act_b)
    redo_attn = sum(t(op) for op in redone.attention)
    redo_dense = redo_attn + sum(t(op) for op in redone.dense)
    redo_moe = redo_attn + sum(t(op) for op in redone.moe)
    dense_f, dense_b = attn_fwd + dense_fwd, attn_bwd + dense_bwd + cast_dense + redo_dense
    host = c.moe_layer_overhead_s * (m.num_experts > 0)
    moe_f = attn_fwd + moe_fwd + host / 3.0
    moe_b = attn_bwd + moe_bwd + cast_moe + 2.0 * host / 3.0 + redo_moe
    n = layers_per_stage(m, s)
    first, last = end_stage_layers(m, s)
    n_moe = stage_moe_layers(m, n) if m.kind == "transformer" else jnp.zeros(())
    n_dense = n - n_moe
    k = jnp.where(
        full, jnp.where(s.recompute_layers > 0, jnp.minimum(s.recompute_layers, n), n), 0.0
    )
    k_dense = jnp.minimum(k, n_dense)
    k_moe = k - k_dense

    def stage(nd, nm, kd, km):
        return (
            nd * (dense_f + dense_b + sel_redo)
            + nm * (moe_f + moe_b + sel_redo)
            + kd * dense_f
            + km * moe_f
        )

    logits_mm, xent = logits_forward_ops(m, b, tp, act_b, s.cp)
    logits_mb = t(_scaled(logits_mm, 3.0)) + t(_scaled(xent, 2.0))
    middle = stage(n_dense, n_moe, k_dense, k_moe)
    # the last stage: its share of the layers (MoE ones when there are any) and the logits
    last_moe = jnp.minimum(last, n_moe)
    kl = jnp.minimum(k, last)
    kl_dense = jnp.minimum(kl, last - last_moe)
    last_stage = stage(last - last_moe, last_moe, kl_dense, kl - kl_dense) + logits_mb
    first_stage = stage(
        jnp.minimum(first, n_dense) + 0.0 * first,
        first - jnp.minimum(first, n_dense),
        jnp.minimum(k, jnp.minimum(first, n_dense)),
        jnp.minimum(k, first) - jnp.minimum(k, jnp.minimum(first, n_dense)),
    )
    stage_mb = jnp.where(
        s.pp > 1, jnp.maximum(jnp.maximum(middle, last_stage), first_stage), middle + logits_mb
    )
    # hardware FLOPs of one microbatch over the whole model on one device
    L_moe = moe_layer_count(m) if m.kind == "transformer" else jnp.zeros(())
    L_dense = m.num_layers - L_moe
    attn_flops = sum(op.flops for op in attn_classes)
    dense_flops = attn_flops + ops.mlp.flops
    moe_flops = attn_flops + sum(op.flops for op in moe_classes)
    redo = jnp.where(selective, ops.attention.flops, 0.0)
    frac = jnp.where(full, k / jnp.maximum(n, 1.0), 0.0)
    redo_gemm = sum(op.flops for op in redone.attention if op.tensor)
    hw_flops = (
        L_dense * ((3.0 + frac) * dense_flops + redo + redo_gemm + redone.dense[0].flops)
        + L_moe * ((3.0 + frac) * moe_flops + redo + redo_gemm)
        + m.num_layers * jnp.where(fused, fa_redo.flops, 0.0)
        + 3.0 * logits_mm.flops
    )
    gemms = n_dense * 3.0 * (t(ops.qkv) + t(ops.proj) + dense_fwd) + n_moe * 3.0 * (
        t(ops.qkv) + t(ops.proj) + t(moe_ops.shared)
    )
    mean_f = (n_dense * dense_f + n_moe * moe_f) / jnp.maximum(n, 1.0)
    mean_b = (n_dense * dense_b + n_moe * moe_b) / jnp.maximum(n, 1.0)
    return _StageCompute(
        fwd_layer_s=mean_f,
        bwd_layer_s=mean_b,
        stage_mb_s=stage_mb,
        num_layers=n,
        dense_layers=n_dense,
        moe_layers=n_moe,
        recomputed=k,
        attn_fwd_s=core_fwd,
        attn_bwd_s=core_bwd,
        gemm_s=gemms,
        hw_flops_mb=hw_flops,
    )


def _optimizer(m: ModelSpec, c: Constants, s: Strategy, t):
    """Adam's update on this rank's parameters (its ZeRO shard: dense ones over the shard
    group, experts over their data-parallel ranks), memory-bound: :data:`ADAM_BYTES_PER_PARAM`
    bytes and 10 FLOPs per parameter, scaled by the calibrated ``optimizer_time_factor``."""
    dense, experts = stage_params_split(m, s)
    part = s.zero_stage >= ZeroStage.OPTIMIZER
    local = jnp.where(
        part, dense / shard_group(s) + experts / expert_data_parallel(s), dense + experts
    )
    opt_bytes = local * ADAM_BYTES_PER_PARAM
    return c.optimizer_time_factor * t(
        OpClass(
            flops=local * 10.0, bytes=opt_bytes, kernels=jnp.ones(()), tensor=False, role="vector"
        )
    )


def _host_slicing(hw: HardwareSpec, s: Strategy):
    """How much longer a device's own work takes when devices time-slice one host.

    Devices time-sliced on one host's cores (XLA's CPU devices, ``hw.devices_share_host``):
    each of the n busy at once gets 1/n of the host, so its own work (kernels, optimizer,
    dispatch) takes n times as long as on the whole host; a collective is one copy on the
    shared memory for all of them, so the alpha-beta terms stay as they are.
    """
    return jnp.where(
        hw.devices_share_host > 0, jnp.maximum(jnp.minimum(s.num_gpus, s.gpus_per_node), 1.0), 1.0
    )


def step_time(m: ModelSpec, hw: HardwareSpec, c: Constants, s: Strategy) -> StepBreakdown:
    """Time, throughput, utilisation and memory of one training step under one strategy.

    The step is ``m`` microbatches of the slowest stage plus the pipeline bubble of
    ``(p-1)/v`` stage-microbatch times (Narayanan et al. SC21 §2.2), tensor- and
    context-parallel collectives (less what ``tp_overlap`` hides behind GEMMs), the MoE token
    dispatch (less what ``moe_overlap`` hides), pipeline sends, the exposed data-parallel
    traffic, the optimizer step and a per-microbatch overhead: the terms of
    :data:`BREAKDOWN_TERMS`, each a named step below.

    Args:
      m: model dimensions.
      hw: device and link numbers.
      c: efficiencies and overheads (a preset's defaults or a calibrated profile).
      s: the strategy (scalar leaves; see :func:`evaluate_grid` for many).

    Returns:
      A :class:`StepBreakdown` (seconds, FLOPs, bytes); infeasible strategies (bad
      divisibility, out of memory) keep finite numbers and carry ``feasible = False``.
    """
    prec = _precision(hw, s)
    modes = _modes(s)
    t = _timer(hw, c, prec, modes.fused, s.attention_kernel == AttentionKernel.FA2)
    v, mb = modes.chunks, s.num_microbatches
    stage = _compute_terms(m, s, c, t, prec, modes)
    n_dense, n_moe = stage.dense_layers, stage.moe_layers
    tp_mb = terms.tp_comm(m, hw, c, s, prec.act_bytes, n_dense, n_moe, modes.full, prec.fp8)
    tp_hidden = jnp.where(
        s.tp_overlap > 0, jnp.minimum(c.tp_overlap_fraction * tp_mb, stage.gemm_s), 0.0
    )
    tp_mb = tp_mb - tp_hidden
    cp_mb = terms.cp_comm(
        m,
        hw,
        c,
        s,
        prec.act_bytes,
        stage.attn_fwd_s,
        stage.attn_bwd_s,
        stage.num_layers,
        modes.full,
    )
    moe_mb = terms.moe_comm(m, hw, c, s, prec.act_bytes, n_moe, modes.full)
    moe_hidden = jnp.where(
        s.moe_overlap > 0,
        jnp.minimum(c.dp_overlap_fraction * moe_mb, stage.stage_mb_s),
        0.0,
    )
    moe_mb = moe_mb - moe_hidden
    compute_s = mb * stage.stage_mb_s
    tp_comm_s = mb * tp_mb
    cp_comm_s = mb * cp_mb
    ep_comm_s = mb * moe_mb
    bubble_s = (s.pp - 1.0) / v * (stage.stage_mb_s + tp_mb + cp_mb + moe_mb)
    pp_p2p_s = terms.pp_p2p(m, hw, c, s, prec.act_bytes, v)
    dpc = terms.dp_comm(
        m, hw, c, s, terms.LayerWindows(stage.fwd_layer_s, stage.bwd_layer_s, stage.num_layers)
    )
    optimizer_s = _optimizer(m, c, s, t)
    overhead_s = c.microbatch_overhead_s * mb * v
    slicing = _host_slicing(hw, s)
    compute_s, bubble_s, optimizer_s, overhead_s = (
        slicing * x for x in (compute_s, bubble_s, optimizer_s, overhead_s)
    )
    total = (
        compute_s
        + tp_comm_s
        + cp_comm_s
        + ep_comm_s
        + dpc.exposed_s
        + pp_p2p_s
        + bubble_s
        + optimizer_s
        + overhead_s
    )
    return _breakdown(
        m,
        hw,
        s,
        terms=dict(
            compute_s=compute_s,
            tp_comm_s=tp_comm_s,
            cp_comm_s=cp_comm_s,
            ep_comm_s=ep_comm_s,
            dp_comm_exposed_s=dpc.exposed_s,
            pp_p2p_s=pp_p2p_s,
            bubble_s=bubble_s,
            optimizer_s=optimizer_s,
            overhead_s=overhead_s,
        ),
        total=total,
        dp_total=dpc.total_s,
        hardware_flops=stage.hw_flops_mb * s.tp * s.cp * s.num_microbatches * s.dp,
        nominal_peak=prec.nominal_peak,
    )


def _breakdown(m, hw, s, *, terms, total, dp_total, hardware_flops, nominal_peak):
    """The :class:`StepBreakdown` of the step's terms: throughput, utilisation (MFU and HFU
    against the dtype's listed peak), cost, memory and feasibility."""
    gbs = s.global_batch
    gpus = s.num_gpus
    tokens = gbs * tokens_per_sample(m)
    model_flops = model_flops_per_step(m, gbs)
    denom = total * gpus * nominal_peak
    mem = memory_per_device(m, s)
    fits = mem.total_bytes + hw.memory_reserve_bytes <= hw.memory_capacity_bytes
    valid = validity(m, hw, s)
    price = hw.price_per_device_hour_usd
    return StepBreakdown(
        **terms,
        step_time_s=total,
        dp_comm_total_s=dp_total,
        throughput_samples_per_s=gbs / total,
        tokens_per_s=tokens / total,
        model_flops=model_flops,
        hardware_flops=hardware_flops,
        mfu=jnp.where(denom > 0, model_flops / denom, 0.0),
        hfu=jnp.where(denom > 0, hardware_flops / denom, 0.0),
        model_tflops_per_gpu=model_flops / (total * gpus) / 1e12,
        hardware_tflops_per_gpu=hardware_flops / (total * gpus) / 1e12,
        cost_per_million_tokens_usd=price * gpus * total / 3600.0 / tokens * 1e6,
        memory=mem,
        memory_per_device_bytes=mem.total_bytes,
        fits_memory=fits,
        valid=valid,
        feasible=fits & valid,
    )


# Grids up to this many rows compile for a fast start on XLA:CPU (see compile_options).
FAST_COMPILE_ROWS = 1 << 18
# LLVM at -O0 and XLA:CPU's classic loop emitters: the step function compiles in about half the
# time (a third, measured) and runs about 5x slower per row; results agree to float32 rounding.
_FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


def compile_options(rows: int, platform: str | None = None) -> dict | None:
    """XLA options for evaluating the step function over ``rows`` strategies, or None (defaults).

    The step function is thousands of scalar operations, so a small grid (an estimate, the GPT-3
    175B grid's 18,000 rows) spends most of its time compiling, not running.
    ``benchmarks/grid_throughput.py`` measures both sides: the fast compilation saves a few
    seconds once and costs a few microseconds per row, so it pays off up to about a million
    rows, and the default optimisation wins above :data:`FAST_COMPILE_ROWS`. Only XLA:CPU is
    tuned this way; accelerators compile with their defaults.

    Args:
      rows: how many strategies the compiled program evaluates per call.
      platform: the JAX platform (default: that of the first device).
    """
    platform = jax.devices()[0].platform if platform is None else platform
    if platform != "cpu" or rows > FAST_COMPILE_ROWS:
        return None
    return dict(_FAST_COMPILE)


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
        :func:`perfmodel.cost_models.select_step_fn`).
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
    n = int(grid.dp.shape[0])
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
            jnp.asarray(n, jnp.int32),
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
