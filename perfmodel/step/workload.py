"""Kernels of one layer as op classes (FLOPs, HBM bytes, kernel launches) for the roofline.

Counting follows Megatron-LM's GPT layer (Narayanan et al. SC21, §5 and eq. 3): per layer and
microbatch of ``b`` sequences of length ``s``, the forward pass costs ``24·b·s·h² + 4·b·s²·h``
FLOPs with ``ffn = 4h``, generalised to grouped-query and latent attention and gated MLPs.
Bytes are the HBM traffic of each kernel (inputs read, outputs written).

What the stack's attention kernel changes is here and nowhere else (:func:`stores_scores`,
:func:`attention_constants`, :func:`flash_backward_redo` and the attention core's op classes):
a fused, FlashAttention-style kernel (Dao et al. 2022) keeps the ``s²`` scores on chip, skips a
causal mask's upper triangle, runs at its own efficiency, and recomputes the scores in its
backward pass.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from perfmodel.specs.choices import AttentionKernel
from perfmodel.specs.constants import Constants
from perfmodel.specs.hardware import HardwareSpec
from perfmodel.specs.model import ModelSpec, attention_shape, mlp_params
from perfmodel.step.select import where

_F = jnp.float32


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Gemm:
    """The shape of one GEMM of an op class, for wave quantization
    (:func:`perfmodel.step.roofline.wave_efficiency`).

    A weight GEMM ``Y[m×n] = X[m×k]·W[k×n]`` (``training``) runs three GEMMs over a step, each
    with a third of the FLOPs: the forward (output ``m×n``), the input gradient (``m×k``) and
    the weight gradient (``k×n``). A batched kernel (``training`` false: the fused attention
    core) launches ``batch`` independent ``m×n`` problems, one output grid for all passes.
    ``n = 0`` means the columns fit one tile (an attention head).
    """

    m: Float[Array, ""]
    n: Float[Array, ""]
    k: Float[Array, ""]
    share: Float[Array, ""] | float  # of the op class's FLOPs
    batch: Float[Array, ""] | None = None  # None: one problem
    training: bool = jax.tree.static(default=True)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class OpClass:
    """One class of kernels: total FLOPs, total HBM bytes and number of kernels launched, and
    the shapes of its GEMMs (for wave quantization) or the efficiency they were found to have."""

    flops: Float[Array, ""]
    bytes: Float[Array, ""]
    kernels: Float[Array, ""]
    tensor: bool = jax.tree.static(default=True)  # runs on tensor cores (matmul) or not
    # "linear": a weight GEMM (FP8-eligible under Transformer Engine's recipe); "attention":
    # the attention core (Q·Kᵀ, P·V), always 16-bit; "gemm": another 16-bit matmul (the
    # logits); "vector": elementwise kernels
    role: str = jax.tree.static(default="linear")
    # the class's GEMM shapes (empty: none known) and the wave-quantization efficiency found
    # from them on a device (perfmodel.step.roofline.quantized; 1 until then)
    gemms: tuple[Gemm, ...] = ()
    shape_efficiency: Float[Array, ""] | float = 1.0


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LayerOps:
    """Forward-pass kernels of one transformer layer (or one MLP layer) for one microbatch."""

    qkv: OpClass
    attention: OpClass  # Q·Kᵀ and P·V batched matmuls
    softmax: OpClass  # scale, mask, softmax, dropout on the score tensor
    proj: OpClass
    mlp: OpClass
    elementwise: OpClass  # layer norms, residual adds, dropouts, activation function


def _op(flops, nbytes, kernels, tensor=True, role=None, gemms=()) -> OpClass:
    return OpClass(
        flops=jnp.asarray(flops, _F),
        bytes=jnp.asarray(nbytes, _F),
        kernels=jnp.asarray(kernels, _F),
        tensor=tensor,
        role=role or ("linear" if tensor else "vector"),
        gemms=gemms,
    )


def gemm(m, n, k, share=1.0, batch=None, training=True) -> Gemm:
    """A :class:`Gemm` (the dimensions as given, so that one dimension shared by several
    GEMMs is one value; ``batch`` None: one problem)."""
    return Gemm(m=m, n=n, k=k, share=share, batch=batch, training=training)


def stores_scores(stack) -> bool:
    """Whether the stack's attention writes the ``s²`` score tensor to memory: an unfused
    kernel does (and the softmax, mask and dropout are kernels of their own, whose outputs
    selective recomputation drops: Korthikanti et al. 2022 §5); a fused kernel keeps the scores
    on chip (only a row statistic reaches memory)."""
    return not stack.fused_attention


def attention_constants(c: Constants, hw: HardwareSpec, stack) -> Constants:
    """The constants that time the attention core: a fused kernel at ``attention_efficiency_ratio``
    of a GEMM's efficiency (cuDNN's), FlashAttention-2 at the hardware's ``fa2_attention_ratio``
    of that; unfused kernels are GEMMs (``c`` itself)."""
    if stores_scores(stack):
        return c
    eff = c.matmul_efficiency_max * c.attention_efficiency_ratio
    if stack.attention_kernel == AttentionKernel.FA2:
        eff = eff * hw.fa2_attention_ratio
    return dataclasses.replace(c, matmul_efficiency_max=eff)


def flash_backward_redo(attention: OpClass, stack) -> OpClass | None:
    """What a fused kernel's backward pass runs again of the attention core's forward: Q·Kᵀ,
    half of its FLOPs and bytes, inside the backward kernels (no launches of its own). None
    under an unfused kernel, which reads the stored scores instead."""
    if stores_scores(stack):
        return None
    return dataclasses.replace(scaled(attention, 0.5), kernels=jnp.zeros(()))


def scaled(op: OpClass, factor) -> OpClass:
    """The op class ``factor`` times over (FLOPs, bytes and kernels)."""
    return dataclasses.replace(
        op, flops=op.flops * factor, bytes=op.bytes * factor, kernels=op.kernels * factor
    )


def attention_causal_factor(m: ModelSpec, fused_attention: bool) -> Float[Array, ""]:
    """Share of the ``s²`` score work a kernel does: a fused causal kernel skips the masked
    upper triangle (about half: Dao et al. 2022, FlashAttention-2 §3.1.1); an unfused one
    computes the whole square and masks it."""
    if not fused_attention:
        return jnp.ones((), _F)
    return where(m.causal > 0, 0.5, 1.0)


def _mlp_layer_ops(m: ModelSpec, micro_batch, tp, act_bytes) -> LayerOps:
    """The average linear layer of an MLP and its ReLU (no attention, no projections)."""
    B, t, T = act_bytes, tp, micro_batch
    h, L = m.hidden_size, m.num_layers
    w = mlp_params(m) / L  # average weights per layer
    io = (m.input_size + m.output_size + 2.0 * (L - 1.0) * h) / L  # mean in + out width
    out = (m.output_size + (L - 1.0) * h) / L  # mean output width
    zero = _op(0.0, 0.0, 0.0)
    return LayerOps(
        qkv=zero,
        attention=_op(0.0, 0.0, 0.0, role="attention"),
        softmax=_op(0.0, 0.0, 0.0, tensor=False),
        proj=zero,
        mlp=_op(2.0 * T * w / t, B * (T * io + w) / t, 1.0),
        elementwise=_op(T * out / t, B * 2.0 * T * out / t, 1.0, tensor=False),
    )


class _AttentionOps(NamedTuple):
    """The forward op classes of a transformer layer's attention block."""

    qkv: OpClass
    attention: OpClass
    softmax: OpClass
    proj: OpClass


