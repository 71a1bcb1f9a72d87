"""Bytes per device: weights, gradients, optimiser state and activations, for one strategy.

Model states with mixed-precision Adam take 2 bytes of weights, 12 of fp32 master copy, momentum
and variance, and a gradient of 2 bytes, or 4 when gradients are accumulated and reduced in fp32
(Megatron-Core's default with bf16: 18 bytes per parameter without the distributed optimizer;
Rajbhandari et al. 2020 §3.1 count 16); fp32 training takes 4 + 4 + 8. With
``param_remainders`` the fp32 master copy of bf16 weights is stored as its 16 missing low-order
bits (10 bytes of optimizer state, not 12: Apex's DistributedFusedAdam, NeMo's default for bf16
weights); with ``bf16_moments`` Adam's momentum and variance take 2 bytes each (4 fewer). With
``fsdp_fp32_params`` ZeRO-3's sharded parameters are themselves the fp32 master (PyTorch FSDP),
so no sharded 16-bit copy is kept and the sharded gradients are fp32: 16 bytes per parameter
over the shard group. FP8 training keeps an extra 1-byte copy of the weights
(Transformer Engine), or, with the distributed optimizer, the weights in FP8 only (Megatron-Core's
``--fp8-param-gather``); FP4 likewise at 4 bits plus block scales; the recipe sets the bytes
(:mod:`perfmodel.step.recipes`).
ZeRO-1/2/3 shard the optimiser state, then the gradients, then the weights over the data-parallel
ranks (dp·cp: context-parallel ranks hold the same weights), or, for ZeRO-3 with a ``shard_size``,
over groups of that size (HSDP). Routed experts are split over ep·etp ranks and their states sharded
over the expert-data-parallel ranks.

Activations are counted from the layer's real tensors, generalising Korthikanti et al. 2022 §4
(``s·b·h·(34 + 5·a·s/h)`` for a GPT layer) to grouped-query and latent attention, gated MLPs,
models without dropout, fused attention and MoE blocks: per layer and microbatch, in 16-bit
elements of ``s·b·h``, the replicated norm and GEMM inputs and dropout masks (``/t`` with sequence
parallelism), Q, K, V and the attention output, the MLP's fc1 and activation outputs, and the
``s²`` softmax tensors of an unfused kernel. Context parallelism divides them by cp. Selective
recomputation drops the ``s²`` tensors and what its ``recompute_modules`` discard
(:mod:`perfmodel.step.recompute`), full recomputation keeps the layer input of ``recompute_
layers`` layers (all by default) and, in the backward, the activations of the one layer being
recomputed (the larger of that and the loss's logits, which are freed before it). The first
pipeline stage holds ``pp`` microbatches in flight under 1F1B (``(1 + (p-1)/(p·v))`` times that
when interleaved, §4.2.3) and all ``m`` under GPipe; the second one microbatch fewer (two
chunks fewer when interleaved). Where ``pp`` does not divide the layers the first stage is the
lighter one (Megatron-Core's uneven split), and the device that peaks is whichever of the two
holds more.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from perfmodel.specs.choices import Dtype, Recompute, Schedule, ZeroStage
from perfmodel.specs.knobs import BY_NAME
from perfmodel.specs.model import (
    ModelSpec,
    attention_shape,
    dense_layer_params,
    embedding_params,
    expert_params,
    head_params,
    layer_params,
    moe_layer_count,
)
from perfmodel.specs.strategy import Batching, Layout, MemoryPlan, Strategy
from perfmodel.step.moe import moe_activation_bytes
from perfmodel.step.precision import activation_bytes
from perfmodel.step.recipes import stack_recipe
from perfmodel.step.recompute import saved_elements
from perfmodel.step.select import behaviour, both, either, is_off, negate, where
from perfmodel.step.workload import stores_scores


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per device on the pipeline stage that peaks highest (usually the first)."""

    weights_bytes: Float[Array, ""]
    gradients_bytes: Float[Array, ""]
    optimizer_bytes: Float[Array, ""]
    activations_bytes: Float[Array, ""]
    total_bytes: Float[Array, ""]


