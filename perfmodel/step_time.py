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
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from perfmodel import collectives as coll
from perfmodel.breakdown import BREAKDOWN_TERMS as BREAKDOWN_TERMS  # part of this API
from perfmodel.breakdown import StepBreakdown
from perfmodel.choices import Dtype, Recompute, Schedule, ZeroStage
from perfmodel.constants import Constants
from perfmodel.hardware import HardwareSpec
from perfmodel.memory import (
    layers_per_stage,
    memory_per_device,
    model_state_bytes_per_param,
    stage_params,
)
from perfmodel.roofline import op_time_s
from perfmodel.strategy import ACT_BYTES, Strategy
from perfmodel.workload import (
    ModelSpec,
    OpClass,
    layer_forward_ops,
    logits_forward_ops,
    model_flops_per_step,
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
      MLP), pp is at most the layers, the interleaved schedule's chunks, layers and microbatches
      divide as Narayanan et al. SC21 §2.2.2 needs, and the dtype is supported.
    """
    ok = (
        (s.dp >= 1)
        & (s.tp >= 1)
        & (s.pp >= 1)
        & (s.micro_batch_size >= 1)
        & (s.num_microbatches >= 1)
    )
    if m.kind == "transformer":
        ok &= _divides(s.tp, m.num_heads) & _divides(s.tp, m.num_kv_heads)
    else:
        ok &= _divides(s.tp, m.hidden_size)
    ok &= s.pp <= m.num_layers
    interleaved = s.schedule == Schedule.INTERLEAVED
    ok &= jnp.where(
        interleaved,
        (s.interleave >= 2)
        & (s.pp > 1)
        & _divides(s.pp * s.interleave, m.num_layers)
        & _divides(s.pp, s.num_microbatches),
        s.interleave == 1,
    )
    ok &= hw.peak_flops_per_s[s.dtype.astype(jnp.int32)] > 0
    return ok


class _Precision(NamedTuple):
    """What the strategy's dtype sets: bytes per activation element and the peaks."""

    act_bytes: Float[Array, ""]
    nominal_peak: Float[Array, ""]  # the dtype's tensor peak as listed (0 = unsupported)
    tensor_peak: Float[Array, ""]  # the peak GEMMs run at (fp32's when the dtype has none)
    vector_peak: Float[Array, ""]  # fp32: what elementwise ops run at


class _Modes(NamedTuple):
    """The strategy's categorical choices as booleans (and the chunks per device)."""

    chunks: Float[Array, ""]  # v: model chunks per device (1 unless interleaved)
    full: Float[Array, ""]  # full recomputation
    selective: Float[Array, ""]  # selective recomputation of the attention core
    fused: Float[Array, ""]  # a fused attention kernel


class _StageCompute(NamedTuple):
    """Compute of the slowest pipeline stage for one microbatch, and its parts."""

    fwd_layer_s: Float[Array, ""]
    bwd_layer_s: Float[Array, ""]
    stage_mb_s: Float[Array, ""]  # every layer of the stage, logits included, fwd+bwd(+redo)
    num_layers: Float[Array, ""]  # layers on the stage, ceil(L / pp)
    fwd_flops: Float[Array, ""]  # forward FLOPs of one layer on one device
    redo_flops: Float[Array, ""]  # forward FLOPs redone per layer by recomputation
    fused_redo_flops: Float[Array, ""]  # Q·Kᵀ FLOPs a fused kernel's backward redoes per layer
    logits_flops: Float[Array, ""]  # forward FLOPs of the output layer on one device


class _DataParallel(NamedTuple):
    total_s: Float[Array, ""]  # every DP collective of the step
    exposed_s: Float[Array, ""]  # what the backward pass does not hide


