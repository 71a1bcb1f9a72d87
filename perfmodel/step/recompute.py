"""Fine-grained selective recomputation (Megatron-Core's ``--recompute-modules``) for one strategy.

Contract: with ``recompute="selective"``, a strategy's ``recompute_modules`` (a sum of
:class:`~perfmodel.specs.choices.RecomputeModule` flags) names the submodules whose outputs the
forward pass discards and the backward pass computes again (Megatron-Core
``TransformerConfig.recompute_modules``: ``layernorm``, ``moe_act`` and ``mla_up_proj`` discard
their outputs, ``mlp`` checkpoints the dense MLP and keeps only its input). This module says
what each saves, in the units of :mod:`perfmodel.step.memory` (16-bit elements of ``s·b·h`` per layer
and microbatch), and what each redoes (the forward ops again, as :class:`OpClass` lists timed by
:mod:`perfmodel.step.step_time`):

- ``layernorm``: the outputs of the input and pre-MLP norms (the QKV GEMM's and fc1's or the
  router's inputs, 2 + 2) are not kept; the norms run again (two memory-bound kernels);
- ``moe_act``: the routed experts' activation outputs (fc2's input, one per routed token);
- ``mlp``: a dense layer's fc1 and activation outputs (an MoE layer's MLP is not touched);
- ``mla_up_proj``: multi-head latent attention's up-projected Q, K and V, keeping the q and kv
  latents and the rope key instead; the up-projection GEMMs run again.
- ``per_op`` (torchtitan's per-op selective checkpointing, ``_apply_ac_to_transformer_block``
  with ``selective_ac_option = "op"``: every matmul's output is saved except every second one,
  and the attention kernel's): a dense layer keeps its input, Q (wq's output), V (wv's), the
  attention output, fc1's gate (w1's) and the MLP's output (w2's): with tp 1 and no dropout
  ``2·(h + q + v + a + f + h)/h`` units where "none" keeps ``8 + 2·(q + k + v + a)/h +
  2·f·(g+1)/h``. K, the output projection and fc1's up half (w3) run again in the backward,
  with the norms and the activation function. An MoE layer's attention is treated the same
  and its MoE block keeps what it keeps without recomputation.

The modules are a stack behaviour (static), so a stack without them compiles none of this; the
flags act only on strategies whose ``recompute`` is selective (a traced test), and every term is
exactly zero elsewhere.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Float

from perfmodel.specs.choices import Recompute, RecomputeModule
from perfmodel.specs.model import ModelSpec, attention_shape
from perfmodel.specs.strategy import Strategy
from perfmodel.step.moe import routed_tokens
from perfmodel.step.select import behaviour, both, is_off, where
from perfmodel.step.workload import OpClass, stores_scores

_ZERO = 0.0


def _names(s: Strategy, module: RecomputeModule):
    """Whether the stack's ``recompute_modules`` name ``module`` (a Python boolean, or traced
    where a program's rows differ)."""
    return behaviour(s, "recompute_modules", lambda v: bool(int(v) & int(module)))


def has_module(s: Strategy, module: RecomputeModule):
    """Whether selective recomputation also redoes ``module``: ``False`` (a Python value, so
    nothing is compiled) when the stack does not name it, else a traced test of the strategy's
    recomputation mode."""
    named = _names(s, module)
    if is_off(named):
        return False
    return both(s.memory.recompute == Recompute.SELECTIVE, named)


def _pick(cond, on, off):
    """``where(cond, on, off)``, or ``off`` when ``cond`` is the Python ``False``."""
    return off if cond is False else where(cond, on, off)


def _mla_latents(m: ModelSpec):
    """Width of what MLA's up-projections read: the q and kv latents and the rope key."""
    return m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim


def mla_up_fraction(m: ModelSpec) -> Float[Array, ""]:
    """Share of the Q/K/V projection GEMMs that are MLA up-projections (0 without MLA)."""
    if not m.mla:
        return jnp.zeros(())
    att = attention_shape(m)
    a = m.num_heads
    qk_hd = m.qk_nope_head_dim + m.qk_rope_head_dim
    q_up = where(m.q_lora_rank > 0, m.q_lora_rank * a * qk_hd, 0.0)
    kv_up = m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim)
    return (q_up + kv_up) / jnp.maximum(att.proj_params, 1.0)


class SavedElements(NamedTuple):
    """Activation elements one layer does not keep (16-bit ``s·b·h`` units, per microbatch)."""

    replicated: Float[Array, ""]  # of the norm/GEMM-input term (divided by tp under SP)
    split: Float[Array, ""]  # of the tp-split attention and dense-MLP terms
    moe_bytes: Float[Array, ""]  # bytes of an MoE layer's routed tensors, per device