def layers_per_stage(m: ModelSpec, lay: Layout) -> Float[Array, ""]:
    """Layers on the most loaded stage: ``ceil(L / pp)`` (uneven stages allowed)."""
    return jnp.ceil(m.num_layers / lay.pp)


def end_stage_layers(m: ModelSpec, lay: Layout) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """Layers on the first and last stage when ``pp`` does not divide the layers.

    Megatron-Core's uneven split (``--decoder-first/last-pipeline-num-layers``): the middle
    stages take ``c = ceil(L/pp)`` layers and the first and last share the rest, lighter
    because they also carry the embedding and the loss (Qwen3-235B's 94 layers on pp 8: 11,
    6 x 12, 11). With an even split every stage has ``L/pp``.
    """
    c = layers_per_stage(m, lay)
    rest = m.num_layers - c * jnp.maximum(lay.pp - 2.0, 0.0)
    first = where(lay.pp > 1, jnp.ceil(rest / 2.0), m.num_layers)
    last = where(lay.pp > 1, rest - first, m.num_layers)
    even = jnp.abs(jnp.round(m.num_layers / lay.pp) * lay.pp - m.num_layers) < 0.5
    ok = even | (last < 1.0)  # too few layers to unbalance: keep ceil everywhere
    return where(ok, c, first), where(ok, c, last)


def stage_moe_layers(m: ModelSpec, n_layers) -> Float[Array, ""]:
    """MoE layers among ``n_layers`` of the busiest stage (the dense ones sit first)."""
    if not m.moe:
        return jnp.zeros(())
    return jnp.minimum(n_layers, moe_layer_count(m))


def stage_params_split(m: ModelSpec, lay: Layout) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """(non-expert, routed-expert) parameters on one device of the busiest stage (its
    ``ceil(L/pp)`` layers with the embedding, as the gradient reduction counts them): layers and
    embeddings split over tp, each MoE layer's routed experts over ep·etp."""
    return _stage_params(m, lay, _busiest_stage(m, lay))


class _PipelineStage(NamedTuple):
    """One pipeline stage as memory counts it."""

    layers: Float[Array, ""]
    moe_layers: Float[Array, ""]
    embedding: bool  # the first stage (the input embedding; alone, the head too)
    rank: int  # its pipeline rank: sets the microbatches in flight


def _memory_stages(m: ModelSpec, lay: Layout) -> tuple[_PipelineStage, _PipelineStage]:
    """The first stage and the second (a middle one, or the last of two): the device peaks on
    whichever holds more (:func:`memory_per_device`).

    With an uneven split (:func:`end_stage_layers`) the first stage has fewer layers than the
    middle ones but one more microbatch in flight; the dense layers of a model that starts
    with some (DeepSeek-V3's three) sit on the first stage.
    """
    first, last = end_stage_layers(m, lay)
    second = where(lay.pp > 2, layers_per_stage(m, lay), last)
    moe_first = moe_second = jnp.zeros(())
    if m.moe:
        dense_layers = m.num_layers - moe_layer_count(m)
        moe_first = jnp.clip(first - dense_layers, 0.0, first)
        moe_second = second - jnp.clip(dense_layers - first, 0.0, second)
    return (
        _PipelineStage(first, moe_first, True, 0),
        _PipelineStage(second, moe_second, False, 1),
    )


def _stage_params(m: ModelSpec, lay: Layout, stage: _PipelineStage):
    """(non-expert, routed-expert) parameters on one device of ``stage``."""
    n = stage.layers
    embed = embedding_params(m) if stage.embedding else 0.0
    if m.kind == "mlp":
        return n * layer_params(m) / lay.tp, jnp.zeros(())
    mlp_dense = dense_layer_params(m)
    if m.moe:
        n_moe = stage.moe_layers
        routed_all = m.num_experts * expert_params(m)
        moe_non_routed = mlp_dense - _dense_mlp(m) + m.hidden_size * m.num_experts
        moe_non_routed = moe_non_routed + m.shared_experts * expert_params(m)
        dense = (n - n_moe) * mlp_dense + n_moe * moe_non_routed + embed
        experts = n_moe * routed_all / (lay.ep * lay.etp)
    else:
        dense = n * mlp_dense + embed
        experts = jnp.zeros(())
    if stage.embedding:
        # with a single stage the output head (if untied) and final norm live here too
        dense = dense + where(lay.pp <= 1, head_params(m), 0.0)
    return dense / lay.tp, experts


