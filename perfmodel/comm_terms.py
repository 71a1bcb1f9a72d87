"""The communication terms of one step: tensor-, context-, expert-, pipeline- and data-parallel.

Contract: each function takes one strategy (scalar leaves) and returns seconds; the layout of
ranks is Megatron-Core's ``tp-cp-dp-pp`` (tp innermost, stride 1; cp stride tp; dp stride
tp·cp; pp stride tp·cp·dp), with the expert-parallel group of ``ep`` ranks spanning ``ep·etp``
consecutive ranks (MoE parallel folding). A group's tier is the slowest it crosses
(:func:`perfmodel.collectives.tier_of_group`); groups wider than a scale-up domain reduce
hierarchically (:func:`perfmodel.collectives.hierarchical_all_reduce_s`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Float

from perfmodel import collectives as coll
from perfmodel.choices import CpComm, Dtype, MoeDispatch, ZeroStage
from perfmodel.constants import Constants
from perfmodel.hardware import HardwareSpec
from perfmodel.memory import (
    expert_data_parallel,
    grad_bytes_per_param,
    model_state_bytes_per_param,
    shard_group,
    stage_params_split,
)
from perfmodel.moe import moe_traffic
from perfmodel.strategy import Strategy
from perfmodel.torch_ring import FP32_BYTES, torch_ring_kv_elements
from perfmodel.workload import ModelSpec, attention_shape, tokens_per_sample


class DataParallel(NamedTuple):
    total_s: Float[Array, ""]  # every DP collective of the step
    exposed_s: Float[Array, ""]  # what the backward pass does not hide


class LayerWindows(NamedTuple):
    """Per-microbatch compute a collective can hide behind (seconds, one layer or stage)."""

    fwd_layer_s: Float[Array, ""]
    bwd_layer_s: Float[Array, ""]
    num_layers: Float[Array, ""]


def links(hw: HardwareSpec, c: Constants, group, stride, gpn):
    """(alpha, beta) of the tier a group of ``group`` ranks ``stride`` apart spans."""
    return coll.link_params(
        coll.tier_of_group(group, stride, gpn),
        hw.link_bandwidth_bytes_per_s,
        c.link_latency_s,
        c.link_bandwidth_efficiency,
    )


def _tier(hw, c, tier):
    return coll.link_params(
        tier, hw.link_bandwidth_bytes_per_s, c.link_latency_s, c.link_bandwidth_efficiency
    )


def tp_comm(m: ModelSpec, hw, c, s: Strategy, act_b, n_dense, n_moe, full, fp8=0.0):
    """Tensor-parallel collectives of one stage for one microbatch (tp innermost: stride 1).

    Megatron's 2 forward + 2 backward all-reduces of ``b·s·h`` activations per layer (an
    all-gather and a reduce-scatter each with sequence parallelism, the same volume), 2 more
    per recomputed forward, and the embedding output and output-layer input gradient
    (Narayanan et al. SC21 §3.2). Sequence parallelism redoes one all-gather per block in the
    backward pass to rebuild the GEMM input it did not keep (Korthikanti et al. 2022 §4.2.2:
    half an all-reduce per block). An MoE layer's routed experts need none (tokens enter them
    sequence-split): only its attention block, and shared experts, talk over tp. An MLP
    all-reduces once per pair of layers each way.

    With FP8 (``fp8 > 0``) and sequence parallelism, every all-gather feeds an FP8 GEMM and
    carries 1-byte values: Transformer Engine quantizes the column-parallel input before its
    all-gather and the row-parallel output gradient before the backward one
    (``gather_along_first_dim`` after the quantizer; ``grad_output_preprocess``, "FP8 case with
    gather"), as torchao's ``Float8ColwiseParallel``/``Float8RowwiseParallel`` do for torchtitan;
    the reduce-scatters of GEMM outputs stay in the activation dtype, and so do the embedding's.
    """
    b, tp = s.micro_batch_size, s.tp
    alpha, beta = links(hw, c, tp, 1.0, s.gpus_per_node)
    sp = s.sequence_parallel > 0
    sp_redo = jnp.where(sp, 0.5, 0.0)
    if m.kind == "transformer":
        n_tp = b * m.seq_len / s.cp * m.hidden_size * act_b
        block = 2.0 + sp_redo + jnp.where(full, 1.0, 0.0)  # fwd + bwd (+ redo) per block
        shared = jnp.where(m.shared_experts > 0, 1.0, 0.0)
        blocks = n_dense * 2.0 + n_moe * (1.0 + shared)
        count = blocks * block + 2.0
        # FP8 all-gathers (half the bytes of the activation dtype's): an all-gather and a
        # reduce-scatter move the bytes of an all-reduce of 3/4 the buffer, the redo's gather half.
        pairs = 2.0 + jnp.where(full, 1.0, 0.0)
        fp8_s = blocks * (
            pairs * coll.all_reduce_s(tp, 0.75 * n_tp, alpha, beta)
            + sp_redo * coll.all_reduce_s(tp, 0.5 * n_tp, alpha, beta)
        ) + 2.0 * coll.all_reduce_s(tp, n_tp, alpha, beta)
        plain_s = count * coll.all_reduce_s(tp, n_tp, alpha, beta)
        return jnp.where(sp & (fp8 > 0), fp8_s, plain_s)
    else:
        n_tp = b * m.hidden_size * act_b
        count = (n_dense + n_moe) * (1.0 + jnp.where(full, 0.5, 0.0))
    return count * coll.all_reduce_s(tp, n_tp, alpha, beta)


def cp_comm(m: ModelSpec, hw, c, s: Strategy, act_b, attn_fwd_s, attn_bwd_s, n_layers, full):
    """Context-parallel K/V exchange of one stage for one microbatch (cp group: stride tp).

    Ring (p2p, Megatron-Core/Transformer Engine's default): ``cp-1`` steps each way pass this
    rank's K/V chunk (``b·(s/cp)`` tokens of :attr:`~perfmodel.workload.AttentionShape.
    kv_exchanged` elements, split over tp) to the next rank while the attention of the
    previous chunk runs; the backward also returns dK/dV (twice the bytes). Only what the
    attention does not cover is exposed. All-gather: K/V gathered before the forward (and
    again in the backward, with a reduce-scatter of dK/dV), not overlapped. PyTorch's ring
    (``torch``): K/V at the query's heads all-gathered once per layer, hidden behind the local
    block's attention (one ``cp``-th of it), in the forward and again in the backward; dK/dV
    travel the ring in fp32, each step's send behind the next step's attention, the last one
    waited for after the loop (its merges are compute: :mod:`perfmodel.torch_ring`).
    Recomputed forwards repeat the forward exchange.
    """
    cp = s.cp
    alpha, beta = links(hw, c, cp, s.tp, s.gpus_per_node)
    chunk = s.micro_batch_size * m.seq_len / cp * attention_shape(m).kv_exchanged * act_b / s.tp
    steps = jnp.maximum(cp - 1.0, 0.0)
    ring_fwd = jnp.maximum(steps * coll.p2p_s(chunk, alpha, beta) - attn_fwd_s, 0.0)
    ring_bwd = jnp.maximum(steps * coll.p2p_s(2.0 * chunk, alpha, beta) - attn_bwd_s, 0.0)
    ag = coll.all_gather_s(cp, cp * chunk, alpha, beta)
    rs = coll.reduce_scatter_s(cp, cp * chunk, alpha, beta)
    gather_fwd, gather_bwd = ag, ag + rs
    kv = torch_ring_kv_elements(m, s.micro_batch_size, s.tp, cp)
    kv_ag = coll.all_gather_s(cp, cp * kv * act_b, alpha, beta)
    dkv = coll.p2p_s(kv * FP32_BYTES, alpha, beta)
    local = 1.0 / jnp.maximum(cp, 1.0)
    torch_fwd = jnp.maximum(kv_ag - local * attn_fwd_s, 0.0)
    torch_bwd = (
        jnp.maximum(kv_ag - local * attn_bwd_s, 0.0)
        + jnp.maximum(steps - 1.0, 0.0) * jnp.maximum(dkv - local * attn_bwd_s, 0.0)
        + dkv
    )
    fwd = jnp.select(
        [s.cp_comm == CpComm.ALLGATHER, s.cp_comm == CpComm.TORCH],
        [gather_fwd, torch_fwd],
        ring_fwd,
    )
    bwd = jnp.select(
        [s.cp_comm == CpComm.ALLGATHER, s.cp_comm == CpComm.TORCH],
        [gather_bwd, torch_bwd],
        ring_bwd,
    )
    per_layer = fwd * (1.0 + jnp.where(full, 1.0, 0.0)) + bwd
    return jnp.where((cp > 1) & (m.kind == "transformer"), n_layers * per_layer, 0.0)


def moe_comm(m: ModelSpec, hw, c, s: Strategy, act_b, n_moe, full):
    """Token dispatch and combine of one stage's MoE layers for one microbatch.

    All-to-all over the EP group (``ep`` ranks spanning ``ep·etp`` consecutive ranks): each
    rank sends its tokens' ``k`` copies out and gets the results back, in the forward and
    again (gradients) in the backward, four all-to-alls per layer, all scaled by the busiest
    rank's ``moe_imbalance``; the copies bound for peers in the same NVLink domain cross
    NVLink while the others cross the NICs at the same time
    (:func:`~perfmodel.collectives.hierarchical_all_to_all_s`); the all-gather dispatcher gathers every token of the group and
    reduce-scatters the results instead, and the ``flex`` dispatcher (DeepEP) sends each token
    once per remote domain (:func:`_flex_dispatch_s`). With ``etp > 1`` the routed tokens are also gathered
    and reduce-scattered over the expert-tensor group.
    """
    ep, etp = s.ep, s.etp
    traffic = moe_traffic(m, s.micro_batch_size, s.tp, s.cp, act_b)
    alpha, beta = links(hw, c, ep, etp, s.gpus_per_node)
    k, intra, inter = _group_links(hw, c, s, ep, etp)
    a2a = coll.hierarchical_all_to_all_s(
        ep, traffic.dispatch_bytes * s.moe_imbalance, k, intra, inter
    )
    tokens_bytes = traffic.dispatch_bytes / jnp.maximum(m.experts_per_token, 1.0)
    gathered = ep * tokens_bytes
    ag = coll.all_gather_s(ep, gathered, alpha, beta) + coll.reduce_scatter_s(
        ep, gathered, alpha, beta
    )
    flex = _flex_dispatch_s(m, s, traffic.dispatch_bytes * s.moe_imbalance, k, intra, inter)
    dispatch = jnp.where(
        s.moe_dispatch == MoeDispatch.ALLGATHER,
        ag,
        2.0 * jnp.where(s.moe_dispatch == MoeDispatch.FLEX, flex, a2a),
    )
    ea, eb = links(hw, c, etp, 1.0, s.gpus_per_node)
    etp_bytes = etp * traffic.dispatch_bytes * s.moe_imbalance
    etp_s = coll.all_gather_s(etp, etp_bytes, ea, eb) + coll.reduce_scatter_s(
        etp, etp_bytes, ea, eb
    )
    per_layer = (dispatch + etp_s) * (2.0 + jnp.where(full, 1.0, 0.0))
    return n_moe * per_layer


def _flex_dispatch_s(m: ModelSpec, s: Strategy, n_bytes, k, intra, inter):
    """One dispatch (or combine) of DeepEP/HybridEP (Megatron-Core's ``flex`` dispatcher;
    DeepSeek-AI 2024, arXiv:2412.19437 §3.2.2): a token is sent over the NICs once to each
    remote NVLink domain holding one of its ``k`` experts, then forwarded over NVLink to the
    GPUs there. With ``D`` domains in the EP group and experts spread evenly, a domain misses
    all ``k`` picks with probability ``(1 - 1/D)^k``, so a token crosses to
    ``(D-1)(1-(1-1/D)^k)`` remote domains instead of sending ``k(D-1)/D`` copies."""
    a0, b0 = intra
    a1, b1 = inter
    domains = jnp.maximum(s.ep / k, 1.0)
    topk = jnp.maximum(m.experts_per_token, 1.0)
    remote = (domains - 1.0) * (1.0 - (1.0 - 1.0 / domains) ** topk)
    token_bytes = n_bytes / topk  # one copy of each token
    t_remote = jnp.where(domains > 1, (domains - 1.0) * a1 + remote * token_bytes / b1, 0.0)
    t_local = jnp.maximum(k - 1.0, 0.0) * a0 + (k - 1.0) / jnp.maximum(k, 1.0) * n_bytes / b0
    return jnp.where(s.ep > 1, jnp.maximum(t_local, t_remote), 0.0)


def pp_p2p(m: ModelSpec, hw, c, s: Strategy, act_b, v):
    """Pipeline sends of the step (stride tp·cp·dp between neighbouring stages): each of the
    ``v·m + p - 1`` stage boundaries crossed forward and backward sends one activation."""
    tp, pp, mb = s.tp, s.pp, s.num_microbatches
    alpha, beta = links(hw, c, 2.0, tp * s.cp * s.dp, s.gpus_per_node)
    # Megatron's scatter/gather optimisation sends 1/tp of the activation per rank over the
    # inter-node link and all-gathers it over NVLink (Narayanan et al. SC21 §4.1)
    n_pp = s.micro_batch_size * tokens_per_sample(m) / s.cp * m.hidden_size * act_b / tp
    return jnp.where(pp > 1, 2.0 * (v * mb + pp - 1.0) * coll.p2p_s(n_pp, alpha, beta), 0.0)


def _group_links(hw, c, s: Strategy, group, stride):
    """(k per domain, intra link, inter link) of a group for the hierarchical collectives."""
    k = coll.ranks_per_domain(group, stride, s.gpus_per_node)
    return k, _tier(hw, c, 0), links(hw, c, group, stride, s.gpus_per_node)


def dp_comm(m: ModelSpec, hw, c, s: Strategy, win: LayerWindows) -> DataParallel:
    """Data-parallel gradient and parameter traffic of the step and the part left exposed.

    Dense parameters reduce over the dp·cp ranks (stride tp), routed experts over their
    expert-data-parallel ranks (stride ep·etp). What ZeRO's partitioning forces (Rajbhandari et
    al. 2020 §5; DeepSpeed's stage 2 and 3 engines, PyTorch FSDP): with gradients partitioned
    (ZeRO-2, 3) every microbatch's gradient is reduce-scattered as its backward produces it;
    with parameters partitioned (ZeRO-3/FSDP) every microbatch gathers each layer for its
    forward and, when parameters are resharded after it, again for its backward; HSDP
    (``shard_size``) does both inside shard groups and all-reduces the gradient shard across
    the replicas once per step; ZeRO-1 and 2 all-gather the updated parameter shards after the
    optimizer step, where no backward pass is left to hide behind. ZeRO-0 all-reduces the
    accumulated gradient once, behind the last backward pass. Gradients move in fp32 when
    ``grad_reduce_fp32`` (:func:`perfmodel.memory.grad_bytes_per_param`). With ``dp_overlap``
    (FSDP's prefetch, Megatron's overlapped reduce) a fraction of the hideable traffic hides
    behind the compute. With ``fsdp_step_gather`` (PyTorch pipelining's no-sync for FSDP2
    stages) ZeRO-3 gathers once and reduce-scatters once per step, behind one microbatch.
    """
    mb = s.num_microbatches
    dense, experts = stage_params_split(m, s)
    w_b, _, _ = model_state_bytes_per_param(s.dtype)
    # FP8 weights gathered in FP8 with the distributed optimizer (``--fp8-param-gather``)
    w_b = jnp.where((s.dtype == Dtype.FP8) & (s.zero_stage >= ZeroStage.OPTIMIZER), 1.0, w_b)
    g_b = grad_bytes_per_param(s)
    partitioned = s.zero_stage >= ZeroStage.OPTIMIZER
    zero3 = s.zero_stage == ZeroStage.PARAMETERS
    # FSDP's step gather: one all-gather and one reduce-scatter per step, not per microbatch
    step_gather = zero3 & (s.fsdp_step_gather > 0)
    per_mb = jnp.where(s.zero_stage >= ZeroStage.GRADIENTS, jnp.where(step_gather, 1.0, mb), 1.0)
    gathers = jnp.where(s.fsdp_reshard > 0, 2.0, 1.0)

    def traffic(params, group, stride, replicas):
        k, intra, inter = _group_links(hw, c, s, group, stride)
        rs = coll.hierarchical_reduce_scatter_s(group, params * g_b, k, intra, inter)
        ag = coll.hierarchical_all_gather_s(group, params * w_b, k, intra, inter)
        ar = coll.hierarchical_all_reduce_s(group, params * g_b, k, intra, inter)
        # HSDP: the gradient shard all-reduced across the replicas of each shard group
        ra, rb = links(hw, c, replicas, stride * group, s.gpus_per_node)
        replica_ar = coll.nccl_all_reduce_s(replicas, params * g_b / group, ra, rb)
        hideable = jnp.where(
            partitioned,
            per_mb * rs + jnp.where(zero3, jnp.where(step_gather, ag, gathers * mb * ag), 0.0),
            ar,
        )
        exposed = jnp.where(partitioned & ~zero3, ag, 0.0) + jnp.where(zero3, replica_ar, 0.0)
        return hideable, exposed

    group = shard_group(s)
    replicas = jnp.maximum(s.dp * s.cp / group, 1.0)
    h_dense, e_dense = traffic(dense, group, s.tp, replicas)
    edp = expert_data_parallel(s)
    h_exp, e_exp = traffic(experts, edp, s.ep * s.etp, jnp.ones(()))
    has_experts = experts > 0
    hideable = h_dense + jnp.where(has_experts, h_exp, 0.0)
    exposed = e_dense + jnp.where(has_experts, e_exp, 0.0)
    dp_total = hideable + exposed
    window = (
        per_mb
        * win.num_layers
        * jnp.where(zero3, win.fwd_layer_s + win.bwd_layer_s, win.bwd_layer_s)
    )
    hidden = jnp.where(s.dp_overlap > 0, jnp.minimum(c.dp_overlap_fraction * hideable, window), 0.0)
    return DataParallel(total_s=dp_total, exposed_s=dp_total - hidden)