def _precision(hw: HardwareSpec, s: Strategy) -> _Precision:
    """Activation bytes (:data:`~perfmodel.strategy.ACT_BYTES`) and peaks of the dtype."""
    dtype = s.dtype.astype(jnp.int32)
    nominal_peak = hw.peak_flops_per_s[dtype]
    fp32_peak = hw.peak_flops_per_s[Dtype.FP32]
    return _Precision(
        act_bytes=jnp.asarray(ACT_BYTES, jnp.float32)[dtype],
        nominal_peak=nominal_peak,
        tensor_peak=jnp.where(nominal_peak > 0, nominal_peak, fp32_peak),
        vector_peak=fp32_peak,
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


def _compute_terms(m: ModelSpec, s: Strategy, t, act_b, modes: _Modes) -> _StageCompute:
    """Compute of the slowest stage for one microbatch: each op class by the roofline, the
    backward pass twice the forward, plus what recomputation redoes (the whole forward, or the
    attention core: Korthikanti et al. 2022 §5) and a fused kernel's backward recomputing Q·Kᵀ
    (Dao et al. 2022)."""
    b, tp = s.micro_batch_size, s.tp
    full, selective, fused = modes.full, modes.selective, modes.fused
    ops = layer_forward_ops(m, b, tp, s.sequence_parallel, act_b, s.fused_attention)
    classes = (ops.qkv, ops.attention, ops.softmax, ops.proj, ops.mlp, ops.elementwise)
    fwd_layer = sum(t(op) for op in classes)
    # a fused kernel's backward recomputes Q·Kᵀ: half of the attention's forward again
    fa_redo = dataclasses.replace(_scaled(ops.attention, 0.5), kernels=jnp.zeros(()))
    bwd_layer = sum(t(_scaled(op, 2.0)) for op in classes) + jnp.where(fused, t(fa_redo), 0.0)
    attn_core = t(ops.attention) + t(ops.softmax)  # what selective recomputation redoes
    layer_mb = (
        fwd_layer + bwd_layer + jnp.where(full, fwd_layer, jnp.where(selective, attn_core, 0.0))
    )
    logits_mm, xent = logits_forward_ops(m, b, tp, act_b)
    logits_mb = t(_scaled(logits_mm, 3.0)) + t(_scaled(xent, 2.0))
    n_layers = layers_per_stage(m, s)
    fwd_flops = sum(op.flops for op in classes)
    redo_flops = jnp.where(full, fwd_flops, jnp.where(selective, ops.attention.flops, 0.0))
    return _StageCompute(
        fwd_layer_s=fwd_layer,
        bwd_layer_s=bwd_layer,
        stage_mb_s=n_layers * layer_mb + logits_mb,
        num_layers=n_layers,
        fwd_flops=fwd_flops,
        redo_flops=redo_flops,
        fused_redo_flops=jnp.where(fused, fa_redo.flops, 0.0),
        logits_flops=logits_mm.flops,
    )


def _links(hw: HardwareSpec, c: Constants, group, stride, gpn):
    """(alpha, beta) of the tier a group of ``group`` ranks ``stride`` apart spans."""
    return coll.link_params(
        coll.tier_of_group(group, stride, gpn),
        hw.link_bandwidth_bytes_per_s,
        c.link_latency_s,
        c.link_bandwidth_efficiency,
    )


def _tp_comm(m: ModelSpec, hw: HardwareSpec, c: Constants, s: Strategy, act_b, n_layers, full):
    """Tensor-parallel all-reduces of one stage for one microbatch (tp innermost: stride 1):
    Megatron's 2 forward + 2 backward of ``b·s·h`` activations per layer, 2 more per recomputed
    forward, and the embedding output and output-layer input gradient (Narayanan et al. SC21
    §3.2); an MLP all-reduces once per pair of layers each way."""
    b, tp = s.micro_batch_size, s.tp
    tp_alpha, tp_beta = _links(hw, c, tp, 1.0, s.gpus_per_node)
    if m.kind == "transformer":
        n_tp = b * m.seq_len * m.hidden_size * act_b
        per_layer = 4.0 + jnp.where(full, 2.0, 0.0)  # 2 fwd + 2 bwd (+2 recomputed fwd)
        extra = 2.0  # embedding output (fwd) and output-layer input gradient (bwd)
    else:
        n_tp = b * m.hidden_size * act_b
        per_layer = 1.0 + jnp.where(full, 0.5, 0.0)  # one all-reduce per pair of layers, each way
        extra = 0.0
    ar_tp = coll.all_reduce_s(tp, n_tp, tp_alpha, tp_beta)
    return (n_layers * per_layer + extra) * ar_tp


def _pp_p2p(m: ModelSpec, hw: HardwareSpec, c: Constants, s: Strategy, act_b, v):
    """Pipeline sends of the step (stride tp·dp between neighbouring stages): each of the
    ``v·m + p - 1`` stage boundaries crossed forward and backward sends one activation."""
    tp, pp, dp, mb = s.tp, s.pp, s.dp, s.num_microbatches
    pp_alpha, pp_beta = _links(hw, c, 2.0, tp * dp, s.gpus_per_node)
    # Megatron's scatter/gather optimisation sends 1/tp of the activation per rank over the
    # inter-node link and all-gathers it over NVLink (Narayanan et al. SC21 §4.1)
    n_pp = s.micro_batch_size * tokens_per_sample(m) * m.hidden_size * act_b / tp
    return jnp.where(pp > 1, 2.0 * (v * mb + pp - 1.0) * coll.p2p_s(n_pp, pp_alpha, pp_beta), 0.0)


def _dp_comm(
    m: ModelSpec, hw: HardwareSpec, c: Constants, s: Strategy, stage: _StageCompute
) -> _DataParallel:
    """Data-parallel gradient traffic of the step (stride tp) and the part left exposed.

    What ZeRO's partitioning forces (Rajbhandari et al. 2020 §5; DeepSpeed's stage 2 and 3
    engines): with gradients partitioned (ZeRO-2, 3) a replica has no buffer to accumulate a
    whole gradient in, so every microbatch's gradient is reduce-scattered as its backward pass
    produces it; with parameters partitioned (ZeRO-3) every microbatch gathers each layer for
    its forward and again for its backward (recompute included); ZeRO-1 and 2 all-gather the
    updated parameter shards after the optimizer step, where no backward pass is left to hide
    behind. ZeRO-0 all-reduces the accumulated gradient once, behind the last backward pass.
    With ``dp_overlap`` a fraction of the hideable traffic hides behind the backward passes.
    """
    dp, mb = s.dp, s.num_microbatches
    dp_alpha, dp_beta = _links(hw, c, dp, s.tp, s.gpus_per_node)
    params_dev = stage_params(m, s)
    w_b, g_b, _ = model_state_bytes_per_param(s.dtype)
    partitioned = s.zero_stage >= ZeroStage.OPTIMIZER
    zero3 = s.zero_stage == ZeroStage.PARAMETERS
    rs = coll.reduce_scatter_s(dp, params_dev * g_b, dp_alpha, dp_beta)
    ag = coll.all_gather_s(dp, params_dev * w_b, dp_alpha, dp_beta)
    per_mb = jnp.where(s.zero_stage >= ZeroStage.GRADIENTS, mb, 1.0)
    hideable = jnp.where(
        partitioned,
        per_mb * rs + jnp.where(zero3, 2.0 * mb * ag, 0.0),
        coll.all_reduce_s(dp, params_dev * g_b, dp_alpha, dp_beta),
    )
    exposed = jnp.where(partitioned & ~zero3, ag, 0.0)
    dp_total = hideable + exposed
    fwd, bwd = stage.fwd_layer_s, stage.bwd_layer_s
    window = per_mb * stage.num_layers * jnp.where(zero3, fwd + bwd, bwd)
    hidden = jnp.where(s.dp_overlap > 0, jnp.minimum(c.dp_overlap_fraction * hideable, window), 0.0)
    return _DataParallel(total_s=dp_total, exposed_s=dp_total - hidden)


def _optimizer(m: ModelSpec, c: Constants, s: Strategy, t):
    """Adam's update on this rank's parameters (its 1/dp shard under ZeRO >= 1), memory-bound:
    :data:`ADAM_BYTES_PER_PARAM` bytes and 10 FLOPs per parameter, scaled by the calibrated
    ``optimizer_time_factor``."""
    local = stage_params(m, s) / jnp.where(s.zero_stage >= ZeroStage.OPTIMIZER, s.dp, 1.0)
    opt_bytes = local * ADAM_BYTES_PER_PARAM
    return c.optimizer_time_factor * t(
        OpClass(flops=local * 10.0, bytes=opt_bytes, kernels=jnp.ones(()), tensor=False)
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


def _hardware_flops(m: ModelSpec, s: Strategy, stage: _StageCompute):
    """FLOPs the devices execute per step: 3x the forward (forward + 2x backward), what is
    redone (recomputation, a fused backward's Q·Kᵀ) and the output layer, over every layer
    (not the model FLOPs of Narayanan et al. eq. 3, which count no recomputation)."""
    hw_layer = 3.0 * stage.fwd_flops + stage.redo_flops + stage.fused_redo_flops
    return (m.num_layers * hw_layer + 3.0 * stage.logits_flops) * s.tp * s.num_microbatches * s.dp


def step_time(m: ModelSpec, hw: HardwareSpec, c: Constants, s: Strategy) -> StepBreakdown:
    """Time, throughput, utilisation and memory of one training step under one strategy.

    The step is ``m`` microbatches of the slowest stage plus the pipeline bubble of
    ``(p-1)/v`` stage-microbatch times (Narayanan et al. SC21 §2.2), tensor-parallel
    all-reduces, pipeline sends, the exposed data-parallel traffic, the optimizer step and a
    per-microbatch overhead: the terms of :data:`BREAKDOWN_TERMS`, each a named step below.

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

    def t(op: OpClass):
        return op_time_s(op, c, prec.tensor_peak, prec.vector_peak, hw.memory_bandwidth_bytes_per_s)

    modes = _modes(s)
    v, mb = modes.chunks, s.num_microbatches
    stage = _compute_terms(m, s, t, prec.act_bytes, modes)
    stage_tp_mb = _tp_comm(m, hw, c, s, prec.act_bytes, stage.num_layers, modes.full)
    compute_s = mb * stage.stage_mb_s
    tp_comm_s = mb * stage_tp_mb
    bubble_s = (s.pp - 1.0) / v * (stage.stage_mb_s + stage_tp_mb)
    pp_p2p_s = _pp_p2p(m, hw, c, s, prec.act_bytes, v)
    dpc = _dp_comm(m, hw, c, s, stage)
    optimizer_s = _optimizer(m, c, s, t)
    overhead_s = c.microbatch_overhead_s * mb * v
    slicing = _host_slicing(hw, s)
    compute_s, bubble_s, optimizer_s, overhead_s = (
        slicing * x for x in (compute_s, bubble_s, optimizer_s, overhead_s)
    )
    total = compute_s + tp_comm_s + dpc.exposed_s + pp_p2p_s + bubble_s + optimizer_s + overhead_s
    return _breakdown(
        m,
        hw,
        s,
        terms=dict(
            compute_s=compute_s,
            tp_comm_s=tp_comm_s,
            dp_comm_exposed_s=dpc.exposed_s,
            pp_p2p_s=pp_p2p_s,
            bubble_s=bubble_s,
            optimizer_s=optimizer_s,
            overhead_s=overhead_s,
        ),
        total=total,
        dp_total=dpc.total_s,
        hardware_flops=_hardware_flops(m, s, stage),
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
    fits = mem.total_bytes <= hw.memory_capacity_bytes
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
      m, hw, c: model, hardware and constants (shared by every row).
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
    if reduce is not None:
        return _evaluate_grid(
            fn,
            reduce,
            m,
            hw,
            c,
            placed,
            jnp.asarray(n, jnp.int32),
            tuple(place(a) for a in row_args),
        )
    out = _evaluate_grid(fn, None, m, hw, c, placed, None, ())
    if trim and rows != n:
        out = jax.tree.map(lambda x: x[:n], out)
    return out


@functools.partial(jax.jit, static_argnums=(0, 1))
def _evaluate_grid(fn, reduce, m, hw, c, grid, n, row_args):
    out = jax.vmap(fn, in_axes=(None, None, None, 0))(m, hw, c, grid)
    return out if reduce is None else reduce(out, n, *row_args)
