"""Compute time of the slowest pipeline stage for one microbatch, and its parts.

Contract: :func:`stage_compute` arranges a model's layers, each timed by
:mod:`perfmodel.step.layer_time` (the roofline per op class, backward, recomputation within the
layer, FP8/FP4 casts, an MoE layer's host-bound time), on the pipeline stages: the busiest
stage holds ``ceil(L/pp)`` layers, the first and last ones the embedding or the logits and the
loss; full recomputation redoes the whole forward of ``recompute_layers`` layers (Korthikanti
et al. 2022 §5). What is constant over a compiled program is a Python branch here: the model's
experts (a dense model times no MoE block) and the stack's attention kernel.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Float

from perfmodel.specs.choices import Recompute
from perfmodel.specs.constants import Constants
from perfmodel.specs.model import ModelSpec, moe_layer_count
from perfmodel.specs.strategy import Strategy
from perfmodel.step.layer_time import (
    LayerTime,
    attention_block,
    dense_layer,
    moe_layer,
    recomputation,
)
from perfmodel.step.memory import end_stage_layers, layers_per_stage, stage_moe_layers
from perfmodel.step.precision import Precision
from perfmodel.step.roofline import quantized
from perfmodel.step.select import where
from perfmodel.step.workload import LayerOps, logits_forward_ops, scaled, stores_scores


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


class _Arrangement(NamedTuple):
    """Layers of the busiest, first and last stages, and those full recomputation redoes."""

    n: Float[Array, ""]
    first: Float[Array, ""]
    last: Float[Array, ""]
    k: Float[Array, ""]
    full: Float[Array, ""]  # full recomputation (a boolean)


def _stage_arrangement(m: ModelSpec, s: Strategy) -> _Arrangement:
    """Layers of the busiest, first and last stages, MoE ones among them, and the layers
    recomputed under full recomputation (``recompute_layers``; 0: all)."""
    lay, mem = s.layout, s.memory
    n = layers_per_stage(m, lay)
    first, last = end_stage_layers(m, lay)
    full = mem.recompute == Recompute.FULL
    partial = where(mem.recompute_layers > 0, jnp.minimum(mem.recompute_layers, n), n)
    k = where(full, partial, 0.0)
    return _Arrangement(n, first, last, k, full)


def _logits(m: ModelSpec, s: Strategy, t, act_b, hw, tiles):
    """The logits GEMM (wave-quantized on ``hw`` when given) and the seconds of the loss for
    one microbatch: that GEMM's forward and backward, the cross entropy's."""
    lay = s.layout
    logits_mm, xent = logits_forward_ops(m, s.batching.micro_batch_size, lay.tp, act_b, lay.cp)
    if hw is not None:
        logits_mm = quantized(logits_mm, hw, tiles)
    return logits_mm, t(scaled(logits_mm, 3.0)) + t(scaled(xent, 2.0))


class _Stages(NamedTuple):
    """One microbatch on the middle, last and first stages, and the stage's totals."""

    middle_s: Float[Array, ""]
    last_s: Float[Array, ""]  # the logits included
    first_s: Float[Array, ""]
    hw_flops: Float[Array, ""]  # every layer of the model, before the logits and fused redo
    gemm_s: Float[Array, ""]
    mean_fwd_s: Float[Array, ""]
    mean_bwd_s: Float[Array, ""]
    dense_layers: Float[Array, ""]
    moe_layers: Float[Array, ""] | float


def _dense_stages(m: ModelSpec, arr: _Arrangement, dense: LayerTime, sel_redo, gemm_s, logits_s):
    """The stages of a model without experts (``gemm_s``: a layer's GEMM seconds, fwd+bwd)."""
    n, first, last, k = arr.n, arr.first, arr.last, arr.k

    def stage(nd, kd):
        return nd * (dense.fwd_s + dense.bwd_s + sel_redo) + kd * dense.fwd_s

    return _Stages(
        middle_s=stage(n, k),
        last_s=stage(last, jnp.minimum(k, last)) + logits_s,
        first_s=stage(first, jnp.minimum(k, first)),
        hw_flops=m.num_layers * dense.flops,
        gemm_s=n * gemm_s,
        mean_fwd_s=n * dense.fwd_s / jnp.maximum(n, 1.0),
        mean_bwd_s=n * dense.bwd_s / jnp.maximum(n, 1.0),
        dense_layers=n,
        moe_layers=0.0,
    )