def _dense_mlp(m: ModelSpec):
    h, f, g = m.hidden_size, m.ffn_hidden_size, 1.0 + m.gated_mlp
    return h * f * g + f * h + m.bias * (f * g + h)


def stage_params(m: ModelSpec, lay: Layout) -> Float[Array, ""]:
    """Parameters held by one device of the first stage (dense and expert parts)."""
    dense, experts = stage_params_split(m, lay)
    return dense + experts


def grad_bytes_per_param(s: Strategy) -> Float[Array, ""]:
    """Bytes of an accumulated (and reduced) gradient element: 4 in fp32, or when the stack
    reduces in fp32 (``grad_reduce_fp32``; automatic: for bf16, fp8 and fp4, Megatron-Core's
    rule),
    else 2."""
    dtype = s.memory.dtype
    full = (dtype == Dtype.FP32) | (dtype == Dtype.TF32)
    fp32 = s.stack.grad_reduce_fp32
    if fp32 is None:
        fp32 = BY_NAME["grad_reduce_fp32"].derive({"dtype": dtype})
    return where(full | fp32, 4.0, 2.0)


def model_state_bytes_per_param(
    dtype_code,
) -> tuple[Float[Array, ""], Float[Array, ""], Float[Array, ""]]:
    """(weights, gradients, optimiser) bytes per parameter: 2/2/12 mixed, 4/4/8 in fp32/tf32
    (gradients before :func:`grad_bytes_per_param`'s fp32 accumulation)."""
    full = (dtype_code == Dtype.FP32) | (dtype_code == Dtype.TF32)
    return (where(full, 4.0, 2.0), where(full, 4.0, 2.0), where(full, 8.0, 12.0))


def shard_group(lay: Layout, mem: MemoryPlan) -> Float[Array, ""]:
    """Ranks a dense parameter's ZeRO shards spread over: dp·cp, or ``shard_size`` (HSDP)."""
    dpc = lay.dp * lay.cp
    hsdp = (mem.zero_stage == ZeroStage.PARAMETERS) & (mem.shard_size > 0)
    return where(hsdp, mem.shard_size, dpc)


def expert_data_parallel(lay: Layout) -> Float[Array, ""]:
    """Replicas of each expert shard: ``dp·cp·tp / (ep·etp)`` (Megatron-Core's expert DP)."""
    return jnp.maximum(lay.dp * lay.cp * lay.tp / (lay.ep * lay.etp), 1.0)


def _layer_elements(m: ModelSpec):
    """(replicated, tp-split, dense-MLP, s²) activation terms of one layer, in 16-bit
    ``s·b·h`` units."""
    h = m.hidden_size
    att = attention_shape(m)
    drop = m.dropout
    # norm inputs (2 x 2), QKV-GEMM and fc1 inputs (2 + 2), dropout masks (1 + 1)
    replicated = 8.0 + 2.0 * drop
    split = 2.0 * (att.q_dim + att.kv_exchanged + att.v_dim) / h  # Q, K, V, attention output
    g = 1.0 + m.gated_mlp
    mlp = 2.0 * m.ffn_hidden_size * (g + 1.0) / h  # fc1 outputs and the activation's output
    # softmax output (2), and with dropout its mask (1) and output (2), per a·s/h
    scores = (2.0 + 3.0 * drop) * m.num_heads * m.seq_len / h
    return replicated, split, mlp, scores


