"""DistIR's cost model (microsoft/dist-ir) as a one-strategy step function (``cost_model="distir"``).

``distir_step_time(m, hw, c, s)`` has the signature and result of
:func:`perfmodel.step.step_time.step_time` (pure, jittable, vmappable over ``Strategy``) but uses
DistIR's formulas and default constants (``profiles/distir_defaults.json``) instead of the
hardware preset and the calibrated :class:`~perfmodel.specs.constants.Constants`, which it ignores:

- every op costs ``10 µs + bytes / 9e11 B/s + FLOPs / 1.4e13 FLOP/s`` (a sum, not a roofline max;
  ``dist_ir/executor/cost_model.py``); a MatMul reads both operands (not its output), a
  MatMulGrad is two MatMuls, an element-wise op reads its inputs and does one FLOP per element;
- links are 25 Gbit/s with 1.25e8 bytes per Gbit between every pair of devices
  (``get_uniform_topology``); a ring all-reduce of ``S`` bytes on ``N`` ranks costs
  ``2·S·(N-1)/N / bandwidth`` and a send ``S / bandwidth``, with no latency term;
- data parallelism all-reduces every weight gradient after the whole backward pass, not
  overlapped (``mlp_dhp_transform``); tensor parallelism splits the weights column/row-wise in
  turn and all-reduces the activations after every second MatMul (and MatMulGrad) of the
  microbatch; pipelining is PipeDream 1F1B with explicit, blocking stage sends;
- the optimiser is SGD, and DistIR's ``_sgd_cost_fn`` keeps only the cost of the last
  (weight, gradient) pair of each device (``dict.update`` overwrites), which is reproduced.

The pipeline makespan is a closed form of DistIR's simulated 1F1B trace, not DistIR's
op-by-op simulation: ``m`` cycles of ``F + B + k·send`` on the busiest stage (``k = 2`` with two
stages, 4 with more, because a blocking send occupies both ends) plus ``(p-1)·(F + B + 2·send)``
of fill and drain. DistIR's own grids are power-of-two (dp, tp, pp) with ``dp·tp·pp = N``; see
:func:`distir_grid_columns`. Memory fields come from :mod:`perfmodel.step.memory` (aisim's count)
for the plain strategy that DistIR models; DistIR's simulator tracks live tensors but has no
capacity limit. Knobs DistIR lacks (ZeRO, recomputation, sequence parallelism, interleaving,
DP overlap) are ignored. A strategy DistIR cannot build (``pp`` not dividing the layers, one
stage with several microbatches) has ``valid = False``.
"""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from perfmodel.specs.choices import Dtype, Recompute, Schedule, ZeroStage
from perfmodel.specs.constants import Constants
from perfmodel.specs.hardware import HardwareSpec
from perfmodel.specs.model import ModelSpec, model_flops_per_step, tokens_per_sample
from perfmodel.specs.stack import Stack
from perfmodel.specs.strategy import Strategy, leaf_codes
from perfmodel.step.breakdown import StepBreakdown
from perfmodel.step.memory import layers_per_stage, memory_per_device, stage_params
from perfmodel.step.workload import OpClass, layer_forward_ops, logits_forward_ops


def _load_defaults() -> dict:
    text = resources.files("perfmodel").joinpath("profiles/distir_defaults.json").read_text()
    return json.loads(text)


