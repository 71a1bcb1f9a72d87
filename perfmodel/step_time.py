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

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from perfmodel import collectives as coll
from perfmodel.constants import Constants
from perfmodel.hardware import HardwareSpec
from perfmodel.memory import (
    MemoryBreakdown,
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
BREAKDOWN_TERMS = (
    "compute_s",
    "tp_comm_s",
    "dp_comm_exposed_s",
    "pp_p2p_s",
    "bubble_s",
    "optimizer_s",
    "overhead_s",
)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StepBreakdown:
    """Named result of one strategy (seconds, bytes, FLOPs; booleans as arrays).

    The terms in :data:`BREAKDOWN_TERMS` add up to ``step_time_s``.
    """

    compute_s: Float[Array, "*n"]
    tp_comm_s: Float[Array, "*n"]
    dp_comm_exposed_s: Float[Array, "*n"]
    pp_p2p_s: Float[Array, "*n"]
    bubble_s: Float[Array, "*n"]
    optimizer_s: Float[Array, "*n"]
    overhead_s: Float[Array, "*n"]
    step_time_s: Float[Array, "*n"]
    dp_comm_total_s: Float[Array, "*n"]
    throughput_samples_per_s: Float[Array, "*n"]
    tokens_per_s: Float[Array, "*n"]
    model_flops: Float[Array, "*n"]
    hardware_flops: Float[Array, "*n"]
    mfu: Float[Array, "*n"]
    hfu: Float[Array, "*n"]
    model_tflops_per_gpu: Float[Array, "*n"]
    hardware_tflops_per_gpu: Float[Array, "*n"]
    cost_per_million_tokens_usd: Float[Array, "*n"]
    memory: MemoryBreakdown
    memory_per_device_bytes: Float[Array, "*n"]
    fits_memory: Float[Array, "*n"]
    valid: Float[Array, "*n"]
    feasible: Float[Array, "*n"]


def _scaled(op: OpClass, factor) -> OpClass:
    return dataclasses.replace(
        op, flops=op.flops * factor, bytes=op.bytes * factor, kernels=op.kernels * factor
    )


def _divides(d, n):
    return jnp.abs(jnp.round(n / d) * d - n) < 0.5


def validity(m: ModelSpec, hw: HardwareSpec, s: Strategy) -> Float[Array, ""]:
    """Divisibility and support checks of a strategy, as a boolean (never an exception)."""
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
    interleaved = s.schedule > 1.5
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


def step_time(m: ModelSpec, hw: HardwareSpec, c: Constants, s: Strategy) -> StepBreakdown:
    """Time, throughput, utilisation and memory of one training step under one strategy.

    Args:
      m: model dimensions.
      hw: device and link numbers.
      c: efficiencies and overheads (a preset's defaults or a calibrated profile).
      s: the strategy (scalar leaves; see :func:`evaluate_grid` for many).

    Returns:
      A :class:`StepBreakdown`; infeasible strategies (bad divisibility, out of memory) keep
      finite numbers and carry ``feasible = False``.
    """
    dtype = s.dtype.astype(jnp.int32)
    act_b = jnp.asarray(ACT_BYTES, jnp.float32)[dtype]
    nominal_peak = hw.peak_flops_per_s[dtype]
    tensor_peak = jnp.where(nominal_peak > 0, nominal_peak, hw.peak_flops_per_s[0])
    vector_peak = hw.peak_flops_per_s[0]
    bw = hw.memory_bandwidth_bytes_per_s

    def t(op: OpClass):
        return op_time_s(op, c, tensor_peak, vector_peak, bw)

    b, tp, pp, dp, mb = s.micro_batch_size, s.tp, s.pp, s.dp, s.num_microbatches
    v = jnp.where(s.schedule > 1.5, s.interleave, 1.0)
    full = s.recompute > 1.5
    fused = s.fused_attention > 0
    # selective recomputation redoes the attention core, which a fused kernel never stores
    selective = (s.recompute > 0.5) & ~full & ~fused

    # ---- compute of the slowest stage for one microbatch (forward, backward = 2x, recompute)
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
    stage_compute_mb = n_layers * layer_mb + logits_mb

    # ---- tensor-parallel collectives (tp innermost: stride 1)
    gpn = s.gpus_per_node
    tp_alpha, tp_beta = coll.link_params(
        coll.tier_of_group(tp, 1.0, gpn),
        hw.link_bandwidth_bytes_per_s,
        c.link_latency_s,
        c.link_bandwidth_efficiency,
    )
    if m.kind == "transformer":
        n_tp = b * m.seq_len * m.hidden_size * act_b
        per_layer = 4.0 + jnp.where(full, 2.0, 0.0)  # 2 fwd + 2 bwd (+2 recomputed fwd)
        extra = 2.0  # embedding output (fwd) and output-layer input gradient (bwd)
    else:
        n_tp = b * m.hidden_size * act_b
        per_layer = 1.0 + jnp.where(full, 0.5, 0.0)  # one all-reduce per pair of layers, each way
        extra = 0.0
    ar_tp = coll.all_reduce_s(tp, n_tp, tp_alpha, tp_beta)
    stage_tp_mb = (n_layers * per_layer + extra) * ar_tp

    compute_s = mb * stage_compute_mb
    tp_comm_s = mb * stage_tp_mb
    bubble_s = (pp - 1.0) / v * (stage_compute_mb + stage_tp_mb)

    # ---- pipeline point-to-point (stride tp·dp between neighbouring stages)
    pp_alpha, pp_beta = coll.link_params(
        coll.tier_of_group(2.0, tp * dp, gpn),
        hw.link_bandwidth_bytes_per_s,
        c.link_latency_s,
        c.link_bandwidth_efficiency,
    )
    # Megatron's scatter/gather optimisation sends 1/tp of the activation per rank over the
    # inter-node link and all-gathers it over NVLink (Narayanan et al. SC21 §4.1)
    n_pp = b * tokens_per_sample(m) * m.hidden_size * act_b / tp
    pp_p2p_s = jnp.where(
        pp > 1, 2.0 * (v * mb + pp - 1.0) * coll.p2p_s(n_pp, pp_alpha, pp_beta), 0.0
    )

    # ---- data-parallel gradient traffic (stride tp), partly hidden behind the last backward
    dp_alpha, dp_beta = coll.link_params(
        coll.tier_of_group(dp, tp, gpn),
        hw.link_bandwidth_bytes_per_s,
        c.link_latency_s,
        c.link_bandwidth_efficiency,
    )
    params_dev = stage_params(m, s)
    w_b, g_b, _ = model_state_bytes_per_param(s.dtype)
    zero3 = s.zero_stage > 2.5
    # What ZeRO's partitioning forces (Rajbhandari et al. 2020 §5; DeepSpeed's stage 2 and 3
    # engines): with gradients partitioned (ZeRO-2, 3) a replica has no buffer to accumulate a
    # whole gradient in, so every microbatch's gradient is reduce-scattered as its backward pass
    # produces it; with parameters partitioned (ZeRO-3) every microbatch gathers each layer for
    # its forward and again for its backward (recompute included); ZeRO-1 and 2 all-gather the
    # updated parameter shards after the optimizer step, where no backward pass is left to hide
    # behind. ZeRO-0 all-reduces the accumulated gradient once, behind the last backward pass.
    rs = coll.reduce_scatter_s(dp, params_dev * g_b, dp_alpha, dp_beta)
    ag = coll.all_gather_s(dp, params_dev * w_b, dp_alpha, dp_beta)
    per_mb = jnp.where(s.zero_stage > 1.5, mb, 1.0)
    hideable = jnp.where(
        s.zero_stage > 0.5,
        per_mb * rs + jnp.where(zero3, 2.0 * mb * ag, 0.0),
        coll.all_reduce_s(dp, params_dev * g_b, dp_alpha, dp_beta),
    )
    exposed = jnp.where((s.zero_stage > 0.5) & ~zero3, ag, 0.0)
    dp_total = hideable + exposed
    window = per_mb * n_layers * jnp.where(zero3, fwd_layer + bwd_layer, bwd_layer)
    hidden = jnp.where(s.dp_overlap > 0, jnp.minimum(c.dp_overlap_fraction * hideable, window), 0.0)
    dp_exposed = dp_total - hidden

    # ---- optimizer step (memory-bound), on this rank's shard under ZeRO >= 1
    local = params_dev / jnp.where(s.zero_stage > 0.5, dp, 1.0)
    opt_bytes = local * ADAM_BYTES_PER_PARAM
    optimizer_s = c.optimizer_time_factor * t(
        OpClass(flops=local * 10.0, bytes=opt_bytes, kernels=jnp.ones(()), tensor=False)
    )
    overhead_s = c.microbatch_overhead_s * mb * v

    # devices time-sliced on one host's cores (XLA's CPU devices, ``hw.devices_share_host``):
    # each of the n busy at once gets 1/n of the host, so its own work (kernels, optimizer,
    # dispatch) takes n times as long as on the whole host; a collective is one copy on the
    # shared memory for all of them, so the alpha-beta terms stay as they are
    slicing = jnp.where(
        hw.devices_share_host > 0, jnp.maximum(jnp.minimum(s.num_gpus, gpn), 1.0), 1.0
    )
    compute_s, bubble_s, optimizer_s, overhead_s = (
        slicing * x for x in (compute_s, bubble_s, optimizer_s, overhead_s)
    )
    total = compute_s + tp_comm_s + dp_exposed + pp_p2p_s + bubble_s + optimizer_s + overhead_s

    # ---- throughput and utilisation
    gbs = s.global_batch
    gpus = s.num_gpus
    tokens = gbs * tokens_per_sample(m)
    model_flops = model_flops_per_step(m, gbs)
    fwd_flops_dev = sum(op.flops for op in classes)
    hw_layer = (
        3.0 * fwd_flops_dev
        + jnp.where(full, fwd_flops_dev, jnp.where(selective, ops.attention.flops, 0.0))
        + jnp.where(fused, fa_redo.flops, 0.0)
    )
    hardware_flops = (m.num_layers * hw_layer + 3.0 * logits_mm.flops) * tp * mb * dp
    denom = total * gpus * nominal_peak
    mem = memory_per_device(m, s)
    fits = mem.total_bytes <= hw.memory_capacity_bytes
    valid = validity(m, hw, s)
    price = hw.price_per_device_hour_usd
    return StepBreakdown(
        compute_s=compute_s,
        tp_comm_s=tp_comm_s,
        dp_comm_exposed_s=dp_exposed,
        pp_p2p_s=pp_p2p_s,
        bubble_s=bubble_s,
        optimizer_s=optimizer_s,
        overhead_s=overhead_s,
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


# The cost-model registry moved to perfmodel.cost_models (above both models, so that distir and
# step_time do not import each other); importable from here until every caller has moved.
def __getattr__(name: str):
    if name in ("COST_MODELS", "select_step_fn"):
        from perfmodel import cost_models

        return getattr(cost_models, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