def activation_bytes_per_layer(m: ModelSpec, s: Strategy, *, moe_layer=False) -> Float[Array, ""]:
    """Activation bytes of one layer for one microbatch (module docstring; for a GPT layer,
    exactly Korthikanti et al. 2022 §4's ``s·b·h·(34 + 5·a·s/h)`` family).

    Args:
      m: model dimensions.
      s: one strategy (its recomputation mode applies to every layer here).
      moe_layer: count an MoE layer's MLP block (:func:`perfmodel.step.moe.moe_activation_bytes`)
        instead of the dense MLP.

    Returns:
      Bytes on one device.
    """
    return _activation_bytes(m, s, moe_layer)[0]


def _activation_bytes(m: ModelSpec, s: Strategy, moe_layer: bool):
    """(bytes kept under the strategy's recomputation, bytes kept without recomputation)."""
    lay, bat, mem = s.layout, s.batching, s.memory
    act_b = activation_bytes(mem.dtype)
    scale = act_b / 2.0  # the counts are of 16-bit activations
    b, t = bat.micro_batch_size, lay.tp
    if m.kind == "mlp":
        # each linear layer keeps its input (act_b bytes) and a 1-byte ReLU mask
        width = (m.input_size + (m.num_layers - 1.0) * m.hidden_size) / m.num_layers
        kept = b * width * (act_b + 1.0) / t
        return kept, kept
    sbh = m.seq_len / lay.cp * b * m.hidden_size
    replicated, split, mlp, scores = _layer_elements(m)
    # a fused attention kernel keeps none of the s² tensors (only a row statistic of a·s·b
    # floats, left out here)
    attn = scores if stores_scores(s.stack) else 0.0
    if moe_layer:
        moe = moe_activation_bytes(m, b, t, lay.cp, lay.moe_imbalance, act_b) / scale
        mlp_elems = moe / sbh  # already per device
        mlp_split = 0.0
    else:
        mlp_elems, mlp_split = 0.0, mlp
    rep = where(mem.sequence_parallel > 0, t, 1.0)
    none_ = sbh * (replicated / rep + (split + mlp_split + attn) / t + mlp_elems)
    # selective recomputation drops the s² tensors and what the stack's recompute modules
    # discard (exactly 0 without them: perfmodel.step.recompute)
    saved = saved_elements(m, s, act_b, moe_layer=moe_layer)
    selective = sbh * (
        (replicated - saved.replicated) / rep
        + (split + mlp_split - saved.split) / t
        + (mlp_elems - saved.moe_bytes / scale / sbh)
    )
    full = 2.0 * sbh / rep
    per_layer = where(
        mem.recompute == Recompute.FULL,
        full,
        where(mem.recompute == Recompute.SELECTIVE, selective, none_),
    )
    return per_layer * scale, none_ * scale


class _StageActivations(NamedTuple):
    kept: Float[Array, ""]  # one microbatch's activations on the busiest stage
    working: Float[Array, ""]  # what full recomputation adds at its peak


def _busiest_stage(m: ModelSpec, lay: Layout) -> _PipelineStage:
    """``ceil(L/pp)`` layers, as many MoE ones as there are, counted as the first stage."""
    n = layers_per_stage(m, lay)
    return _PipelineStage(n, stage_moe_layers(m, n), True, 0)


class _LayerActivations(NamedTuple):
    """One layer's activation bytes for one microbatch, dense and MoE: what the strategy's
    recomputation keeps, and what it would keep without recomputation."""

    dense_kept: Float[Array, ""]
    dense_all: Float[Array, ""]
    moe_kept: Float[Array, ""]
    moe_all: Float[Array, ""]


def _layer_activations(m: ModelSpec, s: Strategy) -> _LayerActivations:
    dense_kept, dense_all = _activation_bytes(m, s, False)
    if m.kind == "transformer" and m.moe:
        moe_kept, moe_all = _activation_bytes(m, s, True)
    else:
        moe_kept = moe_all = jnp.zeros(())
    return _LayerActivations(dense_kept, dense_all, moe_kept, moe_all)