DISTIR_DEFAULTS = _load_defaults()
# what DistIR models of a software stack (its defaults file's "stack": no DP overlap, no fused
# attention)
DISTIR_STACK_BEHAVIOUR = dict(DISTIR_DEFAULTS["stack"])
DISTIR_STACK = Stack(name="distir", **DISTIR_STACK_BEHAVIOUR)
# numpy, not jax: importing this module must not start a JAX backend (jax.distributed
# has to be initialised first, fl.distributed)
DEVICE_THROUGHPUT_FLOPS_PER_S = np.asarray(
    DISTIR_DEFAULTS["device_throughput_flops_per_s"], np.float32
)
DRAM_BANDWIDTH_BYTES_PER_S = np.asarray(DISTIR_DEFAULTS["dram_bandwidth_bytes_per_s"], np.float32)
KERNEL_LAUNCH_OVERHEAD_S = np.asarray(DISTIR_DEFAULTS["kernel_launch_overhead_s"], np.float32)
LINK_BANDWIDTH_BYTES_PER_S = np.asarray(
    DISTIR_DEFAULTS["network_bandwidth_gbit_per_s"] * DISTIR_DEFAULTS["bytes_per_gbit"], np.float32
)
# a dtype the defaults do not list (fp4) moves 16-bit activations, as fp8 does
BYTES_PER_ELEMENT = np.asarray(
    [float(DISTIR_DEFAULTS["bytes_per_element"].get(d, 2)) for d in Dtype.labels()], np.float32
)
DEFAULT_DTYPE = DISTIR_DEFAULTS["default_dtype"]
GRID_MICROBATCHES = tuple(int(k) for k in DISTIR_DEFAULTS["grid_num_microbatches_pipelined"])
# weight and bias tensors of a GPT-2 layer (2 layer norms, qkv, proj, fc1, fc2): the Add ops
# that DistIR's microbatch aggregation runs per layer
_GPT_LAYER_TENSORS = 12.0


def op_s(flops, nbytes, kernels=1.0):
    """DistIR's time of ops: ``kernels · 10 µs + bytes / DRAM bandwidth + FLOPs / throughput``.

    Args:
      flops, nbytes: FLOPs and DRAM bytes of the ops (scalars).
      kernels: number of ops (kernel launches).

    Returns:
      Seconds (``cost_model.py``: ``_matmul_cost_fn``, ``_elementwise_cost_fn``).
    """
    return (
        kernels * KERNEL_LAUNCH_OVERHEAD_S
        + nbytes / DRAM_BANDWIDTH_BYTES_PER_S
        + flops / DEVICE_THROUGHPUT_FLOPS_PER_S
    )


def all_reduce_s(n, nbytes):
    """DistIR's ring all-reduce of ``nbytes`` on ``n`` ranks: ``2·S·(n-1)/n / bandwidth`` (no latency)."""
    return 2.0 * nbytes * (n - 1.0) / n / LINK_BANDWIDTH_BYTES_PER_S


def send_s(nbytes):
    """DistIR's point-to-point send: ``S / bandwidth``."""
    return nbytes / LINK_BANDWIDTH_BYTES_PER_S


def _class_s(op: OpClass, factor=1.0):
    return op_s(op.flops * factor, op.bytes * factor, op.kernels * factor)


def _mlp_stage(m: ModelSpec, b, t, n, S):
    """Per-microbatch (fwd compute, bwd compute, fwd+bwd flops, TP all-reduce bytes, send bytes,
    SGD weight elements, aggregation seconds) of an MLP stage of ``n`` layers (``mlp.py``)."""
    L = m.num_layers
    a = (m.input_size + (L - 1.0) * m.hidden_size) / L  # mean input width of a layer
    c = (m.output_size + (L - 1.0) * m.hidden_size) / L  # mean output width
    W = (
        jnp.where(
            L > 1,
            m.input_size * m.hidden_size
            + (L - 2.0) * m.hidden_size**2
            + m.hidden_size * m.output_size,
            m.input_size * m.output_size,
        )
        / L
    )
    nc = jnp.ceil(n / 2.0)  # column-parallel layers (even index: weight split on dim 1)
    nr = n - nc  # row-parallel layers (odd index: split on dim 0), followed by an all-reduce
    mm_flops = 2.0 * b * W / t
    fwd = (
        nc * op_s(mm_flops, S * (b * a + W / t))
        + nr * op_s(mm_flops, S * (b * a / t + W / t))
        + nc * op_s(b * c / t, S * b * c / t)
        + nr * op_s(b * c, S * b * c)  # Relu
        + 2.0 * op_s(b * m.output_size, S * b * m.output_size)
    )  # Loss and LossGrad read the labels
    bwd = (
        nc * op_s(b * c / t, 2.0 * S * b * c / t)
        + nr * op_s(b * c, 2.0 * S * b * c)  # ReluGrad
        # MatMulGrad: dz·wᵀ then xᵀ·dz
        + nc * op_s(2.0 * mm_flops, S * (b * c / t + W / t + a * b + b * c / t), 2.0)
        + nr * op_s(2.0 * mm_flops, S * (b * c + W / t + a * b / t + b * c), 2.0)
    )
    flops = n * 3.0 * mm_flops + nc * 2.0 * b * c / t + nr * 2.0 * b * c
    tp_bytes = n * S * b * (a + c) / 2.0  # n all-reduces of b x width activations
    add_s = n * op_s(W / t, 2.0 * S * W / t) + KERNEL_LAUNCH_OVERHEAD_S  # Add per dw + one Concat
    return fwd, bwd, flops, tp_bytes, S * b * c, W / t, add_s