def _moe_stages(m, arr: _Arrangement, dense: LayerTime, moe: LayerTime, sel_redo, gemms, logits_s):
    """The stages of a model with experts: each stage's MoE layers are the last of it
    (:func:`perfmodel.step.memory.stage_moe_layers`), and full recomputation redoes its dense
    layers first. ``gemms``: (a dense layer's GEMM seconds fwd+bwd, an MoE layer's forward)."""
    n, first, last, k = arr.n, arr.first, arr.last, arr.k
    gemm_dense, gemm_moe = gemms
    n_moe = stage_moe_layers(m, n)
    n_dense = n - n_moe

    def stage(nd, nm, kd, km):
        return (
            nd * (dense.fwd_s + dense.bwd_s + sel_redo)
            + nm * (moe.fwd_s + moe.bwd_s + sel_redo)
            + kd * dense.fwd_s
            + km * moe.fwd_s
        )

    k_dense = jnp.minimum(k, n_dense)
    last_moe = jnp.minimum(last, n_moe)
    kl = jnp.minimum(k, last)
    kl_dense = jnp.minimum(kl, last - last_moe)
    fd = jnp.minimum(first, n_dense)
    L_moe = moe_layer_count(m)
    return _Stages(
        middle_s=stage(n_dense, n_moe, k_dense, k - k_dense),
        last_s=stage(last - last_moe, last_moe, kl_dense, kl - kl_dense) + logits_s,
        first_s=stage(
            fd + 0.0 * first,
            first - fd,
            jnp.minimum(k, fd),
            jnp.minimum(k, first) - jnp.minimum(k, fd),
        ),
        hw_flops=(m.num_layers - L_moe) * dense.flops + L_moe * moe.flops,
        gemm_s=n_dense * gemm_dense + n_moe * 3.0 * gemm_moe,
        mean_fwd_s=(n_dense * dense.fwd_s + n_moe * moe.fwd_s) / jnp.maximum(n, 1.0),
        mean_bwd_s=(n_dense * dense.bwd_s + n_moe * moe.bwd_s) / jnp.maximum(n, 1.0),
        dense_layers=n_dense,
        moe_layers=n_moe,
    )


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
    act_b = prec.act_bytes
    attn = attention_block(m, s, ops, t, act_b)
    redo = recomputation(m, s, t, ops, attn.ts, act_b)
    arr = _stage_arrangement(m, s)
    frac = where(arr.full, arr.k / jnp.maximum(arr.n, 1.0), 0.0)
    dense = dense_layer(m, s, t, prec, ops, attn, redo, frac)
    logits_mm, logits_s = _logits(m, s, t, act_b, hw, tiles)
    gemm_dense = 3.0 * (attn.ts.qkv + attn.ts.proj + attn.ts.mlp)
    if not m.moe:
        st = _dense_stages(m, arr, dense, redo.selective_s, gemm_dense, logits_s)
    else:
        moe, gemm_moe = moe_layer(m, s, c, t, prec, attn, redo, frac, hw, tiles)
        st = _moe_stages(m, arr, dense, moe, redo.selective_s, (gemm_dense, gemm_moe), logits_s)
    hw_flops = st.hw_flops
    if not stores_scores(s.stack):  # a fused kernel's backward redoes Q·Kᵀ
        hw_flops = hw_flops + m.num_layers * attn.fa_flops
    hw_flops = hw_flops + 3.0 * logits_mm.flops
    stage_mb = where(
        s.layout.pp > 1,
        jnp.maximum(jnp.maximum(st.middle_s, st.last_s), st.first_s),
        st.middle_s + logits_s,
    )
    return StageCompute(
        fwd_layer_s=st.mean_fwd_s,
        bwd_layer_s=st.mean_bwd_s,
        stage_mb_s=stage_mb,
        num_layers=arr.n,
        dense_layers=st.dense_layers,
        moe_layers=st.moe_layers,
        recomputed=arr.k,
        attn_fwd_s=attn.ts.attention,
        attn_bwd_s=attn.core_bwd_s,
        gemm_s=st.gemm_s,
        hw_flops_mb=hw_flops,
    )