def _attention_ops(
    m: ModelSpec, micro_batch, T, tp, act_bytes, fused_attention, cp
) -> _AttentionOps:
    """The QKV projection, the attention core, its softmax block and the output projection
    (:func:`layer_forward_ops`: split over ``tp``, each rank's ``T = b·s/cp`` queries attending
    to all ``s`` keys; a fused kernel writes no score tensor and runs no softmax kernels). ``T``
    is the caller's value: the GEMMs' shapes share it, so their tile counts are found once."""
    B, t, b = act_bytes, tp, micro_batch
    h, s, a = m.hidden_size, m.seq_len, m.num_heads
    att = attention_shape(m)
    scores = b * (a / t) * (s / cp) * s  # elements of the attention-score tensor per device
    unfused = 0.0 if fused_attention else 1.0
    causal = attention_causal_factor(m, fused_attention)
    qkv_out = att.q_dim + att.kv_exchanged
    return _AttentionOps(
        qkv=_op(
            2.0 * T * att.proj_params / t,
            B * (T * h + att.proj_params / t + T * qkv_out / t),
            1.0,
            gemms=(gemm(T, qkv_out / t, h),),
        ),
        attention=_op(
            2.0 * T * s * (att.q_dim + att.v_dim) / t * causal,
            B * (T * (att.q_dim + att.v_dim) / t + b * s * att.kv_exchanged / t)
            + B * 2.0 * scores * unfused,
            1.0 + unfused,
            role="attention",
            # one tile of queries per head and batch (FlashAttention's grid; the unfused
            # kernels' score tiles are as many again along the keys)
            gemms=(gemm(s / cp, 0.0, s, batch=b * a / t, training=False),),
        ),
        softmax=_op(
            5.0 * scores * unfused, B * 5.0 * scores * unfused, 2.0 * unfused, tensor=False
        ),
        proj=_op(
            2.0 * T * att.out_params / t,
            B * (T * att.v_dim / t + att.out_params / t + T * h),
            1.0,
            gemms=(gemm(T, h, att.v_dim / t),),
        ),
    )