def _stage_activations(
    m: ModelSpec, s: Strategy, stage: _PipelineStage, per: _LayerActivations | None = None
) -> _StageActivations:
    """Activations one microbatch leaves on ``stage`` (dense and MoE layers, with
    ``recompute_layers`` of them recomputed under full recomputation; 0: all), and the working
    set of full recomputation (:func:`recompute_working_bytes`), from the layers' bytes
    ``per`` (computed here when not given)."""
    mem = s.memory
    per = _layer_activations(m, s) if per is None else per
    n = stage.layers
    full = mem.recompute == Recompute.FULL
    partial = full & (mem.recompute_layers > 0)
    k = where(partial, jnp.minimum(mem.recompute_layers, n), n)
    if m.kind != "transformer":
        return _StageActivations(k * per.dense_kept + (n - k) * per.dense_all, jnp.zeros(()))
    if not m.moe:
        # dense layers only: k recomputed, the rest kept whole
        kept = k * per.dense_kept + (n - k) * per.dense_all
        layer = jnp.maximum(0.0, where(n > 0.0, per.dense_all, 0.0))
        return _StageActivations(kept, where(full, layer, 0.0))
    n_moe = stage.moe_layers
    # the dense layers come first, so they are the first recomputed
    k_dense = jnp.minimum(k, n - n_moe)
    k_moe = k - k_dense
    dense = k_dense * per.dense_kept + (n - n_moe - k_dense) * per.dense_all
    moe = k_moe * per.moe_kept + (n_moe - k_moe) * per.moe_all
    layer = jnp.maximum(where(n_moe > 0, per.moe_all, 0.0), where(n > n_moe, per.dense_all, 0.0))
    return _StageActivations(dense + moe, where(full, layer, 0.0))


def stage_activation_bytes(m: ModelSpec, s: Strategy) -> Float[Array, ""]:
    """Activations one microbatch leaves on the busiest stage: dense and MoE layers, with
    ``recompute_layers`` of them recomputed under full recomputation (0: all)."""
    return _stage_activations(m, s, _busiest_stage(m, s.layout)).kept


def recompute_working_bytes(m: ModelSpec, s: Strategy) -> Float[Array, ""]:
    """What full recomputation adds at its peak: the layer being recomputed holds all its
    activations again while its backward runs (its full, unrecomputed bytes for one
    microbatch: a MoE layer's when the stage has one, else a dense layer's); 0 without full
    recomputation, where every kept tensor is already counted. Chen et al. 2016 (arXiv:
    1604.06174, §3) count the same peak for checkpointed training: the checkpoints plus the
    one segment being recomputed."""
    return _stage_activations(m, s, _busiest_stage(m, s.layout)).working


def in_flight_microbatches(lay: Layout, bat: Batching, rank: int = 0) -> Float[Array, ""]:
    """Microbatches whose activations pipeline rank ``rank`` holds at its peak, by schedule:
    ``pp - r`` under 1F1B (its warm-up forwards plus one), ``pp·(1 + (pp-1-2r)/(pp·v))`` when
    interleaved (Megatron-Core's ``(pp-r-1)·2 + (v-1)·pp`` warm-up chunks plus one, over v
    chunks), all ``m`` under GPipe; never more than the step's microbatches."""
    pp, mb, v = lay.pp, bat.num_microbatches, bat.interleave
    one_f_one_b = jnp.minimum(pp - rank, mb)
    interleaved = jnp.minimum(pp, mb) * (1.0 + (pp - 1.0 - 2.0 * rank) / (pp * v))
    gpipe = mb
    return where(
        pp <= 1,
        1.0,
        where(
            bat.schedule == Schedule.GPIPE,
            gpipe,
            where(bat.schedule == Schedule.INTERLEAVED, interleaved, one_f_one_b),
        ),
    )


class _ModelStates(NamedTuple):
    """Bytes per device of the model states."""

    weights: Float[Array, ""]
    grads: Float[Array, ""]
    optimizer: Float[Array, ""]


