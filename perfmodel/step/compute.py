"""Compute time of the slowest pipeline stage for one microbatch, and its parts.

Contract: :func:`stage_compute` times each op class of a layer by the roofline
(:mod:`perfmodel.step.roofline`), the backward pass twice the forward, plus what recomputation
redoes (the whole forward of ``recompute_layers`` layers, or the attention core: Korthikanti et
al. 2022 §5, and the forward of the stack's ``recompute_modules``: :mod:`perfmodel.step.
recompute`), a fused kernel's backward recomputing Q·Kᵀ (Dao et al. 2022), the FP8/FP4
recipe's cast kernels (:mod:`perfmodel.step.recipes`), and each MoE layer's host-bound time
(``moe_layer_overhead_s``, a stack behaviour that a stack preset sets). The GEMMs' tile and
wave quantization is found once per op class (:func:`perfmodel.step.roofline.quantize_ops`).
What is constant over a compiled program is a Python branch here: the stack's kernels (eager
or fused elementwise ops, the attention kernel, PyTorch's ring merges, the FP8 recipe), the
model's experts (a dense model times no MoE block) and the program's scope (no FP8 or FP4
casts without them).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Float

from perfmodel.specs.choices import AttentionKernel, CpComm, Recompute
from perfmodel.specs.constants import Constants
from perfmodel.specs.hardware import HardwareSpec
from perfmodel.specs.model import ModelSpec, attention_shape, moe_layer_count
from perfmodel.specs.strategy import Strategy
from perfmodel.step.eager import eager_elementwise_bytes
from perfmodel.step.memory import end_stage_layers, layers_per_stage, stage_moe_layers
from perfmodel.step.moe import moe_forward_ops, routed_tokens
from perfmodel.step.precision import Precision
from perfmodel.step.recipes import BLOCK_SCALED, recipe_costs
from perfmodel.step.recompute import redone_ops
from perfmodel.step.roofline import op_time_s, quantize_ops, quantized
from perfmodel.step.select import where
from perfmodel.step.torch_ring import torch_ring_ops
from perfmodel.step.workload import LayerOps, OpClass, layer_forward_ops, logits_forward_ops


class StageCompute(NamedTuple):
    """Compute of the slowest pipeline stage for one microbatch, and its parts."""

    fwd_layer_s: Float[Array, ""]  # the stage's mean layer
    bwd_layer_s: Float[Array, ""]
    stage_mb_s: Float[Array, ""]  # every layer of the stage, logits included, fwd+bwd(+redo)
    num_layers: Float[Array, ""]  # layers on the busiest stage
    dense_layers: Float[Array, ""]  # of which dense
    moe_layers: Float[Array, ""] | float  # of which MoE (0.0 for a dense model)
    recomputed: Float[Array, ""]  # layers recomputed under full recomputation
    attn_fwd_s: Float[Array, ""]  # attention core of one layer, forward
    attn_bwd_s: Float[Array, ""]
    gemm_s: Float[Array, ""]  # GEMM time of the stage (what TP overlap can hide behind)
    hw_flops_mb: Float[Array, ""]  # FLOPs one device executes for a microbatch, whole model


class _Layer(NamedTuple):
    """Forward and backward seconds of one layer kind, and its FLOPs."""

    fwd_s: Float[Array, ""]
    bwd_s: Float[Array, ""]
    flops: Float[Array, ""]


def scaled(op: OpClass, factor) -> OpClass:
    """The op class ``factor`` times over (FLOPs, bytes and kernels)."""
    return dataclasses.replace(
        op, flops=op.flops * factor, bytes=op.bytes * factor, kernels=op.kernels * factor
    )


def timer(hw: HardwareSpec, c: Constants, prec: Precision, s: Strategy):
    """``t(op)``: an op class's seconds by its role (:attr:`~perfmodel.step.workload.OpClass.
    role`).

    Weight GEMMs run at the linear peak, FP8 ones at ``fp8_matmul_efficiency_ratio`` of the
    16-bit efficiency (times ``fp8_block_scaled_gemm_ratio`` under a row-, block- or MX-scaled
    recipe: :data:`~perfmodel.step.recipes.BLOCK_SCALED`), FP4 ones at
    ``fp4_matmul_efficiency_ratio``, saturating at the same time per kernel (the half-size in
    FLOPs scales with the peak); a fused attention kernel at ``attention_efficiency_ratio`` of
    a GEMM's (cuDNN's), and FlashAttention-2 at the hardware's ``fa2_attention_ratio`` of that;
    the logits GEMM at the 16-bit peak; vector kernels at the fp32 peak.
    """
    bw = hw.memory_bandwidth_bytes_per_s
    lin_c = c
    if prec.fp8 is not False:
        peak_ratio = prec.linear_peak / jnp.maximum(prec.half_peak, 1.0)
        ratio = c.fp8_matmul_efficiency_ratio
        if s.stack.fp8_recipe in BLOCK_SCALED:
            ratio = ratio * c.fp8_block_scaled_gemm_ratio
        ratio = where(prec.fp4, c.fp4_matmul_efficiency_ratio, ratio)
        lin_c = dataclasses.replace(
            c,
            matmul_efficiency_max=c.matmul_efficiency_max * where(prec.fp8, ratio, 1.0),
            matmul_half_flops=c.matmul_half_flops * peak_ratio,
        )
    attn_c = c
    if s.stack.fused_attention:
        eff = c.matmul_efficiency_max * c.attention_efficiency_ratio
        if s.stack.attention_kernel == AttentionKernel.FA2:
            eff = eff * hw.fa2_attention_ratio
        attn_c = dataclasses.replace(c, matmul_efficiency_max=eff)

    def t(op: OpClass):
        if op.role == "linear":
            return op_time_s(op, lin_c, prec.linear_peak, prec.vector_peak, bw)
        if op.role == "attention":
            return op_time_s(op, attn_c, prec.half_peak, prec.vector_peak, bw)
        return op_time_s(op, c, prec.half_peak, prec.vector_peak, bw)

    return t


def _fp8_casts(m: ModelSpec, s: Strategy, moe_layer: bool, prec: Precision):
    """The recipe's quantization kernels of one layer (forward, backward): every FP8/FP4 GEMM
    input is cast from 16 bits (and, for the weight gradient, transposed or scaled along the
    other axis) in the forward, every output gradient in the backward, at the stack recipe's
    bytes per element and kernels per tensor (:func:`perfmodel.step.recipes.recipe_costs`);
    a recipe without cached low-precision weights (``rowwise``) casts the layer's weights too,
    on every microbatch."""
    lay, b = s.layout, s.batching.micro_batch_size
    h, tp = m.hidden_size, lay.tp
    T = b * m.seq_len / lay.cp
    att = attention_shape(m)
    f, g = m.ffn_hidden_size, 1.0 + m.gated_mlp
    attn_in = T * (h + att.v_dim / tp)
    attn_out_grads = T * ((att.q_dim + att.kv_exchanged) / tp + h)
    weights = (att.proj_params + att.out_params) / tp
    if moe_layer:
        r = routed_tokens(m, b, tp, lay.cp, lay.moe_imbalance)
        fe = m.moe_ffn_hidden_size
        mlp_in = r * (h + fe) + T * m.shared_experts * fe / tp
        mlp_out_grads = r * (fe * g + h) + T * m.shared_experts * fe * g / tp
        local = jnp.maximum(m.num_experts / lay.ep, 1.0)
        weights = weights + (local + m.shared_experts / tp) * h * fe * (g + 1.0)
    else:
        mlp_in = T * (h + f / tp)
        mlp_out_grads = T * (f * g / tp + h)
        weights = weights + h * f * (g + 1.0) / tp
    c8 = recipe_costs(s.stack.fp8_recipe)
    c4 = recipe_costs(s.stack.fp8_recipe, fp4=True)
    per_elem = where(prec.fp4, c4.cast_bytes, c8.cast_bytes)
    kernels = 4.0 * where(prec.fp4, c4.cast_kernels, c8.cast_kernels)
    fwd_elems = attn_in + mlp_in
    if c8.dynamic_weights:
        fwd_elems = fwd_elems + weights
    bwd_elems = attn_out_grads + mlp_out_grads
    return (
        OpClass(fwd_elems, fwd_elems * per_elem, kernels, tensor=False, role="vector"),
        OpClass(bwd_elems, bwd_elems * per_elem, kernels, tensor=False, role="vector"),
    )


def layer_ops(
    m: ModelSpec, s: Strategy, act_b, hw: HardwareSpec | None = None, tiles=None
) -> LayerOps:
    """The forward op classes of one layer under the strategy and its stack (the elementwise
    class as PyTorch eager mode's separate kernels when the stack runs eager:
    :mod:`perfmodel.step.eager`; the same FLOPs, more bytes and kernels), their GEMMs' wave
    quantization found on ``hw`` when it is given (:func:`perfmodel.step.roofline.quantized`)."""
    lay, bat, mem = s.layout, s.batching, s.memory
    ops = layer_forward_ops(
        m,
        bat.micro_batch_size,
        lay.tp,
        mem.sequence_parallel,
        act_b,
        s.stack.fused_attention,
        lay.cp,
    )
    if hw is not None:
        qkv, attention, proj, mlp = quantize_ops(
            (ops.qkv, ops.attention, ops.proj, ops.mlp), hw, tiles
        )
        ops = dataclasses.replace(ops, qkv=qkv, attention=attention, proj=proj, mlp=mlp)
    if not s.stack.eager or m.kind != "transformer":
        return ops
    nbytes, kernels = eager_elementwise_bytes(
        m, bat.micro_batch_size, lay.tp, mem.sequence_parallel, act_b, lay.cp
    )
    ew = dataclasses.replace(ops.elementwise, bytes=nbytes, kernels=kernels)
    return dataclasses.replace(ops, elementwise=ew)


class _Times(NamedTuple):
    """Seconds of each forward op class of a layer, each timed once."""

    qkv: Float[Array, ""]
    attention: Float[Array, ""]
    softmax: Float[Array, ""]
    proj: Float[Array, ""]
    mlp: Float[Array, ""]
    elementwise: Float[Array, ""]


def _attention(m: ModelSpec, s: Strategy, ops: LayerOps, t, act_b):
    """Each op class's forward seconds, the (forward, backward) seconds of a layer's attention
    block, the core's alone, and the FLOPs a fused kernel's backward recomputes: Q·Kᵀ, half of
    the attention's forward. A backward op class is twice its forward (the same kernels, each
    twice the work: ``t(2·op) = 2·t(op)`` exactly, so it is timed once)."""
    attn_classes = (ops.qkv, ops.attention, ops.softmax, ops.proj, ops.elementwise)
    ts = _Times(
        qkv=t(ops.qkv),
        attention=t(ops.attention),
        softmax=t(ops.softmax),
        proj=t(ops.proj),
        mlp=t(ops.mlp),
        elementwise=t(ops.elementwise),
    )
    attn_ts = (ts.qkv, ts.attention, ts.softmax, ts.proj, ts.elementwise)
    fwd = sum(attn_ts)
    bwd = sum(2.0 * x for x in attn_ts)
    core_bwd = 2.0 * ts.attention
    fa_flops = 0.0
    if s.stack.fused_attention:
        fa_redo = dataclasses.replace(scaled(ops.attention, 0.5), kernels=jnp.zeros(()))
        fa_redo_s = t(fa_redo)
        bwd, core_bwd, fa_flops = bwd + fa_redo_s, core_bwd + fa_redo_s, fa_redo.flops
    if s.scope.cp and s.stack.cp_comm == CpComm.TORCH and m.kind == "transformer":
        # PyTorch's ring attention merges partial outputs and gradients on the compute stream
        ring_f, ring_b = torch_ring_ops(m, s.layout, s.batching, s.stack.eager, act_b)
        fwd, bwd = fwd + t(ring_f), bwd + t(ring_b)
    flops = sum(op.flops for op in attn_classes)
    return ts, fwd, bwd, core_bwd, fa_flops, flops


def _moe_block(m: ModelSpec, s: Strategy, t, act_b, hw=None, tiles=None):
    """An MoE layer's MLP block: its op classes (the GEMMs wave-quantized on ``hw``), its
    (forward, backward) seconds and FLOPs."""
    lay = s.layout
    ops = moe_forward_ops(
        m, s.batching.micro_batch_size, lay.tp, lay.cp, lay.ep, lay.moe_imbalance, act_b
    )
    if hw is not None:
        experts, shared = quantize_ops((ops.experts, ops.shared), hw, tiles)
        ops = ops._replace(experts=experts, shared=shared)
    classes = (ops.router, ops.experts, ops.shared, ops.elementwise)
    fwd = sum(t(op) for op in classes)
    # timed again at twice the work, not doubled: a layer without shared experts still reads
    # its tokens in that class with no kernel, so t(2·op) is not exactly 2·t(op) there
    bwd = sum(t(scaled(op, 2.0)) for op in classes)
    return ops, _Layer(fwd, bwd, sum(op.flops for op in classes))


def _stage_arrangement(m: ModelSpec, s: Strategy):
    """Layers of the busiest, first and last stages, MoE ones among them, and the layers
    recomputed under full recomputation (``recompute_layers``; 0: all)."""
    lay, mem = s.layout, s.memory
    n = layers_per_stage(m, lay)
    first, last = end_stage_layers(m, lay)
    full = mem.recompute == Recompute.FULL
    partial = where(mem.recompute_layers > 0, jnp.minimum(mem.recompute_layers, n), n)
    k = where(full, partial, 0.0)
    return n, first, last, k, full


def stage_compute(
    m: ModelSpec,
    s: Strategy,
    c: Constants,
    t,
    prec: Precision,
    ops: LayerOps,
    hw=None,
    tiles=None,
) -> StageCompute:
    """Compute of the slowest stage for one microbatch (module docstring). Dense and MoE layers
    are timed apart; the busiest stage holds ``ceil(L/pp)`` layers, or the lighter first/last
    stage with the embedding or the logits when that is slower
    (:func:`perfmodel.step.memory.end_stage_layers`). With ``hw`` the logits' and experts'
    GEMMs are wave-quantized on it (``ops`` already are: :func:`layer_ops`)."""
    act_b, mem = prec.act_bytes, s.memory
    fused = s.stack.fused_attention
    ts, attn_fwd, attn_bwd, core_bwd, fa_flops, attn_flops = _attention(m, s, ops, t, act_b)
    core_fwd = ts.attention
    selective = False if fused else mem.recompute == Recompute.SELECTIVE
    sel_redo = 0.0 if selective is False else where(selective, ts.attention + ts.softmax, 0.0)
    redone = redone_ops(m, s, ops, act_b)
    redo_attn = 0.0 if redone is None else sum(t(op) for op in redone.attention)
    redo_dense = 0.0 if redone is None else redo_attn + sum(t(op) for op in redone.dense)
    cast_dense = 0.0
    if prec.fp8 is not False:
        casts = _fp8_casts(m, s, False, prec)
        cast_dense = where(prec.fp8, t(casts[0]) + t(casts[1]), 0.0)
    dense_f = attn_fwd + ts.mlp
    dense_b = attn_bwd + 2.0 * ts.mlp + cast_dense + redo_dense
    n, first, last, k, full = _stage_arrangement(m, s)
    logits_mm, xent = logits_forward_ops(
        m, s.batching.micro_batch_size, s.layout.tp, act_b, s.layout.cp
    )
    if hw is not None:
        logits_mm = quantized(logits_mm, hw, tiles)
    logits_mb = t(scaled(logits_mm, 3.0)) + t(scaled(xent, 2.0))
    gemm_dense = 3.0 * (ts.qkv + ts.proj + ts.mlp)
    redo = 0.0 if selective is False else where(selective, ops.attention.flops, 0.0)
    redo_gemm = 0.0 if redone is None else sum(op.flops for op in redone.attention if op.tensor)
    frac = where(full, k / jnp.maximum(n, 1.0), 0.0)
    dense_layer_flops = (3.0 + frac) * (attn_flops + ops.mlp.flops) + redo + redo_gemm
    if redone is not None:
        dense_layer_flops = dense_layer_flops + redone.dense[0].flops
    if not m.moe:

        def stage(nd, kd):
            return nd * (dense_f + dense_b + sel_redo) + kd * dense_f

        middle = stage(n, k)
        last_stage = stage(last, jnp.minimum(k, last)) + logits_mb
        first_stage = stage(first, jnp.minimum(k, first))
        hw_flops = m.num_layers * dense_layer_flops
        gemms = n * gemm_dense
        mean_f, mean_b = n * dense_f / jnp.maximum(n, 1.0), n * dense_b / jnp.maximum(n, 1.0)
        n_dense, n_moe = n, 0.0
    else:
        moe_ops, moe = _moe_block(m, s, t, act_b, hw, tiles)
        cast_moe = 0.0
        if prec.fp8 is not False:
            casts = _fp8_casts(m, s, True, prec)
            cast_moe = where(prec.fp8, t(casts[0]) + t(casts[1]), 0.0)
        redo_moe = 0.0 if redone is None else redo_attn + sum(t(op) for op in redone.moe)
        # the layer's host-bound time (``moe_layer_overhead_s``): a third in the forward, two
        # thirds in the backward
        host = c.moe_layer_overhead_s
        moe_f = attn_fwd + moe.fwd_s + host / 3.0
        moe_b = attn_bwd + moe.bwd_s + cast_moe + 2.0 * host / 3.0 + redo_moe
        n_moe = stage_moe_layers(m, n)
        n_dense = n - n_moe

        def stage(nd, nm, kd, km):
            return (
                nd * (dense_f + dense_b + sel_redo)
                + nm * (moe_f + moe_b + sel_redo)
                + kd * dense_f
                + km * moe_f
            )

        k_dense = jnp.minimum(k, n_dense)
        middle = stage(n_dense, n_moe, k_dense, k - k_dense)
        last_moe = jnp.minimum(last, n_moe)
        kl = jnp.minimum(k, last)
        kl_dense = jnp.minimum(kl, last - last_moe)
        last_stage = stage(last - last_moe, last_moe, kl_dense, kl - kl_dense) + logits_mb
        fd = jnp.minimum(first, n_dense)
        first_stage = stage(
            fd + 0.0 * first,
            first - fd,
            jnp.minimum(k, fd),
            jnp.minimum(k, first) - jnp.minimum(k, fd),
        )
        L_moe = moe_layer_count(m)
        moe_layer_flops = (3.0 + frac) * (attn_flops + moe.flops) + redo + redo_gemm
        hw_flops = (m.num_layers - L_moe) * dense_layer_flops + L_moe * moe_layer_flops
        gemms = n_dense * gemm_dense + n_moe * 3.0 * (ts.qkv + ts.proj + t(moe_ops.shared))
        mean_f = (n_dense * dense_f + n_moe * moe_f) / jnp.maximum(n, 1.0)
        mean_b = (n_dense * dense_b + n_moe * moe_b) / jnp.maximum(n, 1.0)
    if fused:
        hw_flops = hw_flops + m.num_layers * fa_flops
    hw_flops = hw_flops + 3.0 * logits_mm.flops
    stage_mb = where(
        s.layout.pp > 1,
        jnp.maximum(jnp.maximum(middle, last_stage), first_stage),
        middle + logits_mb,
    )
    return StageCompute(
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
