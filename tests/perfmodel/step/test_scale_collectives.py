"""Communication at thousands of ranks: NCCL's ring and tree latencies, one collective per layer
or bucket, fabric congestion across leaf groups, and runs of 4,000 and more GPUs."""

from __future__ import annotations

import math

import jax
import pytest

from perfmodel import load_hardware, load_model, make_strategy, step_time
from perfmodel.step import collectives as coll
from perfmodel.step.memory import stage_params_split

A100 = load_hardware("a100-80gb")
STEP = jax.jit(step_time)
US = 1e-6


def test_ring_latency_counts_every_rank():
    # NCCL's tuner (src/graph/tuning.cc): a ring all-gather of p ranks over D nodes takes p-1
    # steps, D-1 across nodes: 1,536 A100s in 192 nodes of 8 with α 3 µs (NVLink) and 5 µs
    # (InfiniBand): (1536 - 192)·3 µs + 191·5 µs = 4.032 ms + 0.955 ms = 4.987 ms per
    # collective; the hierarchical estimate counted (8 - 1)·3 + 191·5 µs = 0.976 ms
    assert float(coll.ring_latency_s(1536, 8, 3 * US, 5 * US)) == pytest.approx(4.987e-3, rel=1e-5)
    # inside one node it is the ring's p - 1 steps
    assert float(coll.ring_latency_s(8, 8, 3 * US, 5 * US)) == pytest.approx(21 * US, rel=1e-6)
    # one rank per node: every step crosses
    assert float(coll.ring_latency_s(16, 1, 3 * US, 5 * US)) == pytest.approx(75 * US, rel=1e-6)


def test_all_reduce_takes_the_tree_at_scale():
    intra, inter = (3 * US, 225e9), (5 * US, 20e9)
    # a 4-byte all-reduce over 1,024 ranks (128 nodes of 8): the ring pays
    # 2·((1024 - 128)·3 + 127·5) µs = 6.646 ms, the tree 2·(7·3 + 7·5) µs = 112 µs
    t = float(coll.hierarchical_all_reduce_s(1024, 4.0, 8, intra, inter))
    assert t == pytest.approx(112 * US, rel=1e-3)
    # a large one inside a node is the ring all-reduce on NVLink
    n = 1e9
    assert float(coll.hierarchical_all_reduce_s(8, n, 8, intra, inter)) == pytest.approx(
        float(coll.all_reduce_s(8, n, 3 * US, 225e9)), rel=1e-6
    )
    # count collectives pay count latencies and the same bytes
    one = float(coll.hierarchical_reduce_scatter_s(64, n, 8, intra, inter, 1.0))
    ten = float(coll.hierarchical_reduce_scatter_s(64, n, 8, intra, inter, 10.0))
    assert ten - one == pytest.approx(9 * float(coll.ring_latency_s(64, 8, 3 * US, 5 * US)))


def test_fabric_efficiency_by_hand():
    # 192 DGX A100 nodes over leaf groups of 20 (the DGX SuperPOD scalable unit), c = 0.05:
    # 1 / (1 + 0.05·log2(192/20)) = 1 / (1 + 0.05·3.263) = 0.8597
    assert float(coll.fabric_efficiency(192.0, 20.0, 0.05)) == pytest.approx(
        1.0 / (1.0 + 0.05 * math.log2(9.6)), rel=1e-6
    )
    assert float(coll.fabric_efficiency(20.0, 20.0, 0.05)) == 1.0  # one leaf group
    assert float(coll.fabric_efficiency(192.0, 0.0, 0.05)) == 1.0  # not modelled


def _zero3_175b(bucket):
    # GPT-3 175B with ZeRO-3 and no model parallelism on 1,536 A100s (192 DGX nodes), one
    # sequence per GPU and step, full recomputation
    s = make_strategy(dp=1536, micro_batch_size=1, num_microbatches=1, recompute="full",
                      zero_stage=3, fused_attention=True, dp_bucket_size=bucket)  # fmt: skip
    return s, STEP(load_model("gpt3-175b").spec, A100.spec, A100.constants, s)