def _low_precision_weights(s: Strategy, w_b, p):
    """FP8: Transformer Engine keeps a 1-byte FP8 copy beside the 16-bit weights; with the
    distributed optimizer (ZeRO >= 1) Megatron-Core and NeMo keep the weights in FP8 only
    (``--fp8-param-gather``), the fp32 master copy living in the optimizer state; block and MX
    scales add their bytes, FP4 keeps 4-bit weights and their block scales
    (``fp4_param_gather``); torchao's rowwise casts on the fly and keeps none.

    Returns:
      (bytes per parameter of the weights, bytes of the extra low-precision copy of ``p``
      parameters).
    """
    mem = s.memory
    fp8_copy = 0.0
    part = mem.zero_stage >= ZeroStage.OPTIMIZER
    for dtype, cost in (
        (Dtype.FP8, stack_recipe(s.stack)),
        (Dtype.FP4, stack_recipe(s.stack, fp4=True)),
    ):
        if cost.weight_bytes is None:
            continue
        low = mem.dtype == dtype
        w_b = where(low & part, cost.weight_bytes, w_b)
        fp8_copy = fp8_copy + where(low & ~part, cost.weight_bytes, 0.0) * p
    return w_b, fp8_copy


class _StateBytes(NamedTuple):
    """Bytes per parameter of the model states and how they are sharded, for any stage."""

    weights: Float[Array, ""]  # sharded (or whole) weights
    gathered: Float[Array, ""]  # weights a ZeRO-3 rank holds gathered
    low_precision_copy: Float[Array, ""]  # an extra FP8/FP4 copy
    grads: Float[Array, ""]  # sharded (or whole) gradients
    unsharded_grads: Float[Array, ""]  # gradients kept whole across the step (FSDP2 no-sync)
    optimizer: Float[Array, ""]


def _state_bytes(s: Strategy) -> _StateBytes:
    """Bytes per parameter of each model state (:func:`_model_states`)."""
    mem, stack = s.memory, s.stack
    w_b, _, o_b = model_state_bytes_per_param(mem.dtype)
    g_b = grad_bytes_per_param(s)
    gathered = w_b
    low_copy = 0.0
    if s.scope.fp8:
        w_b, low_copy = _low_precision_weights(s, w_b, 1.0)
    if stack.param_remainders:
        # master weights kept as the 16 low-order bits the bf16 weights lack (Apex/TE
        # ``store_param_remainders``): 2 bytes of the 12 instead of 4
        o_b = where(mem.dtype == Dtype.BF16, o_b - 2.0, o_b)
    if stack.bf16_moments:
        # Adam's momentum and variance in bf16 (Megatron-Core's precision-aware optimizer,
        # ``exp_avg_dtype``/``exp_avg_sq_dtype``): 2 + 2 bytes of the 12 instead of 4 + 4
        o_b = o_b - 4.0
    zero3 = mem.zero_stage == ZeroStage.PARAMETERS
    g_sharded = g_b
    fp32_params = behaviour(s, "fsdp_fp32_params")
    if not is_off(fp32_params):
        # PyTorch FSDP's mixed precision: the sharded parameters are the fp32 master weights
        # the optimizer steps (its 12 bytes), cast to 16 or 8 bits only in the all-gather, so
        # no sharded low-precision copy; their gradients are sharded in the same fp32
        fsdp32 = both(zero3 & (o_b > 8.0), fp32_params)
        w_b = where(fsdp32, 0.0, w_b)
        g_sharded = where(fsdp32, 4.0, g_b)
    unsharded = 0.0
    step_gather = behaviour(s, "fsdp_step_gather")
    if not is_off(step_gather):
        # gradients accumulated unsharded across the step's microbatches (FSDP2 no-sync: in
        # the reduce dtype), reduce-scattered once
        unsharded = where(both(zero3, step_gather), g_b, 0.0)
    return _StateBytes(w_b, gathered, low_copy, g_sharded, unsharded, o_b)