def _transformer_stage(m: ModelSpec, b, t, n, S):
    """The same quantities for a GPT stage: aisim's layer op classes costed with DistIR's rule,
    backward = twice the forward, 2 + 2 TP all-reduces of ``b·s·h`` per layer."""
    ops = layer_forward_ops(m, b, t, jnp.zeros(()), S)  # unfused attention, no SP
    classes = (ops.qkv, ops.attention, ops.softmax, ops.proj, ops.mlp, ops.elementwise)
    logits_mm, xent = logits_forward_ops(m, b, t, S)
    fwd = (
        n * sum(_class_s(op) for op in classes)
        + _class_s(logits_mm)
        + _class_s(xent)
        + KERNEL_LAUNCH_OVERHEAD_S
    )
    bwd = n * sum(_class_s(op, 2.0) for op in classes) + _class_s(logits_mm, 2.0) + _class_s(xent)
    flops = n * 3.0 * sum(op.flops for op in classes) + 3.0 * logits_mm.flops + 2.0 * xent.flops
    act = S * b * m.seq_len * m.hidden_size
    w_last = m.hidden_size * m.ffn_hidden_size / t  # the largest weight of a layer
    # weights of a layer on this rank, from its matmul FLOPs (2 per weight per token)
    per_layer_params = (ops.qkv.flops + ops.proj.flops + ops.mlp.flops) / (2.0 * b * m.seq_len)
    add_s = (
        n * op_s(per_layer_params, 2.0 * S * per_layer_params, _GPT_LAYER_TENSORS)
        + KERNEL_LAUNCH_OVERHEAD_S
    )
    return fwd, bwd, flops, 4.0 * n * act, act, w_last, add_s


def distir_validity(m: ModelSpec, s: Strategy):
    """Whether DistIR's transforms can build the strategy (a boolean array, never an exception)."""
    lay, bat = s.layout, s.batching
    ok = (
        (lay.dp >= 1)
        & (lay.tp >= 1)
        & (lay.pp >= 1)
        & (bat.micro_batch_size >= 1)
        & (bat.num_microbatches >= 1)
    )
    if m.kind == "transformer":
        ok &= lay.tp <= m.num_heads  # gpt2_dhp_transform.check_params: heads >= tp (not a divisor)
    else:
        ok &= jnp.abs(jnp.round(m.hidden_size / lay.tp) * lay.tp - m.hidden_size) < 0.5
    ok &= jnp.abs(jnp.round(m.num_layers / lay.pp) * lay.pp - m.num_layers) < 0.5  # equal stages
    ok &= (lay.pp > 1) | (bat.num_microbatches < 1.5)  # one stage: one microbatch
    return ok


def plain_strategy(s: Strategy) -> Strategy:
    """The strategy as DistIR models it: no ZeRO, recomputation, sequence parallelism,
    interleaving, DP overlap or fused attention; the 1F1B schedule."""
    zero = jnp.zeros_like(s.layout.dp)
    return dataclasses.replace(
        s,
        memory=dataclasses.replace(
            s.memory, zero_stage=zero, recompute=zero, sequence_parallel=zero
        ),
        batching=dataclasses.replace(
            s.batching,
            interleave=jnp.ones_like(zero),
            schedule=jnp.full_like(zero, float(Schedule.ONE_F_ONE_B)),
        ),
        stack=dataclasses.replace(s.stack, **DISTIR_STACK_BEHAVIOUR),
    )


class _DistirTerms(NamedTuple):
    """DistIR's terms of one step (seconds) and the FLOPs of its slowest stage."""

    compute_s: Float[Array, ""]
    tp_comm_s: Float[Array, ""]
    dp_s: Float[Array, ""]  # the whole gradient all-reduce (not overlapped)
    pp_p2p_s: Float[Array, ""]
    bubble_s: Float[Array, ""]
    optimizer_s: Float[Array, ""]
    overhead_s: Float[Array, ""]
    stage_flops: Float[Array, ""]  # one microbatch on one stage
    layers: Float[Array, ""]  # per stage