def saved_elements(m: ModelSpec, s: Strategy, act_bytes, *, moe_layer: bool) -> SavedElements:
    """What the stack's recompute modules leave out of one layer's activations.

    Args:
      m: model dimensions.
      s: one strategy.
      act_bytes: bytes per activation element.
      moe_layer: the layer's MLP is an MoE block (``mlp`` leaves it, ``moe_act`` applies).

    Returns:
      A :class:`SavedElements` (each exactly 0 when the flag is off).
    """
    h = m.hidden_size
    att = attention_shape(m)
    per_op = has_module(s, RecomputeModule.PER_OP)
    # per-op: of the norm inputs, norm outputs (and dropout masks) the layer input stays, and
    # the MLP's output joins it; of Q, K, V and the attention output, K goes
    replicated = 8.0 + 2.0 * m.dropout
    norm = _pick(
        per_op, replicated - 4.0, _pick(has_module(s, RecomputeModule.LAYERNORM), 4.0, _ZERO)
    )
    up = _ZERO
    if m.mla:
        qkv = 2.0 * (att.q_dim + att.kv_exchanged - _mla_latents(m)) / h
        up = _pick(has_module(s, RecomputeModule.MLA_UP_PROJ), qkv, _ZERO)
    up = _pick(per_op, 2.0 * _k_width(m) / h, up)
    if moe_layer:
        moe = _ZERO
        mod = has_module(s, RecomputeModule.MOE_ACT)
        if mod is not False:
            lay = s.layout
            r = routed_tokens(m, s.batching.micro_batch_size, lay.tp, lay.cp, lay.moe_imbalance)
            moe = where(mod, r * m.moe_ffn_hidden_size * act_bytes, 0.0)
        return SavedElements(replicated=norm, split=up, moe_bytes=moe)
    g = 1.0 + m.gated_mlp
    f = m.ffn_hidden_size
    mlp = _pick(has_module(s, RecomputeModule.MLP), 2.0 * f * (g + 1.0) / h, _ZERO)
    # per-op: of fc1's outputs and the activation output only w1's output stays
    mlp = _pick(per_op, 2.0 * f * g / h, mlp)
    return SavedElements(replicated=norm, split=up + mlp, moe_bytes=_ZERO)


def _k_width(m: ModelSpec):
    """Width of K (``kv_exchanged`` less V): the K projection's output per token."""
    att = attention_shape(m)
    v = m.num_heads * m.v_head_dim if m.mla else att.kv_exchanged / 2.0
    return att.kv_exchanged - v


class Redone(NamedTuple):
    """Forward work the backward pass repeats for one layer (op classes)."""

    attention: tuple[OpClass, ...]  # norms and MLA up-projections, in every layer
    dense: tuple[OpClass, ...]  # a dense layer's MLP
    moe: tuple[OpClass, ...]  # an MoE layer's expert activation


def _vector(nbytes, kernels) -> OpClass:
    return OpClass(flops=nbytes, bytes=nbytes, kernels=kernels, tensor=False, role="vector")


def _share(op: OpClass, factor, kernels) -> OpClass:
    return OpClass(
        flops=op.flops * factor,
        bytes=op.bytes * factor,
        kernels=kernels,
        tensor=op.tensor,
        role=op.role,
    )


def selective_redoes_nothing(stack) -> bool:
    """Whether selective recomputation redoes nothing under ``stack``: its fused attention kernel
    keeps no scores to drop (Korthikanti et al. 2022 §5) and it recomputes no modules, so such a
    strategy is the one without recomputation (a grid keeps only that one)."""
    return not stores_scores(stack) and not int(stack.recompute_modules)


def redone_ops(m: ModelSpec, s: Strategy, ops, act_bytes) -> Redone | None:
    """The recomputed forward ops, or ``None`` when the stack names no recompute module: the two
    norms (read and write ``T·h``, sequence-parallel shards under SP), the up-projection share
    of the QKV GEMMs, the dense MLP, and the routed experts' activation (read ``g·f``, write
    ``f`` per routed token); under ``per_op`` the norms, the K projection's share of the QKV
    GEMMs, the output projection, fc1's up half and the dense activation function.

    Args:
      m: model dimensions.
      s: one strategy.
      ops: the layer's forward op classes (:func:`perfmodel.step.workload.layer_forward_ops`).
      act_bytes: bytes per activation element.
    """
    if is_off(behaviour(s, "recompute_modules", int)):
        return None
    lay, bat = s.layout, s.batching
    one = jnp.ones(())
    on = s.memory.recompute == Recompute.SELECTIVE
    flag = lambda module: where(_names(s, module), one, 0.0) * on  # noqa: E731
    T = bat.micro_batch_size * m.seq_len / lay.cp
    rep = where(s.memory.sequence_parallel > 0, lay.tp, 1.0)
    per_op = flag(RecomputeModule.PER_OP)
    ln_on = jnp.maximum(flag(RecomputeModule.LAYERNORM), per_op)
    up = flag(RecomputeModule.MLA_UP_PROJ) * mla_up_fraction(m)
    # per-op: the K projection's share of the Q/K/V GEMMs (the even-numbered matmul)
    att = attention_shape(m)
    k_share = _k_width(m) / jnp.maximum(att.q_dim + att.kv_exchanged, 1.0)
    up = where(per_op > 0, k_share, up)
    norm_bytes = ln_on * 2.0 * 2.0 * T * m.hidden_size / rep * act_bytes
    norms = _vector(norm_bytes, 2.0 * ln_on)
    out_proj = _share(ops.proj, per_op, ops.proj.kernels * per_op)
    qkv = _share(ops.qkv, up, where(per_op > 0, 1.0, where(up > 0, 2.0, 0.0)))
    g = 1.0 + m.gated_mlp
    # "mlp": the whole dense MLP again; per-op: fc1's up half (w3), one of its g + 1 GEMMs
    mlp_on = where(flag(RecomputeModule.MLP) > 0, 1.0, per_op / (g + 1.0))
    mlp = _share(ops.mlp, mlp_on, where(mlp_on >= 1.0, ops.mlp.kernels, per_op))
    # per-op: the activation function (read g·f, write f per token, split over tp)
    dense_act = _vector(per_op * T / lay.tp * m.ffn_hidden_size * (g + 1.0) * act_bytes, per_op)
    act_on = flag(RecomputeModule.MOE_ACT)
    if m.moe:
        r = routed_tokens(m, bat.micro_batch_size, lay.tp, lay.cp, lay.moe_imbalance)
        act = _vector(act_on * r * m.moe_ffn_hidden_size * (g + 1.0) * act_bytes, act_on)
    else:
        act = _vector(jnp.zeros(()), jnp.zeros(()))
    return Redone(attention=(norms, qkv, out_proj), dense=(mlp, dense_act), moe=(act,))