@pytest.mark.slow
def test_flat_zero3_over_192_nodes_is_latency_bound():
    m = load_model("gpt3-175b").spec
    per_layer, a = _zero3_175b(0.0)
    bucketed, b = _zero3_175b(5e7)
    # hand: every microbatch gathers the weights twice (forward, backward after resharding)
    # and reduce-scatters the gradients once: 3 passes. Per layer (FSDP) each pass is 96
    # collectives; in DeepSpeed's 5e7-element buckets (stage3_prefetch_bucket_size) it is
    # ceil(params / 5e7); each pays the 1,536-rank ring latency of 4.987 ms
    dense, _ = stage_params_split(m, per_layer.layout)
    buckets = math.ceil(float(dense) / 5e7)
    lat = float(coll.ring_latency_s(1536, 8, 3 * US, 5 * US))
    delta = float(b.dp_comm_total_s) - float(a.dp_comm_total_s)
    assert delta == pytest.approx(3 * (buckets - 96) * lat, rel=1e-4)
    assert 3 * 96 * lat == pytest.approx(1.436, rel=1e-3)  # seconds per microbatch, per layer
    # the run was about 3x slower than the one-collective-per-pass estimate predicted; with
    # DeepSpeed's granularity the step is that much slower than it
    _, once = _zero3_175b(1e12)
    assert float(b.step_time_s) / float(once.step_time_s) > 2.5
    assert float(a.step_time_s) > float(once.step_time_s)


def test_weak_scaling_gb200_stays_flat():
    # NVIDIA dgxc v25.05 Llama 3.1 405B BF16 on GB200 NVL72: 9.347 / 9.484 / 9.508 s at 128 /
    # 256 / 512 GPUs (+1.7%; TP 4, PP 8, CP 2, VP 8, MBS 1, GBS 32 per DP rank). What this model
    # adds at scale (the DP collectives and the fixed per-step costs) grows by under 1.8% of
    # the step
    m, hw = load_model("llama3-405b").spec, load_hardware("gb200")
    costs = []
    for dp in (2, 4, 8):
        s = make_strategy(dp=dp, tp=4, pp=8, cp=2, interleave=8, schedule="interleaved",
                          micro_batch_size=1, num_microbatches=32, gpus_per_node=72,
                          sequence_parallel=True, fused_attention=True, zero_stage=1,
                          tp_overlap=True)  # fmt: skip
        out = STEP(m, hw.spec, hw.constants, s)
        costs.append((float(out.dp_comm_exposed_s + out.step_overhead_s), float(out.step_time_s)))
    assert (costs[-1][0] - costs[0][0]) / costs[0][1] < 0.018


def test_llama3_405b_on_16k_h100():
    # Dubey et al. 2024 (arXiv:2407.21783) Table 4: Llama 3 405B, TP 8, PP 16, seq 8,192, 16M
    # tokens per step: 8,192 GPUs (DP 64) at 43% BF16 MFU, 16,384 GPUs (DP 128) at 41%
    m, hw = load_model("llama3-405b").spec, load_hardware("h100-sxm")
    for dp, mfu in ((64, 0.43), (128, 0.41)):
        s = make_strategy(dp=dp, tp=8, pp=16, micro_batch_size=1, num_microbatches=2048 // dp,
                          schedule="interleaved", interleave=4, sequence_parallel=True,
                          fused_attention=True, zero_stage=1, tp_overlap=True)  # fmt: skip
        out = STEP(m, hw.spec, hw.constants, s)
        assert float(out.mfu) == pytest.approx(mfu, abs=0.06)
        scale = float(out.dp_comm_exposed_s + out.step_overhead_s) / float(out.step_time_s)
        assert scale < 0.08


def test_megascale_175b_on_12288_gpus():
    # Jiang et al. 2024 (MegaScale): a 175B model on 12,288 GPUs at 55.2% MFU; GPT-3 175B on
    # 12,288 A100s with TP 8, PP 8, DP 192, 6,144 sequences per step
    s = make_strategy(dp=192, tp=8, pp=8, micro_batch_size=1, num_microbatches=32,
                      schedule="interleaved", interleave=2, sequence_parallel=True,
                      fused_attention=True, zero_stage=1, tp_overlap=True,
                      recompute="selective")  # fmt: skip
    out = STEP(load_model("gpt3-175b").spec, A100.spec, A100.constants, s)
    assert float(out.mfu) == pytest.approx(0.552, abs=0.08)