def _distir_terms(m: ModelSpec, s: Strategy) -> _DistirTerms:
    """The terms of :func:`distir_step_time` for a strategy DistIR can model
    (:func:`plain_strategy`): ``m`` microbatches of the slowest stage and its TP all-reduces,
    the stage sends, the 1F1B fill and drain, the gradient all-reduce, the SGD op and the
    per-microbatch gradient Adds."""
    S = jnp.asarray(BYTES_PER_ELEMENT)[s.memory.dtype.astype(jnp.int32)]
    lay, bat = s.layout, s.batching
    b, tp, pp, dp, mb = bat.micro_batch_size, lay.tp, lay.pp, lay.dp, bat.num_microbatches
    n = layers_per_stage(m, lay)
    stage = _transformer_stage if m.kind == "transformer" else _mlp_stage
    fwd, bwd, stage_flops, tp_bytes, send_bytes, w_last, add_s = stage(m, b, tp, n, S)
    tp_mb = jnp.where(tp > 1, all_reduce_s(tp, tp_bytes), 0.0)
    send = send_s(send_bytes)
    steady_sends = jnp.where(pp > 2, 4.0, 2.0)
    return _DistirTerms(
        compute_s=mb * (fwd + bwd),
        tp_comm_s=mb * tp_mb,
        dp_s=jnp.where(dp > 1, all_reduce_s(dp, S * stage_params(m, lay)), 0.0),
        pp_p2p_s=jnp.where(pp > 1, mb * steady_sends * send + 2.0 * (pp - 1.0) * send, 0.0),
        bubble_s=(pp - 1.0) * (fwd + bwd + tp_mb),
        optimizer_s=op_s(w_last, 2.0 * S * w_last),
        overhead_s=(mb - 1.0) * add_s,
        stage_flops=stage_flops,
        layers=n,
    )


def distir_step_time(m: ModelSpec, hw: HardwareSpec, c: Constants, s: Strategy) -> StepBreakdown:
    """Time, throughput and memory of one training step under DistIR's cost model.

    Args:
      m: model dimensions (an MLP follows DistIR's ``mlp.py``; a transformer uses aisim's
        layer op classes costed with DistIR's per-op rule).
      hw: only ``memory_capacity_bytes`` (for ``fits_memory``) and the price are used.
      c: unused (DistIR has its own constants); kept for the common signature.
      s: the strategy (scalar leaves).

    Returns:
      A :class:`~perfmodel.step.step_time.StepBreakdown`. ``compute_s`` and ``tp_comm_s`` are the
      ``m`` microbatches of the slowest stage, ``dp_comm_exposed_s`` the whole (not overlapped)
      gradient all-reduce, ``pp_p2p_s`` the stage sends, ``bubble_s`` the 1F1B fill and drain,
      ``optimizer_s`` the SGD op and ``overhead_s`` DistIR's per-microbatch gradient Adds.
      MFU and HFU are relative to DistIR's 1.4e13 FLOP/s device throughput.
    """
    del c
    s = plain_strategy(s)
    lay, mb = s.layout, s.batching.num_microbatches
    t = _distir_terms(m, s)
    total = (
        t.compute_s + t.tp_comm_s + t.dp_s + t.pp_p2p_s + t.bubble_s + t.optimizer_s + t.overhead_s
    )

    gbs = s.global_batch
    gpus = s.num_gpus
    tokens = gbs * tokens_per_sample(m)
    model_flops = model_flops_per_step(m, gbs)
    hardware_flops = t.stage_flops * (m.num_layers / t.layers) * lay.tp * mb * lay.dp
    denom = total * gpus * DEVICE_THROUGHPUT_FLOPS_PER_S
    mem = memory_per_device(m, s)
    fits = mem.total_bytes <= hw.memory_capacity_bytes
    valid = distir_validity(m, s)
    return StepBreakdown(
        compute_s=t.compute_s,
        tp_comm_s=t.tp_comm_s,
        cp_comm_s=jnp.zeros_like(t.tp_comm_s),
        ep_comm_s=jnp.zeros_like(t.tp_comm_s),
        dp_comm_exposed_s=t.dp_s,
        pp_p2p_s=t.pp_p2p_s,
        bubble_s=t.bubble_s,
        optimizer_s=t.optimizer_s,
        overhead_s=t.overhead_s,
        step_overhead_s=jnp.zeros_like(t.tp_comm_s),
        step_time_s=total,
        dp_comm_total_s=t.dp_s,
        throughput_samples_per_s=gbs / total,
        tokens_per_s=tokens / total,
        model_flops=model_flops,
        hardware_flops=hardware_flops,
        mfu=model_flops / denom,
        hfu=hardware_flops / denom,
        model_tflops_per_gpu=model_flops / (total * gpus) / 1e12,
        hardware_tflops_per_gpu=hardware_flops / (total * gpus) / 1e12,
        cost_per_million_tokens_usd=hw.price_per_device_hour_usd
        * gpus
        * total
        / 3600.0
        / tokens
        * 1e6,
        memory=mem,
        memory_per_device_bytes=mem.total_bytes,
        fits_memory=fits,
        valid=valid,
        feasible=fits & valid,
    )