def layer_forward_ops(
    m: ModelSpec, micro_batch, tp, sequence_parallel, act_bytes, fused_attention=False, cp=1.0
) -> LayerOps:
    """Forward kernels of one layer for one microbatch on one device (tensor parallel ``tp``,
    context parallel ``cp``).

    Matmuls and attention are split over ``tp`` (Megatron column/row parallelism); layer norms,
    dropouts and residuals are replicated unless ``sequence_parallel`` (Korthikanti et al.
    2022 §4.2.2). Their traffic is 10 reads/writes of ``b·s·h`` (two layer norms and two fused
    bias-dropout-residual kernels) plus the activation function on the ``ffn`` tensor. For an
    MLP, this is the average linear layer plus its ReLU. Projections follow
    :func:`attention_shape` (grouped-query or latent attention); the MLP is the dense one
    (``ffn_hidden_size``; an MoE layer's experts are :func:`perfmodel.step.moe.moe_forward_ops`).
    With ``cp`` ranks, each holds ``s/cp`` queries (load-balanced causal chunks) and attends to
    all ``s`` keys, so every per-token op divides by ``cp``.

    With ``fused_attention`` (FlashAttention) the score tensor never reaches memory: attention
    reads Q, K, V and writes its output in one kernel, and the softmax, mask and dropout happen
    inside it (no separate kernels, no traffic; their few non-matmul FLOPs are not counted); a
    causal fused kernel does half the score work (:func:`attention_causal_factor`).
    """
    if m.kind == "mlp":
        return _mlp_layer_ops(m, micro_batch, tp, act_bytes)
    B, t = act_bytes, tp
    h, f, g = m.hidden_size, m.ffn_hidden_size, 1.0 + m.gated_mlp
    T = micro_batch * m.seq_len / cp  # this rank's tokens
    rep = where(sequence_parallel > 0, t, 1.0)
    attn = _attention_ops(m, micro_batch, T, tp, act_bytes, fused_attention, cp)
    return LayerOps(
        qkv=attn.qkv,
        attention=attn.attention,
        softmax=attn.softmax,
        proj=attn.proj,
        mlp=_op(
            2.0 * T * h * f * (g + 1.0) / t,
            B * (2.0 * T * h + h * f * (g + 1.0) / t + T * f * (g + 1.0) / t),
            2.0,
            # fc1 (gate and up fused when gated) and fc2
            gemms=(gemm(T, g * f / t, h, g / (g + 1.0)), gemm(T, h, f / t, 1.0 / (g + 1.0))),
        ),
        elementwise=_op(
            10.0 * T * h / rep + 8.0 * T * f / t,
            B * (10.0 * T * h / rep + (2.0 + g) * T * f / t),
            8.0,
            tensor=False,
        ),
    )


def logits_forward_ops(m: ModelSpec, micro_batch, tp, act_bytes, cp=1.0) -> tuple[OpClass, OpClass]:
    """Output-layer matmul and the (fp32) cross-entropy kernels for one microbatch.

    The vocabulary is split over ``tp`` (Megatron's vocab-parallel cross entropy). An MLP has
    no separate output layer (its last linear layer is counted among its layers).
    """
    if m.kind == "mlp":
        return _op(0.0, 0.0, 0.0), _op(0.0, 0.0, 0.0, tensor=False)
    T, h, V, t = micro_batch * m.seq_len / cp, m.hidden_size, m.vocab_size, tp
    matmul = _op(
        2.0 * T * h * V / t,
        act_bytes * (T * h + h * V / t + T * V / t),
        1.0,
        role="gemm",
        gemms=(gemm(T, V / t, h),),
    )
    xent = _op(5.0 * T * V / t, 4.0 * 3.0 * T * V / t, 3.0, tensor=False)
    return matmul, xent
