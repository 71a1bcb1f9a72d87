"""Mixture-of-experts layers: routed expert GEMMs, the router, and the token dispatch volumes.

Contract: everything here is written for one strategy with scalar leaves (jittable, vmapped by
:func:`perfmodel.search.evaluate.evaluate_grid`), for a model with routed experts (the step
function compiles none of it for a dense model). The work of an MoE
layer is conserved: a stage's ``dp·tp·cp`` ranks share ``k`` expert passes per token (expert
parallelism folded into those ranks, Megatron-Core's MoE parallel folding, Liu et al. 2025,
arXiv:2504.14960), so one rank runs ``b·s·k/(tp·cp)`` routed tokens times the imbalance of
the busiest rank. Its GEMMs are grouped per local expert (``num_experts/ep`` of them), which is
where their efficiency comes from: per-kernel work shrinks as experts multiply. Tokens reach
their experts by an all-to-all (or an all-gather and reduce-scatter) over the EP group, each
way, forward and backward (Lepikhin et al. 2021, GShard; Megatron-Core's token dispatchers).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Float

from perfmodel.specs.model import ModelSpec, expert_params
from perfmodel.step.select import where
from perfmodel.step.workload import OpClass, gemm

_F = jnp.float32


class MoeOps(NamedTuple):
    """Forward kernels of the MLP block of one MoE layer for one microbatch on one device."""

    router: OpClass  # the gate GEMM (h x E) on this rank's tokens
    experts: OpClass  # routed expert GEMMs (grouped), imbalance included
    shared: OpClass  # the always-active shared experts (tensor-parallel like a dense MLP)
    elementwise: OpClass  # activation, top-k, permute/unpermute, weighting


class MoeTraffic(NamedTuple):
    """Bytes of one MoE layer's token exchange for one microbatch on one rank (forward)."""

    dispatch_bytes: Float[Array, ""]  # tokens this rank sends to its experts (one way)
    routed_tokens: Float[Array, ""]  # token copies this rank's experts process


def _op(flops, nbytes, kernels, tensor=True, role=None, gemms=()) -> OpClass:
    return OpClass(
        flops=jnp.asarray(flops, _F),
        bytes=jnp.asarray(nbytes, _F),
        kernels=jnp.asarray(kernels, _F),
        tensor=tensor,
        role=role or ("linear" if tensor else "vector"),
        gemms=gemms,
    )


def routed_tokens(m: ModelSpec, micro_batch, tp, cp, imbalance) -> Float[Array, ""]:
    """Token copies the busiest rank's experts process per MoE layer and microbatch:
    ``b·s·k/(tp·cp)`` times ``imbalance``."""
    return micro_batch * m.seq_len * m.experts_per_token / (tp * cp) * imbalance


def moe_forward_ops(m: ModelSpec, micro_batch, tp, cp, ep, imbalance, act_bytes) -> MoeOps:
    """Forward kernels of an MoE layer's MLP block on one rank (zero for a dense model).

    Args:
      m: the model (``num_experts``, ``experts_per_token``, ``moe_ffn_hidden_size``,
        ``shared_experts``).
      micro_batch: sequences per microbatch.
      tp: tensor-parallel degree (tokens enter the layer split over tp: sequence parallelism).
      cp: context-parallel degree.
      ep: expert-parallel degree (local experts: ``num_experts / ep``).
      imbalance: the busiest rank's routed tokens over the mean (1 = balanced).
      act_bytes: bytes per activation element.

    Returns:
      :class:`MoeOps`: FLOPs, HBM bytes and kernels of each part.
    """
    h, fe, g = m.hidden_size, m.moe_ffn_hidden_size, 1.0 + m.gated_mlp
    tokens_in = micro_batch * m.seq_len / (tp * cp)  # this rank's tokens entering the layer
    routed = routed_tokens(m, micro_batch, tp, cp, imbalance)
    local = jnp.maximum(m.num_experts / ep, 1.0)
    w_local = local * expert_params(m)
    experts = _op(
        2.0 * routed * h * fe * (g + 1.0),
        act_bytes * (2.0 * routed * h + w_local + routed * fe * (g + 1.0)),
        2.0 * local,  # fc1 and fc2 of each local expert
        # grouped GEMMs: each local expert's tokens, fc1 then fc2
        gemms=(
            gemm(jnp.maximum(routed / local, 1.0), g * fe, h, g / (g + 1.0), batch=local),
            gemm(jnp.maximum(routed / local, 1.0), h, fe, 1.0 / (g + 1.0), batch=local),
        ),
    )
    # shared experts run on every token, split over tp like a dense MLP (tokens gathered)
    T = micro_batch * m.seq_len / cp
    fs = m.shared_experts * fe
    shared = _op(
        2.0 * T * h * fs * (g + 1.0) / tp,
        act_bytes * (2.0 * T * h + h * fs * (g + 1.0) / tp + T * fs * (g + 1.0) / tp),
        2.0 * where(m.shared_experts > 0, 1.0, 0.0),
        # (one column at least: a model without shared experts has an empty class)
        gemms=(
            gemm(T, jnp.maximum(g * fs / tp, 1.0), h, g / (g + 1.0)),
            gemm(T, h, jnp.maximum(fs / tp, 1.0), 1.0 / (g + 1.0)),
        ),
    )
    router = _op(
        2.0 * tokens_in * h * m.num_experts,
        act_bytes * (tokens_in * h + h * m.num_experts) + 4.0 * tokens_in * m.num_experts,
        1.0,
    )
    # gating softmax/top-k (fp32 over E), permute and unpermute copies, the activation
    elementwise = _op(
        (5.0 * tokens_in * m.num_experts + 8.0 * routed * fe),
        (
            4.0 * 2.0 * tokens_in * m.num_experts
            + act_bytes * (4.0 * routed * h + (2.0 + g) * routed * fe)
        ),
        6.0,
        tensor=False,
    )
    return MoeOps(router=router, experts=experts, shared=shared, elementwise=elementwise)


def moe_traffic(m: ModelSpec, micro_batch, tp, cp, act_bytes) -> MoeTraffic:
    """Forward dispatch volume of one MoE layer on one rank: each of its ``b·s/(tp·cp)`` tokens
    goes to ``k`` experts (the combine sends the same back)."""
    tokens_in = micro_batch * m.seq_len / (tp * cp)
    return MoeTraffic(
        dispatch_bytes=tokens_in * m.experts_per_token * m.hidden_size * act_bytes,
        routed_tokens=tokens_in * m.experts_per_token,
    )


def moe_activation_bytes(m: ModelSpec, micro_batch, tp, cp, imbalance, act_bytes):
    """Activation bytes one MoE layer's MLP block keeps for the backward pass on one rank: the
    routed tokens' expert inputs, fc1 outputs and activation outputs (each ``k`` copies), the
    router's fp32 probabilities, and the shared experts' tensors."""
    h, fe, g = m.hidden_size, m.moe_ffn_hidden_size, 1.0 + m.gated_mlp
    routed = routed_tokens(m, micro_batch, tp, cp, imbalance)
    tokens_in = micro_batch * m.seq_len / (tp * cp)
    experts = routed * (h + fe * g + fe) * act_bytes
    probs = 4.0 * tokens_in * m.num_experts * 2.0  # logits and probabilities, fp32
    fs = m.shared_experts * fe
    shared = micro_batch * m.seq_len / cp * (fs * g + fs) * act_bytes / tp
    return experts + probs + shared