def distir_degrees(num_gpus: int) -> np.ndarray:
    """DistIR's ``GridSearch.get_all_degrees``: every power-of-two (dp, tp, pp) with product N.

    Returns:
      An int64 array of shape ``(k, 3)`` (empty when N is not a power of two).
    """
    n = int(num_gpus)
    if n < 1 or n & (n - 1):
        return np.zeros((0, 3), np.int64)
    e = int(np.log2(n))
    i, j = np.meshgrid(np.arange(e + 1), np.arange(e + 1), indexing="ij")
    keep = i + j <= e
    d, h = 2 ** i[keep], 2 ** j[keep]
    return np.stack([d, h, n // (d * h)], axis=1).astype(np.int64)


def distir_grid_columns(num_gpus: int, global_batch: int) -> dict[str, np.ndarray]:
    """The KNOBS columns of DistIR's grid search for one GPU count and global batch.

    ``examples/grid_search.py`` ``gen_configurations``: power-of-two (dp, tp, pp) with
    dp·tp·pp = N; 1 microbatch when pp = 1, else 2, 4, ..., 128; rows whose per-replica or
    per-microbatch batch would be 0 are skipped. DistIR floors the per-microbatch batch; aisim
    keeps only the rows where ``dp·num_microbatches`` divides the batch (all rows for a
    power-of-two batch), so that the global batch is kept. The other knobs are DistIR's:
    fp16, 1F1B, no ZeRO, recomputation, sequence parallelism or DP overlap, and all N devices
    in one uniform "node".

    Returns:
      ``{knob: array of shape (n,)}`` for every leaf knob; DistIR's stack (no DP overlap, no
      fused attention) is :data:`DISTIR_STACK`.
    """
    deg = distir_degrees(num_gpus)
    B = int(global_batch)
    ks = np.asarray(GRID_MICROBATCHES, np.int64)
    dp = np.repeat(deg[:, 0], len(ks) + 1)
    tp = np.repeat(deg[:, 1], len(ks) + 1)
    pp = np.repeat(deg[:, 2], len(ks) + 1)
    k = np.tile(np.concatenate([[1], ks]), len(deg))
    keep = (k == 1) == (pp == 1)
    keep &= (B // np.maximum(dp, 1) > 0) & (B % np.maximum(dp * k, 1) == 0) & (B >= dp * k)
    dp, tp, pp, k = dp[keep], tp[keep], pp[keep], k[keep]
    rows = len(dp)
    const = leaf_codes(
        dict(
            interleave=1,
            schedule=int(Schedule.ONE_F_ONE_B),
            zero_stage=int(ZeroStage.NONE),
            recompute=int(Recompute.NONE),
            sequence_parallel=0,
            dtype=int(Dtype.parse(DEFAULT_DTYPE, "default_dtype")),
            gpus_per_node=int(num_gpus),
        )
    )
    cols = dict(
        dp=dp, tp=tp, pp=pp, micro_batch_size=B // np.maximum(dp * k, 1), num_microbatches=k
    )
    out = {name: np.full(rows, v, np.float32) for name, v in const.items()}
    out.update({name: np.asarray(v, np.float32) for name, v in cols.items()})
    return out
