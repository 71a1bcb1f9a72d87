"""Seconds and FLOPs of one layer of each kind (dense, MoE) for one microbatch.

Contract: each op class of a layer is timed by the roofline (:mod:`perfmodel.step.roofline`) at
the peak and efficiency of its role (:func:`timer`), the backward pass twice the forward, plus
what recomputation redoes within the layer (the attention core under selective recomputation:
Korthikanti et al. 2022 §5, and the forward of the stack's ``recompute_modules``:
:mod:`perfmodel.step.recompute`), a fused kernel's backward recomputing Q·Kᵀ (Dao et al. 2022),
the FP8/FP4 recipe's cast kernels (:mod:`perfmodel.step.recipes`), and each MoE layer's
host-bound time (``moe_layer_overhead_s``, a stack behaviour that a stack preset sets). The
GEMMs' tile and wave quantization is found once per op class
(:func:`perfmodel.step.roofline.quantize_ops`). What is constant over a compiled program is a
Python branch here: the stack's kernels (eager or fused elementwise ops, the attention kernel,
PyTorch's ring merges, the FP8 recipe) and the program's scope (no FP8 or FP4 casts without
them). :mod:`perfmodel.step.compute` arranges the layers on the pipeline stages.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Float

from perfmodel.specs.choices import CpComm, Recompute
from perfmodel.specs.constants import Constants
from perfmodel.specs.hardware import HardwareSpec
from perfmodel.specs.model import ModelSpec, attention_shape
from perfmodel.specs.strategy import Strategy
from perfmodel.step.eager import eager_elementwise_bytes
from perfmodel.step.moe import moe_forward_ops, routed_tokens
from perfmodel.step.precision import Precision
from perfmodel.step.recipes import stack_recipe
from perfmodel.step.recompute import Redone, redone_ops
from perfmodel.step.roofline import op_time_s, quantize_ops
from perfmodel.step.select import behaviour, is_off, where
from perfmodel.step.torch_ring import torch_ring_ops
from perfmodel.step.workload import (
    LayerOps,
    OpClass,
    attention_constants,
    flash_backward_redo,
    layer_forward_ops,
    scaled,
    stores_scores,
)


class LayerTime(NamedTuple):
    """Forward and backward seconds of one layer kind, and its FLOPs."""

    fwd_s: Float[Array, ""]
    bwd_s: Float[Array, ""]
    flops: Float[Array, ""]


def timer(hw: HardwareSpec, c: Constants, prec: Precision, s: Strategy):
    """``t(op)``: an op class's seconds by its role (:attr:`~perfmodel.step.workload.OpClass.
    role`).

    Weight GEMMs run at the linear peak, FP8 ones at ``fp8_matmul_efficiency_ratio`` of the
    16-bit efficiency (times ``fp8_block_scaled_gemm_ratio`` under a row-, block- or MX-scaled
    recipe: ``RecipeCost.block_scaled``), FP4 ones at
    ``fp4_matmul_efficiency_ratio``, saturating at the same time per kernel (the half-size in
    FLOPs scales with the peak); the attention core at the stack's kernel's efficiency
    (:func:`~perfmodel.step.workload.attention_constants`); the logits GEMM at the 16-bit
    peak; vector kernels at the fp32 peak.
    """
    bw = hw.memory_bandwidth_bytes_per_s
    lin_c = c
    if prec.fp8 is not False:
        peak_ratio = prec.linear_peak / jnp.maximum(prec.half_peak, 1.0)
        ratio = c.fp8_matmul_efficiency_ratio
        if stack_recipe(s.stack).block_scaled:
            ratio = ratio * c.fp8_block_scaled_gemm_ratio
        ratio = where(prec.fp4, c.fp4_matmul_efficiency_ratio, ratio)
        lin_c = dataclasses.replace(
            c,
            matmul_efficiency_max=c.matmul_efficiency_max * where(prec.fp8, ratio, 1.0),
            matmul_half_flops=c.matmul_half_flops * peak_ratio,
        )
    attn_c = attention_constants(c, hw, s.stack)

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
    bytes per element and kernels per tensor (:func:`perfmodel.step.recipes.stack_recipe`);
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
    c8 = stack_recipe(s.stack)
    c4 = stack_recipe(s.stack, fp4=True)
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
        not stores_scores(s.stack),
        lay.cp,
    )
    if hw is not None:
        qkv, attention, proj, mlp = quantize_ops(
            (ops.qkv, ops.attention, ops.proj, ops.mlp), hw, tiles
        )
        ops = dataclasses.replace(ops, qkv=qkv, attention=attention, proj=proj, mlp=mlp)
    eager = behaviour(s, "eager")
    if is_off(eager) or m.kind != "transformer":
        return ops
    nbytes, kernels = eager_elementwise_bytes(
        m, bat.micro_batch_size, lay.tp, mem.sequence_parallel, act_b, lay.cp
    )
    fused = ops.elementwise
    ew = dataclasses.replace(
        fused, bytes=where(eager, nbytes, fused.bytes), kernels=where(eager, kernels, fused.kernels)
    )
    return dataclasses.replace(ops, elementwise=ew)


class OpTimes(NamedTuple):
    """Seconds of each forward op class of a layer, each timed once."""

    qkv: Float[Array, ""]
    attention: Float[Array, ""]
    softmax: Float[Array, ""]
    proj: Float[Array, ""]
    mlp: Float[Array, ""]
    elementwise: Float[Array, ""]


class AttentionBlock(NamedTuple):
    """A layer's attention block, the same in a dense and an MoE layer."""

    ts: OpTimes  # each forward op class of the layer, timed once
    fwd_s: Float[Array, ""]
    bwd_s: Float[Array, ""]
    core_bwd_s: Float[Array, ""]  # the attention core's backward alone
    fa_flops: Float[Array, ""] | float  # what a fused kernel's backward recomputes (0: unfused)
    flops: Float[Array, ""]  # the block's forward FLOPs


def attention_block(m: ModelSpec, s: Strategy, ops: LayerOps, t, act_b) -> AttentionBlock:
    """Each op class's forward seconds, the (forward, backward) seconds of a layer's attention
    block, the core's alone, and the FLOPs a fused kernel's backward recomputes: Q·Kᵀ, half of
    the attention's forward. A backward op class is twice its forward (the same kernels, each
    twice the work: ``t(2·op) = 2·t(op)`` exactly, so it is timed once)."""
    attn_classes = (ops.qkv, ops.attention, ops.softmax, ops.proj, ops.elementwise)
    ts = OpTimes(
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
    fa_redo = flash_backward_redo(ops.attention, s.stack)
    if fa_redo is not None:
        fa_redo_s = t(fa_redo)
        bwd, core_bwd, fa_flops = bwd + fa_redo_s, core_bwd + fa_redo_s, fa_redo.flops
    if s.scope.cp and s.stack.cp_comm == CpComm.TORCH and m.kind == "transformer":
        # PyTorch's ring attention merges partial outputs and gradients on the compute stream
        ring_f, ring_b = torch_ring_ops(m, s.layout, s.batching, behaviour(s, "eager"), act_b)
        fwd, bwd = fwd + t(ring_f), bwd + t(ring_b)
    flops = sum(op.flops for op in attn_classes)
    return AttentionBlock(ts, fwd, bwd, core_bwd, fa_flops, flops)


class Redo(NamedTuple):
    """What recomputation adds to every layer, whatever its kind (0.0 where nothing is)."""

    selective_s: Float[Array, ""] | float  # the attention core and softmax, selective
    selective_flops: Float[Array, ""] | float
    redone: Redone | None  # the stack's ``recompute_modules`` (None: none)
    attention_s: Float[Array, ""] | float  # of which the attention block's modules, redone
    gemm_flops: Float[Array, ""] | float  # their GEMMs' FLOPs in the attention block


def selective_redoes_attention(stack) -> bool:
    """Whether selective recomputation redoes anything in the attention core: not under a fused
    kernel, which stores no s x s scores to drop (Korthikanti et al. 2022 §5)."""
    return stores_scores(stack)


def recomputation(m: ModelSpec, s: Strategy, t, ops: LayerOps, ts: OpTimes, act_b) -> Redo:
    """Selective recomputation's redo of the attention core and its softmax (nothing under a
    fused kernel, which stores no scores: Korthikanti et al. 2022 §5) and the attention-block
    part of the modules the stack recomputes (:func:`perfmodel.step.recompute.redone_ops`)."""
    redoes = selective_redoes_attention(s.stack)
    selective = s.memory.recompute == Recompute.SELECTIVE if redoes else False
    sel_redo = 0.0 if selective is False else where(selective, ts.attention + ts.softmax, 0.0)
    redone = redone_ops(m, s, ops, act_b)
    redo_attn = 0.0 if redone is None else sum(t(op) for op in redone.attention)
    redo = 0.0 if selective is False else where(selective, ops.attention.flops, 0.0)
    redo_gemm = 0.0 if redone is None else sum(op.flops for op in redone.attention if op.tensor)
    return Redo(sel_redo, redo, redone, redo_attn, redo_gemm)


def _cast_s(m: ModelSpec, s: Strategy, moe_layer: bool, prec: Precision, t):
    """Seconds of one layer's FP8/FP4 cast kernels, forward and backward (:func:`_fp8_casts`;
    0.0 in a program without low-precision GEMMs)."""
    if prec.fp8 is False:
        return 0.0
    casts = _fp8_casts(m, s, moe_layer, prec)
    return where(prec.fp8, t(casts[0]) + t(casts[1]), 0.0)


def dense_layer(m, s, t, prec, ops: LayerOps, attn: AttentionBlock, redo: Redo, frac):
    """A dense layer's forward and backward seconds (the backward with its casts and redone
    modules) and the FLOPs a device runs for it, the forward ``3 + frac`` times over (``frac``:
    the share of layers that full recomputation redoes) plus what recomputation redoes."""
    redone = redo.redone
    redo_dense = 0.0 if redone is None else redo.attention_s + sum(t(op) for op in redone.dense)
    fwd = attn.fwd_s + attn.ts.mlp
    bwd = attn.bwd_s + 2.0 * attn.ts.mlp + _cast_s(m, s, False, prec, t) + redo_dense
    flops = (3.0 + frac) * (attn.flops + ops.mlp.flops) + redo.selective_flops + redo.gemm_flops
    if redone is not None:
        flops = flops + redone.dense[0].flops
    return LayerTime(fwd, bwd, flops)


def moe_layer(m, s, c: Constants, t, prec, attn: AttentionBlock, redo: Redo, frac, hw, tiles):
    """An MoE layer as :func:`dense_layer` a dense one, with its MLP block (:func:`_moe_block`)
    and its host-bound time (``moe_layer_overhead_s``): a third in the forward, two thirds in
    the backward. Also returns the forward seconds of its GEMMs outside the routed experts."""
    moe_ops, moe = _moe_block(m, s, t, prec.act_bytes, hw, tiles)
    redone = redo.redone
    redo_moe = 0.0 if redone is None else redo.attention_s + sum(t(op) for op in redone.moe)
    host = c.moe_layer_overhead_s
    fwd = attn.fwd_s + moe.fwd_s + host / 3.0
    bwd = attn.bwd_s + moe.bwd_s + _cast_s(m, s, True, prec, t) + 2.0 * host / 3.0 + redo_moe
    flops = (3.0 + frac) * (attn.flops + moe.flops) + redo.selective_flops + redo.gemm_flops
    gemm_s = attn.ts.qkv + attn.ts.proj + t(moe_ops.shared)
    return LayerTime(fwd, bwd, flops), gemm_s


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
    return ops, LayerTime(fwd, bwd, sum(op.flops for op in classes))
