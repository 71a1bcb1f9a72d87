"""The communication terms of one step: tensor-, context-, expert-, pipeline- and data-parallel.

Contract: each function takes one strategy (scalar leaves) and returns seconds; the layout of
ranks is Megatron-Core's ``tp-cp-dp-pp`` (tp innermost, stride 1; cp stride tp; dp stride
tp·cp; pp stride tp·cp·dp), with the expert-parallel group of ``ep`` ranks spanning ``ep·etp``
consecutive ranks (MoE parallel folding). A group's tier is the slowest it crosses
(:func:`perfmodel.step.collectives.tier_of_group`); groups wider than a scale-up domain reduce
hierarchically (:func:`perfmodel.step.collectives.hierarchical_all_reduce_s`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from perfmodel.specs.choices import CpComm, Dtype, MoeDispatch, ZeroStage
from perfmodel.specs.constants import Constants
from perfmodel.specs.hardware import HardwareSpec
from perfmodel.specs.model import ModelSpec, attention_shape, tokens_per_sample
from perfmodel.specs.strategy import Layout, Strategy
from perfmodel.step import collectives as coll
from perfmodel.step.memory import (
    expert_data_parallel,
    grad_bytes_per_param,
    model_state_bytes_per_param,
    shard_group,
    stage_params_split,
)
from perfmodel.step.moe import moe_traffic
from perfmodel.step.recipes import stack_recipe
from perfmodel.step.select import behaviour, both, is_off, where
from perfmodel.step.torch_ring import FP32_BYTES, torch_ring_kv_elements


class DataParallel(NamedTuple):
    total_s: Float[Array, ""]  # every DP collective of the step
    exposed_s: Float[Array, ""]  # what the backward pass does not hide


class LayerWindows(NamedTuple):
    """Per-microbatch compute a collective can hide behind (seconds, one layer or stage)."""

    fwd_layer_s: Float[Array, ""]
    bwd_layer_s: Float[Array, ""]
    num_layers: Float[Array, ""]


def links(hw: HardwareSpec, c: Constants, group, stride, gpn, domains=None):
    """(alpha, beta) of the tier a group of ``group`` ranks ``stride`` apart spans. Given the
    scale-up ``domains`` the group spans (a data-, context- or expert-parallel group, which can
    span many), the slow tier's bandwidth falls across more leaf groups of the fabric than one
    (:func:`perfmodel.step.collectives.fabric_efficiency`); tensor- and pipeline-parallel
    groups span one or two."""
    alpha, beta = coll.link_params(
        coll.tier_of_group(group, stride, gpn),
        hw.link_bandwidth_bytes_per_s,
        c.link_latency_s,
        c.link_bandwidth_efficiency,
    )
    if domains is None:
        return alpha, beta
    return alpha, beta * coll.fabric_efficiency(
        domains, hw.fabric_leaf_domains, c.fabric_congestion
    )


def _tier(hw, c, tier):
    return coll.link_params(
        tier, hw.link_bandwidth_bytes_per_s, c.link_latency_s, c.link_bandwidth_efficiency
    )


def tp_comm(m: ModelSpec, hw, c, s: Strategy, act_b, n_dense, n_moe, full, fp8=False, fp4=False):
    """Tensor-parallel collectives of one stage for one microbatch (tp innermost: stride 1).

    Megatron's 2 forward + 2 backward all-reduces of ``b·s·h`` activations per layer (an
    all-gather and a reduce-scatter each with sequence parallelism, the same volume), 2 more
    per recomputed forward, and the embedding output and output-layer input gradient
    (Narayanan et al. SC21 §3.2). Sequence parallelism redoes one all-gather per block in the
    backward pass to rebuild the GEMM input it did not keep (Korthikanti et al. 2022 §4.2.2:
    half an all-reduce per block). An MoE layer's routed experts need none (tokens enter them
    sequence-split): only its attention block, and shared experts, talk over tp. An MLP
    all-reduces once per pair of layers each way.

    With FP8 (``fp8`` true) and sequence parallelism, every all-gather feeds an FP8 GEMM and
    carries 1-byte values: Transformer Engine quantizes the column-parallel input before its
    all-gather and the row-parallel output gradient before the backward one
    (``gather_along_first_dim`` after the quantizer; ``grad_output_preprocess``, "FP8 case with
    gather"), as torchao's ``Float8ColwiseParallel``/``Float8RowwiseParallel`` do for torchtitan;
    the reduce-scatters of GEMM outputs stay in the activation dtype, and so do the embedding's.
    What the gathers carry follows the stack's recipe (:func:`perfmodel.step.recipes.
    stack_recipe`): block and MX scales add their bytes, torchao's ``rowwise`` and FP4 gather
    16-bit values; under current scaling (``tensorwise``, NVFP4) each gathered input's amax is
    first all-reduced over the TP group (one 4-byte all-reduce per gather: its latency).
    """
    lay, b = s.layout, s.batching.micro_batch_size
    tp = lay.tp
    alpha, beta = links(hw, c, tp, 1.0, lay.gpus_per_node)
    sp = s.memory.sequence_parallel > 0
    sp_redo = where(sp, 0.5, 0.0)
    if m.kind != "transformer":
        n_tp = b * m.hidden_size * act_b
        count = (n_dense + n_moe) * (1.0 + where(full, 0.5, 0.0))
        return count * coll.all_reduce_s(tp, n_tp, alpha, beta)
    n_tp = b * m.seq_len / lay.cp * m.hidden_size * act_b
    block = 2.0 + sp_redo + where(full, 1.0, 0.0)  # fwd + bwd (+ redo) per block
    if m.moe:
        shared = where(m.shared_experts > 0, 1.0, 0.0)
        blocks = n_dense * 2.0 + n_moe * (1.0 + shared)
    else:
        blocks = n_dense * 2.0
    count = blocks * block + 2.0
    plain_s = count * coll.all_reduce_s(tp, n_tp, alpha, beta)
    if fp8 is False:
        return plain_s
    pairs = 2.0 + where(full, 1.0, 0.0)

    def gathered_s(cost):
        # low-precision all-gathers (``a`` of the activation bytes): an all-gather and a
        # reduce-scatter move the bytes of an all-reduce of (1 + a)/2 the buffer (3/4 for FP8),
        # the redo's gather a
        t = plain_s
        if cost.gather_bytes is not None:
            a = cost.gather_bytes / act_b
            t = blocks * (
                pairs * coll.all_reduce_s(tp, 0.5 * (1.0 + a) * n_tp, alpha, beta)
                + sp_redo * coll.all_reduce_s(tp, a * n_tp, alpha, beta)
            ) + 2.0 * coll.all_reduce_s(tp, n_tp, alpha, beta)
        if cost.amax_per_gather:
            t = t + blocks * pairs * coll.all_reduce_s(tp, 4.0, alpha, beta)
        return t

    low_s = gathered_s(stack_recipe(s.stack))
    if fp4 is not False:
        low_s = where(fp4, gathered_s(stack_recipe(s.stack, fp4=True)), low_s)
    return where(sp & fp8, low_s, plain_s)


def cp_exchange(m: ModelSpec, hw, c, s: Strategy, act_b, attn_fwd_s, attn_bwd_s, n_layers, full):
    """Context-parallel K/V exchange of one stage for one microbatch (cp group: stride tp).

    Ring (p2p, Megatron-Core/Transformer Engine's default): ``cp-1`` steps each way pass this
    rank's K/V chunk (``b·(s/cp)`` tokens of :attr:`~perfmodel.specs.model.AttentionShape.
    kv_exchanged` elements, split over tp) to the next rank while the attention of the
    previous chunk runs; the backward also returns dK/dV (twice the bytes). Only what the
    attention does not cover is exposed. All-gather: K/V gathered before the forward (and
    again in the backward, with a reduce-scatter of dK/dV), not overlapped. PyTorch's ring
    (``torch``): K/V at the query's heads all-gathered once per layer, hidden behind the local
    block's attention (one ``cp``-th of it), in the forward and again in the backward; dK/dV
    travel the ring in fp32, each step's send behind the next step's attention, the last one
    waited for after the loop (its merges are compute: :mod:`perfmodel.step.torch_ring`).
    Recomputed forwards repeat the forward exchange. The stack's ``cp_comm`` picks one (static).
    """
    lay, mb = s.layout, s.batching.micro_batch_size
    cp = lay.cp
    gpn = lay.gpus_per_node
    alpha, beta = links(hw, c, cp, lay.tp, gpn, cp / coll.ranks_per_domain(cp, lay.tp, gpn))
    chunk = mb * m.seq_len / cp * attention_shape(m).kv_exchanged * act_b / lay.tp
    steps = jnp.maximum(cp - 1.0, 0.0)
    kind = s.stack.cp_comm
    if kind == CpComm.ALLGATHER:
        ag = coll.all_gather_s(cp, cp * chunk, alpha, beta)
        rs = coll.reduce_scatter_s(cp, cp * chunk, alpha, beta)
        fwd, bwd = ag, ag + rs
    elif kind == CpComm.TORCH:
        kv = torch_ring_kv_elements(m, mb, lay.tp, cp)
        kv_ag = coll.all_gather_s(cp, cp * kv * act_b, alpha, beta)
        dkv = coll.p2p_s(kv * FP32_BYTES, alpha, beta)
        local = 1.0 / jnp.maximum(cp, 1.0)
        fwd = jnp.maximum(kv_ag - local * attn_fwd_s, 0.0)
        bwd = (
            jnp.maximum(kv_ag - local * attn_bwd_s, 0.0)
            + jnp.maximum(steps - 1.0, 0.0) * jnp.maximum(dkv - local * attn_bwd_s, 0.0)
            + dkv
        )
    else:
        fwd = jnp.maximum(steps * coll.p2p_s(chunk, alpha, beta) - attn_fwd_s, 0.0)
        bwd = jnp.maximum(steps * coll.p2p_s(2.0 * chunk, alpha, beta) - attn_bwd_s, 0.0)
    per_layer = fwd * (1.0 + where(full, 1.0, 0.0)) + bwd
    return where(cp > 1, n_layers * per_layer, 0.0)


def moe_comm(m: ModelSpec, hw, c, s: Strategy, act_b, n_moe, full):
    """Token dispatch and combine of one stage's MoE layers for one microbatch.

    All-to-all over the EP group (``ep`` ranks spanning ``ep·etp`` consecutive ranks): each
    rank sends its tokens' ``k`` copies out and gets the results back, in the forward and
    again (gradients) in the backward, four all-to-alls per layer, all scaled by the busiest
    rank's ``moe_imbalance``; the copies bound for peers in the same NVLink domain cross
    NVLink while the others cross the NICs at the same time
    (:func:`~perfmodel.step.collectives.hierarchical_all_to_all_s`); the all-gather dispatcher
    gathers every token of the group and reduce-scatters the results instead, and the ``flex``
    dispatcher (DeepEP) sends each token once per remote domain (:func:`_flex_dispatch_s`);
    the stack's ``moe_dispatch`` picks one (static). With ``etp > 1`` the routed tokens are
    also gathered and reduce-scattered over the expert-tensor group.
    """
    lay = s.layout
    ep, etp = lay.ep, lay.etp
    traffic = moe_traffic(m, s.batching.micro_batch_size, lay.tp, lay.cp, act_b)
    k, intra, inter = _group_links(hw, c, lay, ep, etp)
    dispatch_bytes = traffic.dispatch_bytes * lay.moe_imbalance
    kind = s.stack.moe_dispatch
    if kind == MoeDispatch.ALLGATHER:
        alpha, beta = links(hw, c, ep, etp, lay.gpus_per_node)
        tokens_bytes = traffic.dispatch_bytes / jnp.maximum(m.experts_per_token, 1.0)
        gathered = ep * tokens_bytes
        dispatch = coll.all_gather_s(ep, gathered, alpha, beta) + coll.reduce_scatter_s(
            ep, gathered, alpha, beta
        )
    elif kind == MoeDispatch.FLEX:
        dispatch = 2.0 * _flex_dispatch_s(m, lay, dispatch_bytes, k, intra, inter)
    else:
        dispatch = 2.0 * coll.hierarchical_all_to_all_s(ep, dispatch_bytes, k, intra, inter)
    ea, eb = links(hw, c, etp, 1.0, lay.gpus_per_node)
    etp_bytes = etp * traffic.dispatch_bytes * lay.moe_imbalance
    etp_s = coll.all_gather_s(etp, etp_bytes, ea, eb) + coll.reduce_scatter_s(
        etp, etp_bytes, ea, eb
    )
    per_layer = (dispatch + etp_s) * (2.0 + where(full, 1.0, 0.0))
    return n_moe * per_layer


def _flex_dispatch_s(m: ModelSpec, lay: Layout, n_bytes, k, intra, inter):
    """One dispatch (or combine) of DeepEP/HybridEP (Megatron-Core's ``flex`` dispatcher;
    DeepSeek-AI 2024, arXiv:2412.19437 §3.2.2): a token is sent over the NICs once to each
    remote NVLink domain holding one of its ``k`` experts, then forwarded over NVLink to the
    GPUs there. With ``D`` domains in the EP group and experts spread evenly, a domain misses
    all ``k`` picks with probability ``(1 - 1/D)^k``, so a token crosses to
    ``(D-1)(1-(1-1/D)^k)`` remote domains instead of sending ``k(D-1)/D`` copies."""
    a0, b0 = intra
    a1, b1 = inter
    domains = jnp.maximum(lay.ep / k, 1.0)
    topk = jnp.maximum(m.experts_per_token, 1.0)
    remote = (domains - 1.0) * (1.0 - (1.0 - 1.0 / domains) ** topk)
    token_bytes = n_bytes / topk  # one copy of each token
    t_remote = where(domains > 1, (domains - 1.0) * a1 + remote * token_bytes / b1, 0.0)
    t_local = jnp.maximum(k - 1.0, 0.0) * a0 + (k - 1.0) / jnp.maximum(k, 1.0) * n_bytes / b0
    return where(lay.ep > 1, jnp.maximum(t_local, t_remote), 0.0)


def pp_p2p(m: ModelSpec, hw, c, s: Strategy, act_b, v):
    """Pipeline sends of the step (stride tp·cp·dp between neighbouring stages): each of the
    ``v·m + p - 1`` stage boundaries crossed forward and backward sends one activation."""
    lay, bat = s.layout, s.batching
    tp, pp, mb = lay.tp, lay.pp, bat.num_microbatches
    alpha, beta = links(hw, c, 2.0, tp * lay.cp * lay.dp, lay.gpus_per_node)
    # Megatron's scatter/gather optimisation sends 1/tp of the activation per rank over the
    # inter-node link and all-gathers it over NVLink (Narayanan et al. SC21 §4.1)
    n_pp = bat.micro_batch_size * tokens_per_sample(m) / lay.cp * m.hidden_size * act_b / tp
    return where(pp > 1, 2.0 * (v * mb + pp - 1.0) * coll.p2p_s(n_pp, alpha, beta), 0.0)


def group_links(hw, c, lay: Layout, group, stride):
    """(k per domain, intra link, inter link) of a group for the hierarchical collectives (the
    inter link at the fabric's efficiency over the ``group/k`` domains it spans)."""
    k = coll.ranks_per_domain(group, stride, lay.gpus_per_node)
    return k, _tier(hw, c, 0), links(hw, c, group, stride, lay.gpus_per_node, group / k)


_group_links = group_links


def amax_reduction_s(m: ModelSpec, hw, c, s: Strategy, n_layers):
    """One all-reduce of delayed scaling's amax buffer over the amax group: the tp·cp·dp ranks
    of a stage (Megatron-Core's ``amax_reduction_group``), an fp32 amax for each GEMM's input,
    weight and gradient of the chunk's layers (Transformer Engine's
    ``reduce_and_update_fp8_tensors``)."""
    lay = s.layout
    group = lay.tp * lay.cp * lay.dp
    k, intra, inter = group_links(hw, c, lay, group, 1.0)
    gemms = 4.0 if m.kind == "transformer" else 1.0
    return coll.hierarchical_all_reduce_s(group, 4.0 * 3.0 * gemms * n_layers, k, intra, inter)


class _DpPasses(NamedTuple):
    """What ZeRO's partitioning and the stack make every data-parallel collective do."""

    w_b: Float[Array, ""]  # bytes per parameter an all-gather carries
    g_b: Float[Array, ""]  # bytes per parameter a gradient reduction carries
    partitioned: Float[Array, ""]  # ZeRO >= 1 (a boolean)
    zero3: Float[Array, ""]  # parameters partitioned (a boolean)
    step_gather: Float[Array, ""]  # ZeRO-3 under ``fsdp_step_gather`` (a boolean)
    per_mb: Float[Array, ""]  # gradient reduce-scatters per step
    gathers: float  # ZeRO-3's all-gathers per microbatch: 2 when resharded after the forward
    microbatches: Float[Array, ""]
    bucket: Float[Array, ""] | float  # parameters per collective (0: one per layer)


def _gathered_bytes_per_param(s: Strategy):
    """Bytes per parameter of the weights an all-gather carries: the 16-bit weights, or, in a
    program with FP8 or FP4 GEMMs, their low-precision copy."""
    mem, stack = s.memory, s.stack
    w_b, _, _ = model_state_bytes_per_param(mem.dtype)
    if s.scope.fp8:
        # FP8/FP4 weights gathered in low precision with the distributed optimizer
        # (``--fp8-param-gather``; Megatron-Bridge's FP8 and NVFP4 presets), under recipes that
        # keep low-precision weights (not torchao's rowwise)
        part = mem.zero_stage >= ZeroStage.OPTIMIZER
        c8 = stack_recipe(stack)
        c4 = stack_recipe(stack, fp4=True)
        if c8.weight_bytes is not None:
            w_b = where((mem.dtype == Dtype.FP8) & part, c8.weight_bytes, w_b)
        if c4.weight_bytes is not None:
            w_b = where((mem.dtype == Dtype.FP4) & part, c4.weight_bytes, w_b)
    return w_b


def _dp_passes(s: Strategy) -> _DpPasses:
    """The passes of :func:`dp_comm` (its docstring) for the strategy's ZeRO stage and stack."""
    mem = s.memory
    mb = s.batching.num_microbatches
    zero3 = mem.zero_stage == ZeroStage.PARAMETERS
    # FSDP's step gather: one all-gather and one reduce-scatter per step, not per microbatch
    step_gather = both(zero3, behaviour(s, "fsdp_step_gather"))
    return _DpPasses(
        w_b=_gathered_bytes_per_param(s),
        g_b=grad_bytes_per_param(s),
        partitioned=mem.zero_stage >= ZeroStage.OPTIMIZER,
        zero3=zero3,
        step_gather=step_gather,
        per_mb=where(mem.zero_stage >= ZeroStage.GRADIENTS, where(step_gather, 1.0, mb), 1.0),
        gathers=behaviour(s, "fsdp_reshard", lambda v: 2.0 if v else 1.0),
        microbatches=mb,
        bucket=behaviour(s, "dp_bucket_size", float),
    )


def _collectives(bucket, params, num_layers):
    """Collectives a pass is issued in: one per layer (FSDP's per-block units; bucket 0) or
    one per bucket of the stack's size (a traced bucket where a program's rows differ)."""
    if not isinstance(bucket, jax.Array):
        if bucket <= 0.0:
            return jnp.maximum(num_layers, 1.0)
        return jnp.maximum(jnp.ceil(params / bucket), 1.0)
    per_bucket = jnp.maximum(jnp.ceil(params / jnp.maximum(bucket, 1.0)), 1.0)
    return where(bucket > 0.0, per_bucket, jnp.maximum(num_layers, 1.0))


def _dp_traffic(hw, c, lay: Layout, ps: _DpPasses, num_layers, params, group, stride, replicas):
    """(hideable, exposed) seconds of one parameter set's data-parallel traffic over a group of
    ``group`` ranks ``stride`` apart, with ``replicas`` HSDP replicas of each shard group."""
    k, intra, inter = _group_links(hw, c, lay, group, stride)
    n = _collectives(ps.bucket, params, num_layers)
    # a reduce-scatter and an all-gather pay the same per collective and per byte
    latency, per_byte = coll.hierarchical_ring_parts(group, k, intra, inter)
    rs = n * latency + params * ps.g_b * per_byte
    ag = n * latency + params * ps.w_b * per_byte
    ar = coll.hierarchical_all_reduce_s(group, params * ps.g_b, k, intra, inter, n)
    # HSDP: the gradient shard all-reduced across the replicas of each shard group
    ra, rb = links(hw, c, replicas, stride * group, lay.gpus_per_node, replicas)
    replica_ar = coll.nccl_all_reduce_s(replicas, params * ps.g_b / group, ra, rb)
    zero3 = ps.zero3
    gathered = where(ps.step_gather, ag, ps.gathers * ps.microbatches * ag)
    hideable = where(ps.partitioned, ps.per_mb * rs + where(zero3, gathered, 0.0), ar)
    exposed = where(ps.partitioned & ~zero3, ag, 0.0) + where(zero3, replica_ar, 0.0)
    return hideable, exposed


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
    the stack reduces in fp32 (:func:`perfmodel.step.memory.grad_bytes_per_param`). With
    ``dp_overlap`` (FSDP's prefetch, Megatron's overlapped reduce) a fraction of the hideable
    traffic hides behind the compute. With ``fsdp_step_gather`` (PyTorch pipelining's no-sync
    for FSDP2 stages) ZeRO-3 gathers once and reduce-scatters once per step, behind one
    microbatch. Every pass is issued as one collective per layer (FSDP's units) or per bucket
    of the stack's ``dp_bucket_size`` parameters (DeepSpeed's, Megatron's buckets), each paying
    NCCL's ring latency, which grows with the ranks (:func:`perfmodel.step.collectives.
    ring_latency_s`): at thousands of ranks a flat ZeRO-3 is latency-bound.
    """
    lay, mem = s.layout, s.memory
    dense, experts = stage_params_split(m, lay)
    ps = _dp_passes(s)
    group = shard_group(lay, mem)
    replicas = jnp.maximum(lay.dp * lay.cp / group, 1.0)
    hideable, exposed = _dp_traffic(hw, c, lay, ps, win.num_layers, dense, group, lay.tp, replicas)
    if m.moe:
        edp, stride = expert_data_parallel(lay), lay.ep * lay.etp
        h_exp, e_exp = _dp_traffic(
            hw, c, lay, ps, win.num_layers, experts, edp, stride, jnp.ones(())
        )
        has_experts = experts > 0
        hideable = hideable + where(has_experts, h_exp, 0.0)
        exposed = exposed + where(has_experts, e_exp, 0.0)
    dp_total = hideable + exposed
    zero3 = ps.zero3
    window = (
        ps.per_mb
        * win.num_layers
        * where(zero3, win.fwd_layer_s + win.bwd_layer_s, win.bwd_layer_s)
    )
    overlap = behaviour(s, "dp_overlap")
    if is_off(overlap):
        return DataParallel(total_s=dp_total, exposed_s=dp_total - 0.0)
    hidden = where(overlap, jnp.minimum(c.dp_overlap_fraction * hideable, window), 0.0)
    return DataParallel(total_s=dp_total, exposed_s=dp_total - hidden)