def _model_states(
    m: ModelSpec, s: Strategy, stage: _PipelineStage, per: _StateBytes
) -> _ModelStates:
    """Weights, gradients and optimizer state per device of ``stage``
    (:func:`memory_per_device`), from the bytes per parameter ``per``."""
    lay, mem = s.layout, s.memory
    dense, experts = _stage_params(m, lay, stage)
    p = dense + experts
    z = mem.zero_stage
    group, edp = shard_group(lay, mem), expert_data_parallel(lay)

    def sharded(nbytes, stage):
        return where(z >= stage, dense * nbytes / group + experts * nbytes / edp, p * nbytes)

    zero3 = z == ZeroStage.PARAMETERS
    layer_w = p / jnp.maximum(stage.layers, 1.0)
    # the whole stage stays gathered without resharding, or across microbatches (step gather)
    step_gather = behaviour(s, "fsdp_step_gather")
    whole = either(negate(behaviour(s, "fsdp_reshard")), step_gather)
    gathered = where(whole, p, 2.0 * layer_w) * per.gathered
    weights = (
        sharded(per.weights, ZeroStage.PARAMETERS)
        + where(zero3, gathered, 0.0)
        + per.low_precision_copy * p
    )
    grads = sharded(per.grads, ZeroStage.GRADIENTS) + per.unsharded_grads * p
    return _ModelStates(weights, grads, sharded(per.optimizer, ZeroStage.OPTIMIZER))


def _peak_activations(m: ModelSpec, s: Strategy, stage: _PipelineStage, per: _LayerActivations):
    """Activation bytes of ``stage`` at its peak (:func:`memory_per_device`)."""
    lay, bat = s.layout, s.batching
    held = _stage_activations(m, s, stage, per)
    acts = held.kept * in_flight_microbatches(lay, bat, stage.rank)
    if m.kind == "transformer":
        # the loss's logits at its peak (``logit_bytes`` per logit: 4 for the fused fp32
        # softmax, 4·s·b·V/t, Korthikanti §4.3) when the first stage is also last; they are
        # freed before the layers' backward, where full recomputation holds one layer's
        # activations again, so the peak takes the larger of the two
        logits = (
            behaviour(s, "logit_bytes", float)
            * m.seq_len
            / lay.cp
            * bat.micro_batch_size
            * m.vocab_size
            / lay.tp
        )
        logits = where(lay.pp <= 1, logits, 0.0) if stage.embedding else 0.0
        acts = acts + jnp.maximum(logits, held.working)
    return acts


def memory_per_device(m: ModelSpec, s: Strategy) -> MemoryBreakdown:
    """Bytes per device of the pipeline stage that peaks highest, by part: the first (the
    embedding and the most microbatches in flight) or, when ``pp`` does not divide the layers
    and the first stage is lighter (:func:`end_stage_layers`), the second.

    Model states per parameter from :func:`model_state_bytes_per_param` and
    :func:`grad_bytes_per_param`, each divided by its shard group once ZeRO partitions it
    (Rajbhandari et al. 2020; dense parameters over :func:`shard_group`, experts over
    :func:`expert_data_parallel`); ZeRO-3 also holds the gathered weights of the layers in use
    (two: the current and the prefetched), or of the whole stage when parameters are not
    resharded after the forward (or kept gathered, with unsharded gradients, across the
    microbatches under ``fsdp_step_gather``). Activations from :func:`stage_activation_bytes`
    times the microbatches in flight, plus the loss's logits (``logit_bytes`` each) when one
    stage holds the whole model.

    Args:
      m: model dimensions.
      s: one strategy (scalar leaves; vmap for many).

    Returns:
      A :class:`MemoryBreakdown` in bytes.
    """
    per_layer, per_param = _layer_activations(m, s), _state_bytes(s)
    first, second = (
        _stage_memory(m, s, stage, per_layer, per_param) for stage in _memory_stages(m, s.layout)
    )
    use_second = (s.layout.pp > 1) & (second.total_bytes > first.total_bytes)
    return jax.tree_util.tree_map(lambda a, b: where(use_second, b, a), first, second)


def _stage_memory(m, s, stage, per_layer, per_param) -> MemoryBreakdown:
    """:func:`memory_per_device` of one stage, from the bytes per layer and per parameter that
    every stage shares."""
    states = _model_states(m, s, stage, per_param)
    acts = _peak_activations(m, s, stage, per_layer)
    total = states.weights + states.grads + states.optimizer + acts
    return MemoryBreakdown(
        weights_bytes=states.weights,
        gradients_bytes=states.grads,
        optimizer_bytes=states.optimizer,
        activations_bytes=acts,
        total_bytes=total,
    )
