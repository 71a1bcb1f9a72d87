"""Issue 15's formulas by hand on small cases, and the invariants the issue names.

Each check builds a tiny model with :func:`perfmodel.specs.model.model_from_dict` so the numbers can
be followed with a pencil: MoE parameters and FLOPs (only activated experts count), expert
parallelism sharding the expert states, context parallelism dividing activations and adding a
ring exchange, FSDP/HSDP traffic, FP8 GEMMs on linear layers only and MFU against the BF16 peak,
fp32 gradient reduction, uneven pipeline stages, and the hierarchical all-reduce.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
import pytest

from perfmodel import load_hardware, make_strategy, step_time
from perfmodel.search.evaluate import compile_options
from perfmodel.specs.model import (
    active_params,
    attention_shape,
    model_flops_per_step,
    model_from_dict,
    total_params,
)
from perfmodel.specs.strategy import leaves_of, stack_strategies
from perfmodel.step import collectives as coll
from perfmodel.step.memory import (
    end_stage_layers,
    memory_per_device,
    stage_params_split,
)
from perfmodel.step.workload import layer_forward_ops

H100 = load_hardware("h100-sxm")
# one strategy compiles as the library compiles an estimate (XLA:CPU's fast path for few rows)
STEP = jax.jit(step_time, compiler_options=compile_options(1))

# a tiny Llama-style layer (GQA, SwiGLU, no biases, no dropout), shared by the step tests
DENSE = json.loads((Path(__file__).parent / "fixtures" / "tiny_llama.json").read_text())
MOE = dict(DENSE, num_experts=8, experts_per_token=2, moe_ffn_hidden_size=128, shared_experts=1)


def _m(**kw):
    return model_from_dict(dict(DENSE, **kw), "test").spec


def _moe(**kw):
    return model_from_dict(dict(MOE, **kw), "test").spec


def test_moe_parameters_and_model_flops_count_only_active_experts():
    m = _moe()
    h, fe = 256, 128
    attn = h * (8 * 32 + 2 * 2 * 32) + 8 * 32 * h  # q, k, v (GQA, head 32) and out
    expert = 3 * h * fe  # gated: gate, up, down
    layer_all = attn + 2 * h + h * 8 + (8 + 1) * expert
    layer_active = attn + 2 * h + h * 8 + (2 + 1) * expert
    emb = 1000 * h * 2 + h  # input, untied head, final norm
    assert float(total_params(m)) == pytest.approx(4 * layer_all + emb)
    assert float(active_params(m)) == pytest.approx(4 * layer_active + emb)
    assert float(model_flops_per_step(m, 3.0)) == pytest.approx(
        6 * (4 * layer_active + emb) * 3 * 1024
    )


def test_dense_layers_come_first_and_are_dense():
    m = _moe(dense_layers=1)
    h = 256
    attn = h * (8 * 32 + 2 * 2 * 32) + 8 * 32 * h
    dense = attn + 2 * h + 3 * h * 512
    moe = attn + 2 * h + h * 8 + 9 * 3 * h * 128
    assert float(total_params(m)) == pytest.approx(dense + 3 * moe + 1000 * h * 2 + h)


def test_latent_attention_shape_by_hand():
    m = _m(
        num_heads=4,
        num_kv_heads=4,
        q_lora_rank=64,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=32,
        v_head_dim=32,
    )
    att = attention_shape(m)
    h = 256
    assert float(att.q_dim) == 4 * 48 and float(att.v_dim) == 4 * 32
    q = h * 64 + 64 * 4 * 48
    kv = h * (32 + 16) + 32 * 4 * (32 + 32)
    assert float(att.proj_params) == q + kv
    assert float(att.out_params) == 4 * 32 * h


def test_expert_parallel_shards_expert_states_and_never_adds_memory():
    m = _moe()
    base = dict(dp=8, micro_batch_size=1, num_microbatches=1, gpus_per_node=8)
    mems = []
    for ep in (1, 2, 4, 8):
        s = make_strategy(**base, ep=ep)
        dense, experts = stage_params_split(m, s.layout)
        assert float(experts) == pytest.approx(4 * 8 * 3 * 256 * 128 / ep)
        mems.append(float(memory_per_device(m, s).total_bytes))
    assert all(b <= a for a, b in zip(mems, mems[1:], strict=False))


def test_context_parallel_divides_activations_and_adds_a_ring():
    m = _m(seq_len=8192)
    acts = []
    for cp in (1, 2, 4, 8):
        s = make_strategy(dp=1, cp=cp, fused_attention=True, gpus_per_node=8)
        acts.append(float(memory_per_device(m, s).activations_bytes))
    assert acts[1] == pytest.approx(acts[0] / 2, rel=1e-5)
    assert all(b <= a for a, b in zip(acts, acts[1:], strict=False))
    # forward FLOPs per rank of the attention core: a quarter of the causal square over cp=2
    one = layer_forward_ops(m, 1.0, 1.0, 0.0, 2.0, True, 1.0)
    two = layer_forward_ops(m, 1.0, 1.0, 0.0, 2.0, True, 2.0)
    assert float(two.attention.flops) == pytest.approx(float(one.attention.flops) / 2)
    # the ring: (cp-1) sends of this rank's K/V chunk, exposed only beyond the attention time
    out = STEP(m, H100.spec, H100.constants, make_strategy(cp=2, fused_attention=True))
    assert float(out.cp_comm_s) >= 0.0


def test_fsdp_gathers_per_microbatch_and_hsdp_adds_a_replica_all_reduce():
    m = _m()
    c, hw = H100.constants, H100.spec
    knobs = dict(dp=16, micro_batch_size=1, num_microbatches=2, zero_stage=3, dp_overlap=False)
    knobs |= dict(grad_reduce_fp32=False, gpus_per_node=8)
    fsdp = STEP(m, hw, c, make_strategy(**knobs))
    # HSDP with shards of 8 (one node): gathers stay on NVLink, plus one all-reduce of the
    # gradient shard across the 2 replicas over InfiniBand
    hsdp = STEP(m, hw, c, make_strategy(**knobs, shard_size=8))
    p = float(total_params(m))
    a0, b0 = (
        float(c.link_latency_s[0]),
        float(hw.link_bandwidth_bytes_per_s[0] * c.link_bandwidth_efficiency[0]),
    )
    a1, b1 = (
        float(c.link_latency_s[1]),
        float(hw.link_bandwidth_bytes_per_s[1] * c.link_bandwidth_efficiency[1]),
    )
    # one gather or reduce-scatter pass of the 8 ranks of one node (D = 1 domain), issued as one
    # collective per layer (dp_bucket_size 0: 4 layers), each paying NCCL's ring latency
    # (p - D)·α_intra + (D - 1)·α_inter = 7·α_intra (tuning.cc); the bytes once: 7/8·n/β
    layers = 4
    assert m.num_layers == layers
    ring8 = layers * 7 * a0 + 7 / 8 * 2 * p / b0
    # per microbatch: gather fwd + gather bwd + reduce-scatter = 3 rings of 8, 2 microbatches;
    # the replica all-reduce of the 2-byte gradient shard (p/8 parameters) is one collective of
    # 2 ranks on 2 nodes (within one leaf group: full bandwidth), the faster of NCCL's ring
    # 2·α + 2·(1/2)·n/β and tree 2·ceil(log2 2)·α + 2·n/β
    replica = min(2 * a1 + 2 * 0.5 * (2 * p / 8) / b1, 2 * a1 + 2 * (2 * p / 8) / b1)
    assert float(hsdp.dp_comm_total_s) == pytest.approx(6 * ring8 + replica, rel=1e-4)
    assert float(
        memory_per_device(m, make_strategy(**knobs, shard_size=8)).optimizer_bytes
    ) == pytest.approx(12 * p / 8, rel=1e-5)
    # no reshard after forward: one gather per microbatch fewer, the whole model held gathered
    keep = make_strategy(**knobs, fsdp_reshard=False)
    assert float(STEP(m, hw, c, keep).dp_comm_total_s) < float(fsdp.dp_comm_total_s)
    assert float(memory_per_device(m, keep).weights_bytes) > float(
        memory_per_device(m, make_strategy(**knobs)).weights_bytes
    )


def test_fp8_runs_linear_layers_only_and_mfu_stays_against_bf16():
    m = model_from_dict(
        dict(
            DENSE,
            num_layers=8,
            hidden_size=4096,
            num_heads=32,
            num_kv_heads=8,
            ffn_hidden_size=14336,
            seq_len=8192,
            vocab_size=128256,
        ),
        "llama-ish",
    ).spec
    knobs = dict(dp=8, micro_batch_size=1, num_microbatches=4, fused_attention=True, zero_stage=1)
    bf16 = STEP(m, H100.spec, H100.constants, make_strategy(**knobs, dtype="bf16"))
    fp8 = STEP(m, H100.spec, H100.constants, make_strategy(**knobs, dtype="fp8"))
    speedup = float(bf16.step_time_s) / float(fp8.step_time_s)
    # faster, but far from the 2x of the peaks: attention, logits and norms stay 16-bit, and
    # every GEMM input is cast
    assert 1.0 < speedup < 1.6
    # MFU against the BF16 peak: the same model FLOPs over a shorter step is a higher MFU
    assert float(fp8.mfu) == pytest.approx(float(bf16.mfu) * speedup, rel=1e-5)
    # FP8 keeps an extra 1-byte weight copy; with the distributed optimizer, FP8 weights only
    plain = dict(knobs, zero_stage=0)
    mb = memory_per_device(m, make_strategy(**plain, dtype="bf16"))
    mf = memory_per_device(m, make_strategy(**plain, dtype="fp8"))
    n = float(total_params(m))
    assert float(mf.weights_bytes - mb.weights_bytes) == pytest.approx(n, rel=1e-5)
    dist = memory_per_device(m, make_strategy(**knobs, dtype="fp8"))
    assert float(dist.weights_bytes) == pytest.approx(n, rel=1e-5)


def test_fp8_all_gathers_carry_one_byte_under_sequence_parallelism():
    # Transformer Engine and torchao quantize a GEMM's input before the sequence-parallel
    # all-gather (forward) and the output gradient before the backward one; the reduce-scatters
    # and the embedding's two all-reduces stay 16-bit. Ring all-reduce of x bytes over p = 4:
    # 2(p-1) alpha + 2(p-1)/p x / beta.
    from perfmodel.step.communication import links, tp_comm

    m, hw, c = _m(), H100.spec, H100.constants
    alpha, beta = (float(x) for x in links(hw, c, 4, 1.0, 8))

    def ar(x):
        return 6 * alpha + 1.5 * x / beta

    n = 2 * 1024 * 256 * 2.0  # b s h bytes of bf16 activations
    blocks = 4 * 2  # attention and MLP of 4 layers
    for full in (False, True):
        s = make_strategy(tp=4, micro_batch_size=2, sequence_parallel=True, gpus_per_node=8)
        pairs = 2 + full  # an all-gather + reduce-scatter each way, and again when recomputed
        bf16 = float(tp_comm(m, hw, c, s, 2.0, 4, 0, full, False))
        fp8 = float(tp_comm(m, hw, c, s, 2.0, 4, 0, full, True))
        assert bf16 == pytest.approx((blocks * (pairs + 0.5) + 2) * ar(n), rel=1e-5)
        # each pair moves n/2 (gather, FP8) + n (scatter) = an all-reduce of 3n/4; the
        # backward's redone gather (half an all-reduce) moves n/2
        hand = blocks * (pairs * ar(0.75 * n) + 0.5 * ar(0.5 * n)) + 2 * ar(n)
        assert fp8 == pytest.approx(hand, rel=1e-5)
        assert fp8 < bf16
        plain = make_strategy(tp=4, micro_batch_size=2, gpus_per_node=8)  # all-reduces: 16-bit
        assert float(tp_comm(m, hw, c, plain, 2.0, 4, 0, full, True)) == float(
            tp_comm(m, hw, c, plain, 2.0, 4, 0, full, False)
        )
    k = dict(tp=4, micro_batch_size=2, sequence_parallel=True, gpus_per_node=8)
    b = STEP(m, hw, c, make_strategy(**k, dtype="bf16"))
    f = STEP(m, hw, c, make_strategy(**k, dtype="fp8"))
    assert float(f.tp_comm_s) < float(b.tp_comm_s)


def test_fp8_never_slows_a_gemm_bound_step():
    for h in (1024, 2048, 4096, 8192):
        m = model_from_dict(
            dict(
                DENSE,
                hidden_size=h,
                num_heads=h // 128,
                num_kv_heads=8,
                ffn_hidden_size=4 * h,
                seq_len=4096,
            ),
            "x",
        ).spec
        k = dict(dp=1, micro_batch_size=4, fused_attention=True)
        b = STEP(m, H100.spec, H100.constants, make_strategy(**k, dtype="bf16"))
        f = STEP(m, H100.spec, H100.constants, make_strategy(**k, dtype="fp8"))
        assert float(f.compute_s) <= float(b.compute_s)


def test_gradients_reduced_in_fp32_double_the_zero0_traffic():
    m = _m()
    k = dict(dp=8, micro_batch_size=1, dp_overlap=False, gpus_per_node=8)
    a = STEP(m, H100.spec, H100.constants, make_strategy(**k, grad_reduce_fp32=False))
    b = STEP(m, H100.spec, H100.constants, make_strategy(**k))  # bf16: fp32 by default
    # ZeRO-0 all-reduces the gradient once per step, one collective per layer (dp_bucket_size 0:
    # 4 layers), each paying NCCL's latency for 8 ranks in one node (D = 1): the ring's
    # 2·((p - D)·α_intra + (D - 1)·α_inter) = 14·α_intra, which the tree's 2·(k - 1)·α_intra
    # ties. The latency does not depend on the bytes; the bandwidth term doubles with fp32.
    layers = 4
    assert m.num_layers == layers
    alpha = layers * 14 * float(H100.constants.link_latency_s[0])
    assert float(b.dp_comm_total_s) - alpha == pytest.approx(
        2 * (float(a.dp_comm_total_s) - alpha), rel=1e-4
    )


def test_uneven_pipeline_stages_as_megatron_core_splits_them():
    m = model_from_dict(dict(DENSE, num_layers=94), "qwen-depth").spec
    first, last = end_stage_layers(m, make_strategy(pp=8).layout)
    assert (float(first), float(last)) == (11.0, 11.0)  # 11 + 6·12 + 11 = 94
    m61 = model_from_dict(dict(DENSE, num_layers=61), "dsv3-depth").spec
    first, last = end_stage_layers(m61, make_strategy(pp=16).layout)
    assert float(first) + 14 * 4 + float(last) == 61
    out = STEP(m61, H100.spec, H100.constants, make_strategy(pp=16, num_microbatches=16))
    assert bool(out.valid)


def test_hierarchical_all_reduce_by_hand_and_flat_when_one_rank_per_node():
    intra, inter = (1e-6, 300e9), (5e-6, 40e9)
    p, n, k = 32, 1e9, 4  # D = p/k = 8 domains
    # bytes: a reduce-scatter and an all-gather inside the domain (2·3/4·n/β_intra) and an
    # all-reduce of the n/k shard across the 8 domains, ring (2·7/8·(n/4)/β_inter) or tree
    # (2·(n/4)/β_inter). Latency as NCCL's tuner prices the whole collective (tuning.cc): the
    # ring's p - 1 steps, D - 1 of them across domains, 2·((p - D)·α_intra + (D - 1)·α_inter),
    # the tree's 2·((k - 1)·α_intra + ceil(log2 D)·α_inter)
    local = 2 * 3 / 4 * n / 300e9
    ring = 2 * ((32 - 8) * 1e-6 + 7 * 5e-6) + 2 * 7 / 8 * (n / 4) / 40e9
    tree = 2 * (3 * 1e-6 + 3 * 5e-6) + 2 * (n / 4) / 40e9
    want = local + min(ring, tree)
    assert float(coll.hierarchical_all_reduce_s(p, n, k, intra, inter)) == pytest.approx(
        want, rel=1e-6
    )
    flat = float(coll.hierarchical_all_reduce_s(p, n, 1.0, intra, inter))
    assert flat == pytest.approx(float(coll.nccl_all_reduce_s(p, n, *inter)), rel=1e-6)


def test_invalid_moe_and_cp_layouts_are_masked_with_finite_numbers():
    m = _moe()
    bad = [
        make_strategy(dp=2, ep=3),  # 3 does not divide 8 experts
        make_strategy(dp=2, ep=4),  # ep·etp = 4 does not divide tp·cp·dp = 2
        make_strategy(dp=2, shard_size=2),  # HSDP without ZeRO-3
    ]
    for s in bad:
        out = STEP(m, H100.spec, H100.constants, s)
        assert not bool(out.valid) and np.isfinite(float(out.step_time_s))
    dense = _m()
    assert not bool(STEP(dense, H100.spec, H100.constants, make_strategy(dp=2, ep=2)).valid)
    assert not bool(STEP(_m(seq_len=1000), H100.spec, H100.constants, make_strategy(cp=16)).valid)


@pytest.mark.slow
def test_grid_of_new_knobs_equals_one_by_one():
    """Each layout of the new degrees under each stack of the new behaviours: one grid per
    stack (its program compiled for CP and FP8) equals each strategy alone (compiled for what
    it uses)."""
    from perfmodel.search.evaluate import evaluate_grid

    m = _moe()
    layouts = [
        dict(dp=4, tp=2, cp=1, ep=8, zero_stage=1, dtype=2.0),
        dict(dp=2, tp=2, cp=2, ep=4, zero_stage=3, shard_size=2.0, dtype=4.0),
        dict(dp=8, tp=1, cp=1, ep=2, moe_imbalance=1.3, dtype=2.0),
        dict(dp=4, tp=1, cp=2, ep=8, dtype=4.0),
    ]
    stacks = [
        dict(),
        dict(moe_dispatch=1.0),
        dict(cp_comm=1.0, moe_overlap=1.0, tp_overlap=1.0),
    ]
    base = dict(pp=1.0, micro_batch_size=1.0, num_microbatches=2.0, interleave=1.0, schedule=1.0,
                zero_stage=0.0, recompute=0.0, sequence_parallel=0.0, dp_overlap=1.0,
                fused_attention=1.0, gpus_per_node=8.0)  # fmt: skip
    for behaviours in stacks:
        ones = [make_strategy(**(base | lay | behaviours)) for lay in layouts]
        assert len({s.stack for s in ones}) == 1
        leaves = [leaves_of(s) for s in ones]
        cols = {k: np.asarray([float(v[k]) for v in leaves]) for k in leaves[0]}
        grid = stack_strategies(cols, ones[0].stack)
        assert grid.scope.cp and grid.scope.fp8
        out = evaluate_grid(m, H100.spec, H100.constants, grid)
        for i, (lay, one) in enumerate(zip(layouts, ones, strict=True)):
            ref = STEP(m, H100.spec, H100.constants, one)
            assert float(out.step_time_s[i]) == pytest.approx(float(ref.step_time_s), rel=1e-6)
            assert float(out.memory_per_device_bytes[i]) == pytest.approx(
                float(ref.memory_per_device_bytes), rel=1e-6
            )
            assert bool(out.valid[i]), lay
    assert dataclasses.is_dataclass(grid)


def test_hierarchical_all_to_all_by_hand():
    """EP 16 over two nodes of 8: 7/16 of each rank's bytes cross NVLink while 8/16 cross the
    NICs at the same time; one rank per node is the flat all-to-all on the NICs."""
    intra, inter = (1e-6, 300e9), (5e-6, 40e9)
    n = 1e8
    want = max(7 * 1e-6 + 7 / 16 * n / 300e9, 8 * 5e-6 + 8 / 16 * n / 40e9)
    assert float(coll.hierarchical_all_to_all_s(16, n, 8.0, intra, inter)) == pytest.approx(want)
    flat = float(coll.hierarchical_all_to_all_s(16, n, 1.0, intra, inter))
    assert flat == pytest.approx(float(coll.all_to_all_s(16, n, *inter)))


def test_flex_dispatch_sends_a_token_once_per_remote_domain():
    """DeepEP (``--moe-dispatch flex``): EP 32 over 4 nodes of 8, top-8 routing. A token
    reaches ``3·(1-(3/4)^8)`` remote nodes once each, where the all-to-all sends 8·24/32 = 6
    copies over the NICs; within a node both forward over NVLink."""
    m = _moe(num_experts=256, experts_per_token=8, seq_len=4096)
    hw, c = H100.spec, H100.constants
    base = dict(dp=32, ep=32, micro_batch_size=1, gpus_per_node=8)
    a2a = STEP(m, hw, c, make_strategy(**base))
    flex = STEP(m, hw, c, make_strategy(**base, moe_dispatch="flex"))
    assert 0 < float(flex.ep_comm_s) < float(a2a.ep_comm_s)
    a1 = float(c.link_latency_s[1])
    b1 = float(hw.link_bandwidth_bytes_per_s[1] * c.link_bandwidth_efficiency[1])
    token_bytes = 4096 * 256 * 2.0  # one copy of each of this rank's tokens, bf16
    remote = 3 * (1 - 0.75**8)
    one = 3 * a1 + remote * token_bytes / b1  # the NIC side dominates here
    # 4 dispatches/combines per layer (fwd and bwd), 4 layers
    assert float(flex.ep_comm_s) == pytest.approx(16 * one, rel=1e-4)


def test_moe_layer_host_overhead_by_hand():
    """``moe_layer_overhead_s`` adds its value once per MoE layer and microbatch (a third more for
    a recomputed layer's forward) and nothing to a dense model."""
    hw = H100.spec
    on = dataclasses.replace(H100.constants, moe_layer_overhead_s=np.float32(2e-3))
    off = dataclasses.replace(H100.constants, moe_layer_overhead_s=np.float32(0.0))
    m = _moe(dense_layers=1)  # 4 layers, 3 of them MoE
    s = make_strategy(dp=8, ep=8, micro_batch_size=1, num_microbatches=5, gpus_per_node=8)
    gap = float(STEP(m, hw, on, s).step_time_s) - float(STEP(m, hw, off, s).step_time_s)
    assert gap == pytest.approx(5 * 3 * 2e-3, rel=1e-3)
    full = make_strategy(
        dp=8, ep=8, micro_batch_size=1, num_microbatches=5, gpus_per_node=8, recompute="full"
    )
    gap = float(STEP(m, hw, on, full).step_time_s) - float(STEP(m, hw, off, full).step_time_s)
    assert gap == pytest.approx(5 * 3 * 2e-3 * 4 / 3, rel=1e-3)
    d = _m()
    sd = make_strategy(dp=8, micro_batch_size=1, num_microbatches=5, gpus_per_node=8)
    assert float(STEP(d, hw, on, sd).step_time_s) == float(STEP(d, hw, off, sd).step_time_s)
