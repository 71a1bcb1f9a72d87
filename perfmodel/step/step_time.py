"""Step time of one strategy as a sum of small named terms.

``step_time(model, hw, consts, strategy)`` is pure, jittable, differentiable in every leaf and
written for one strategy with scalar leaves. The pipeline follows Narayanan et al. SC21 §2.2:
``m`` microbatches of the slowest stage, plus a bubble of ``(p-1)/v`` stage-microbatch times
(GPipe and 1F1B ``v = 1``; interleaved 1F1B with ``v`` chunks). Tensor-parallel traffic is the
Megatron 2+2 all-reduces of ``b·s·h`` activations per layer (all-gather + reduce-scatter with
sequence parallelism, the same volume); data-parallel traffic is a gradient all-reduce behind the
last microbatch's backward pass; under ZeRO it is what the partitioning forces: a reduce-scatter
per step (ZeRO-1) or per microbatch (ZeRO-2, 3), weight all-gathers per microbatch (ZeRO-3), and
for ZeRO-1/2 an all-gather of the updated weights after the optimizer step that nothing hides;
each pass is a collective per layer or bucket paying NCCL's latency at its rank count. Fixed
per-step costs (the host loop, the gradient norm) are a term of their own. Every term is in
seconds. What is constant over a compiled program is a Python branch (the
stack's overlaps and kernels, the model's experts, the program's scope: no CP or FP8 terms for
strategies without them); :func:`perfmodel.search.evaluate.evaluate_grid` vectorises it.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float

from perfmodel.specs.choices import Recompute, Schedule, ZeroStage
from perfmodel.specs.constants import Constants
from perfmodel.specs.hardware import HardwareSpec
from perfmodel.specs.model import ModelSpec, model_flops_per_step, tokens_per_sample
from perfmodel.specs.strategy import Strategy
from perfmodel.step import communication as terms
from perfmodel.step.breakdown import BREAKDOWN_TERMS as BREAKDOWN_TERMS  # part of this API
from perfmodel.step.breakdown import StepBreakdown
from perfmodel.step.compute import StageCompute, stage_compute
from perfmodel.step.layer_time import layer_ops, timer
from perfmodel.step.memory import (
    expert_data_parallel,
    grad_bytes_per_param,
    memory_per_device,
    shard_group,
    stage_params_split,
)
from perfmodel.step.precision import precision
from perfmodel.step.recipes import stack_recipe
from perfmodel.step.roofline import gemm_tiles
from perfmodel.step.select import behaviour, is_off, where
from perfmodel.step.workload import OpClass

# Adam update traffic per parameter: read gradient, fp32 master, momentum, variance (2+4+4+4)
# and write master, momentum, variance and the 16-bit weight (4+4+4+2) = 28 bytes.
ADAM_BYTES_PER_PARAM = 28.0


def _divides(d, n):
    return jnp.abs(jnp.round(jnp.divide(n, d)) * d - n) < 0.5


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
    lay, bat, mem = s.layout, s.batching, s.memory
    ok = (
        (lay.dp >= 1)
        & (lay.tp >= 1)
        & (lay.pp >= 1)
        & (lay.cp >= 1)
        & (lay.ep >= 1)
        & (lay.etp >= 1)
        & (bat.micro_batch_size >= 1)
        & (bat.num_microbatches >= 1)
        & (lay.moe_imbalance >= 1.0)
    )
    if m.kind == "transformer":
        ok &= _divides(lay.tp, m.num_heads) & _divides(lay.tp, m.num_kv_heads)
        ok &= _divides(2.0 * lay.cp, m.seq_len) | (lay.cp == 1)
        if m.moe:
            ranks = lay.tp * lay.cp * lay.dp
            ok &= _divides(lay.ep, m.num_experts) & _divides(lay.ep * lay.etp, ranks)
        else:
            ok &= (lay.ep == 1) & (lay.etp == 1)
    else:
        ok &= _divides(lay.tp, m.hidden_size) & (lay.cp == 1) & (lay.ep == 1) & (lay.etp == 1)
    ok &= lay.pp <= m.num_layers
    interleaved = bat.schedule == Schedule.INTERLEAVED
    ok &= where(
        interleaved,
        (bat.interleave >= 2)
        & (lay.pp > 1)
        & (lay.pp * bat.interleave <= m.num_layers + 2.0)
        & _divides(lay.pp, bat.num_microbatches),
        bat.interleave == 1,
    )
    ok &= where(
        mem.shard_size > 0,
        (mem.zero_stage == ZeroStage.PARAMETERS) & _divides(mem.shard_size, lay.dp * lay.cp),
        True,
    )
    ok &= hw.peak_flops_per_s[mem.dtype.astype(jnp.int32)] > 0
    return ok


def fits_device(m: ModelSpec, hw: HardwareSpec, s: Strategy) -> Float[Array, ""]:
    """Whether a strategy is valid and fits the device with its runtime reserve (what
    :func:`step_time`'s ``feasible`` says, without timing the step: its memory alone)."""
    mem = memory_per_device(m, s)
    return validity(m, hw, s) & (
        mem.total_bytes + hw.memory_reserve_bytes <= hw.memory_capacity_bytes
    )


def _local_params(m: ModelSpec, s: Strategy):
    """Parameters this rank's optimizer steps: its stage's, or its ZeRO shard of them (dense
    ones over the shard group, experts over their data-parallel ranks)."""
    lay, mem = s.layout, s.memory
    dense, experts = stage_params_split(m, lay)
    part = mem.zero_stage >= ZeroStage.OPTIMIZER
    group = shard_group(lay, mem)
    if m.moe:
        return where(part, dense / group + experts / expert_data_parallel(lay), dense + experts)
    return where(part, dense / group, dense)


def _optimizer(c: Constants, t, local):
    """Adam's update on this rank's ``local`` parameters (:func:`_local_params`),
    memory-bound: :data:`ADAM_BYTES_PER_PARAM` bytes and 10 FLOPs per parameter, scaled by the
    calibrated ``optimizer_time_factor``."""
    opt_bytes = local * ADAM_BYTES_PER_PARAM
    return c.optimizer_time_factor * t(
        OpClass(
            flops=local * 10.0, bytes=opt_bytes, kernels=jnp.ones(()), tensor=False, role="vector"
        )
    )


def step_overhead(hw: HardwareSpec, c: Constants, s: Strategy, local_params):
    """Fixed costs of one optimizer step: the calibrated ``step_overhead_s`` (the training
    loop's host work between steps) plus the gradient-norm clipping every LLM trainer runs
    (Megatron-Core ``clip_grad_norm_fp32``, PyTorch ``clip_grad_norm_``, DeepSpeed
    ``gradient_clipping``): one memory-bound pass over this rank's gradient shard
    (``local_params`` in the reduction dtype, at the asymptotic HBM efficiency), then the
    squared norm all-reduced over every rank (one fp32 scalar: the latency of NCCL's tree,
    ``2·((k-1)·α_intra + ceil(log2 D)·α_inter)`` over ``D`` domains of ``k``).
    """
    nbytes = local_params * grad_bytes_per_param(s)
    norm = nbytes / (hw.memory_bandwidth_bytes_per_s * c.memory_efficiency_max)
    k = jnp.minimum(s.layout.gpus_per_node, s.num_gpus)
    d = s.num_gpus / k
    alpha = c.link_latency_s
    tree = 2.0 * ((k - 1.0) * alpha[0] + jnp.ceil(jnp.log2(d)) * alpha[1])
    return c.step_overhead_s + norm + c.kernel_overhead_s + tree


def _host_slicing(hw: HardwareSpec, s: Strategy):
    """How much longer a device's own work takes when devices time-slice one host.

    Devices time-sliced on one host's cores (XLA's CPU devices, ``hw.devices_share_host``):
    each of the n busy at once gets 1/n of the host, so its own work (kernels, optimizer,
    dispatch) takes n times as long as on the whole host; a collective is one copy on the
    shared memory for all of them, so the alpha-beta terms stay as they are.
    """
    busy = jnp.maximum(jnp.minimum(s.num_gpus, s.layout.gpus_per_node), 1.0)
    return where(hw.devices_share_host > 0, busy, 1.0)


def _comm_per_microbatch(m, hw, c, s: Strategy, prec, stage: StageCompute, full):
    """Tensor-, context- and expert-parallel seconds of one microbatch on the busiest stage,
    less what the stack's overlaps hide (TP behind the GEMMs, the MoE dispatch behind compute)."""
    act_b, stack = prec.act_bytes, s.stack
    tp_mb = terms.tp_comm(
        m, hw, c, s, act_b, stage.dense_layers, stage.moe_layers, full, prec.fp8, prec.fp4
    )
    tp_overlap = behaviour(s, "tp_overlap")
    if not is_off(tp_overlap):
        tp_mb = tp_mb - where(
            tp_overlap, jnp.minimum(c.tp_overlap_fraction * tp_mb, stage.gemm_s), 0.0
        )
    cp_mb = 0.0
    if s.scope.cp and m.kind == "transformer":
        cp_mb = terms.cp_exchange(
            m, hw, c, s, act_b, stage.attn_fwd_s, stage.attn_bwd_s, stage.num_layers, full
        )
    moe_mb = 0.0
    if m.moe:
        moe_mb = terms.moe_comm(m, hw, c, s, act_b, stage.moe_layers, full)
        if stack.moe_overlap:
            moe_mb = moe_mb - jnp.minimum(c.dp_overlap_fraction * moe_mb, stage.stage_mb_s)
    return tp_mb, cp_mb, moe_mb


def step_time(m: ModelSpec, hw: HardwareSpec, c: Constants, s: Strategy) -> StepBreakdown:
    """Time, throughput, utilisation and memory of one training step under one strategy.

    The step is ``m`` microbatches of the slowest stage plus the pipeline bubble of
    ``(p-1)/v`` stage-microbatch times (Narayanan et al. SC21 §2.2), tensor- and
    context-parallel collectives (less what the stack's ``tp_overlap`` hides behind GEMMs), the
    MoE token dispatch (less what ``moe_overlap`` hides), pipeline sends, the exposed
    data-parallel traffic, the optimizer step, a per-microbatch overhead (with delayed FP8
    scaling's amax reductions) and the fixed per-step costs (:func:`step_overhead`): the terms
    of :data:`BREAKDOWN_TERMS`, each a named step below.

    Args:
      m: model dimensions.
      hw: device and link numbers.
      c: efficiencies and overheads (a preset's defaults or a calibrated profile).
      s: the strategy (scalar leaves; see :func:`perfmodel.search.evaluate.evaluate_grid` for
        many).

    Returns:
      A :class:`StepBreakdown` (seconds, FLOPs, bytes); infeasible strategies (bad
      divisibility, out of memory) keep finite numbers and carry ``feasible = False``.
    """
    prec = precision(hw, s)
    t = timer(hw, c, prec, s)
    v, mb = s.batching.chunks, s.batching.num_microbatches
    full = s.memory.recompute == Recompute.FULL
    # GEMM dimensions' tile counts, shared by every op class
    tiles = gemm_tiles(hw, c.wave_quantization_weight)
    ops = layer_ops(m, s, prec.act_bytes, hw, tiles)
    stage = stage_compute(m, s, c, t, prec, ops, hw, tiles)
    tp_mb, cp_mb, moe_mb = _comm_per_microbatch(m, hw, c, s, prec, stage, full)
    zero = jnp.zeros_like(stage.stage_mb_s)
    compute_s = mb * stage.stage_mb_s
    bubble_s = (s.layout.pp - 1.0) / v * (stage.stage_mb_s + tp_mb + cp_mb + moe_mb)
    dpc = terms.dp_comm(
        m, hw, c, s, terms.LayerWindows(stage.fwd_layer_s, stage.bwd_layer_s, stage.num_layers)
    )
    local = _local_params(m, s)
    optimizer_s = _optimizer(c, t, local)
    overhead_s = c.microbatch_overhead_s * mb * v
    if prec.fp8 is not False and stack_recipe(s.stack).amax_per_pass:
        # delayed scaling: the amaxes all-reduced over the amax group (tp·cp·dp ranks) at the
        # end of every chunk's forward and backward (Transformer Engine's fp8_autocast exit)
        amax_s = terms.amax_reduction_s(m, hw, c, s, stage.num_layers)
        overhead_s = overhead_s + where(prec.fp8 & ~prec.fp4, 2.0 * mb * v * amax_s, 0.0)
    step_s = step_overhead(hw, c, s, local)
    slicing = _host_slicing(hw, s)
    compute_s, bubble_s, optimizer_s, overhead_s = (
        slicing * x for x in (compute_s, bubble_s, optimizer_s, overhead_s)
    )
    parts = dict(
        compute_s=compute_s,
        tp_comm_s=mb * tp_mb,
        cp_comm_s=mb * cp_mb + zero,
        ep_comm_s=mb * moe_mb + zero,
        dp_comm_exposed_s=dpc.exposed_s,
        pp_p2p_s=terms.pp_p2p(m, hw, c, s, prec.act_bytes, v),
        bubble_s=bubble_s,
        optimizer_s=optimizer_s,
        overhead_s=overhead_s,
        step_overhead_s=step_s + zero,
    )
    total = sum(parts[k] for k in BREAKDOWN_TERMS)
    return _breakdown(
        m,
        hw,
        s,
        terms=parts,
        total=total,
        dp_total=dpc.total_s,
        hardware_flops=stage.hw_flops_mb * s.layout.tp * s.layout.cp * mb * s.layout.dp,
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
        mfu=where(denom > 0, model_flops / denom, 0.0),
        hfu=where(denom > 0, hardware_flops / denom, 0.0),
        model_tflops_per_gpu=model_flops / (total * gpus) / 1e12,
        hardware_tflops_per_gpu=hardware_flops / (total * gpus) / 1e12,
        cost_per_million_tokens_usd=price * gpus * total / 3600.0 / tokens * 1e6,
        memory=mem,
        memory_per_device_bytes=mem.total_bytes,
        fits_memory=fits,
        valid=valid,
        feasible=fits & valid,
    )
