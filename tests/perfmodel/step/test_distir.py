"""DistIR's cost model against the source document's DistIR numbers, DistIR's formulas by
hand, an op-by-op replay of DistIR's MLP trace, and DistIR's grid enumeration (the command
line's ``--cost-model distir``: tests/aisim/test_perf_estimate.py)."""

from __future__ import annotations

import itertools
from pathlib import Path

import jax
import numpy as np
import pandas as pd
import pytest

from perfmodel import BREAKDOWN_TERMS, load_hardware, load_model, make_strategy
from perfmodel.specs.knobs import LEAF_KNOBS
from perfmodel.specs.model import mlp_from_widths
from perfmodel.specs.strategy import DTYPES, stack_strategies
from perfmodel.step.distir import (
    DISTIR_DEFAULTS,
    DISTIR_STACK,
    all_reduce_s,
    distir_grid_columns,
    distir_step_time,
    op_s,
    send_s,
)

DATA = Path(__file__).parents[3] / "calibration" / "data"
A100 = load_hardware("a100-80gb")
STEP = jax.jit(distir_step_time)
MLP_SMALL = load_model("mlp-small").spec


def _run(spec, **knobs):
    return STEP(spec, A100.spec, A100.constants, make_strategy(**knobs))


def test_defaults_are_distirs_constants():
    d = DISTIR_DEFAULTS
    assert (d["device_throughput_flops_per_s"], d["dram_bandwidth_bytes_per_s"]) == (1.4e13, 9.0e11)
    assert (
        d["kernel_launch_overhead_s"],
        d["network_bandwidth_gbit_per_s"],
        d["bytes_per_gbit"],
    ) == (1e-5, 25.0, 1.25e8)
    assert all("dist_ir/" in v or "examples/" in v for v in d["sources"].values())


def test_formula_hand_values():
    # MatMul 4x8 @ 8x16 in fp16: 10 us + 2·(32+128) B / 9e11 + 2·4·8·16 / 1.4e13
    assert float(op_s(2 * 4 * 8 * 16, 2 * (32 + 128))) == pytest.approx(
        1e-5 + 320 / 9e11 + 1024 / 1.4e13, rel=1e-6
    )
    # the 2.15 GB fp16 gradient of mlp-small on 4 ranks at 25 Gbit/s = 3.125e9 B/s
    grad = 2.0 * 16 * 8192**2
    assert float(all_reduce_s(4, grad)) == pytest.approx(2 * grad * 3 / 4 / 3.125e9, rel=1e-6)
    assert float(all_reduce_s(4, grad)) == pytest.approx(1.0308, abs=1e-4)
    assert float(all_reduce_s(1, grad)) == 0.0
    assert float(send_s(1.25e8)) == pytest.approx(0.04, rel=1e-6)  # 1 Gbit at 25 Gbit/s


def test_seed_dp4_series_within_half_a_percent():
    seed = pd.read_csv(DATA / "seed_distir_vs_colossal.csv")
    sim = seed[seed["kind"] == "simulated"]
    assert len(sim) == 6
    for _, r in sim.iterrows():
        # DistIR runs a single microbatch when pp = 1 (the CSV's num_microbatches is not DistIR's)
        out = _run(
            MLP_SMALL,
            dp=4,
            micro_batch_size=int(r.batch_size) // 4,
            num_microbatches=1,
            dtype="fp16",
        )
        assert bool(out.valid)
        assert float(out.throughput_samples_per_s) == pytest.approx(
            float(r.throughput), rel=0.005
        ), r.batch_size


def test_seed_mlp_small_tp8_within_three_percent():
    seed = pd.read_csv(DATA / "seed_distir_simulation.csv")
    r = seed[seed["model_size"] == "mlp-small"].iloc[0]
    assert (r.world_size, r.hp_degree, r.batch_size) == (8, 8, 128)
    out = _run(MLP_SMALL, tp=8, micro_batch_size=128, dtype="fp32")
    assert float(out.throughput_samples_per_s) == pytest.approx(float(r.throughput), rel=0.03)


def _replay_mlp(L, h, b, t, dp, nbytes):
    """DistIR's MLP training function (examples/mlp.py) after mlp_dhp_transform with pp = 1,
    op by op on one device, with the cost functions of dist_ir/executor/cost_model.py."""
    K, M, P, BW = 1e-5, 9e11, 1.4e13, 25 * 1.25e8

    def matmul(m_, k_, n_):  # (m x k) @ (k x n): reads both operands
        return K + nbytes * (m_ * k_ + k_ * n_) / M + 2 * m_ * k_ * n_ / P

    def elementwise(n_, inputs=1):
        return K + nbytes * n_ * inputs / M + n_ / P

    def allreduce(size_bytes, ranks):
        return 2 * size_bytes * (ranks - 1) / ranks / BW

    time, counter = 0.0, 0
    shapes = (
        [((h, h // t) if i % 2 == 0 else (h // t, h)) for i in range(L)] if t > 1 else [(h, h)] * L
    )
    for k_, n_ in shapes:  # forward: MatMul, all-reduce after every 2nd matmul, Relu
        time += matmul(b, k_, n_)
        counter += 1
        if t > 1 and counter % 2 == 0:
            time += allreduce(nbytes * b * n_, t)
        time += elementwise(b * n_)
    time += 2 * elementwise(b * h)  # Loss, LossGrad (on the labels)
    for k_, n_ in reversed(shapes):  # backward: ReluGrad, MatMulGrad = dz·wᵀ + xᵀ·dz
        time += elementwise(b * n_, 2)
        time += matmul(b, n_, k_) + matmul(k_, b, n_)
        counter += 1
        if t > 1 and counter % 2 == 0:
            time += allreduce(nbytes * b * k_, t)
    if dp > 1:  # one all-reduce per weight gradient, after the backward pass
        time += sum(allreduce(nbytes * k_ * n_, dp) for k_, n_ in shapes)
    k_, n_ = shapes[-1]  # SGD: DistIR keeps only the last (w, dw) pair's cost
    return time + elementwise(k_ * n_, 2)


@pytest.mark.parametrize(
    "L,h,b,t,dp,dtype",
    [
        (8, 512, 16, 1, 1, "fp16"),
        (8, 512, 16, 4, 1, "fp32"),
        (16, 8192, 3, 2, 2, "fp16"),
        (4, 1024, 64, 8, 4, "bf16"),
    ],
)
def test_matches_op_by_op_replay_of_distirs_mlp_trace(L, h, b, t, dp, dtype):
    spec = mlp_from_widths([h] * (L + 1)).spec
    out = _run(spec, dp=dp, tp=t, micro_batch_size=b, dtype=dtype)
    expected = _replay_mlp(L, h, b, t, dp, 4 if dtype == "fp32" else 2)
    assert float(out.step_time_s) == pytest.approx(expected, rel=1e-5)


def test_terms_add_up_and_dp_is_not_overlapped():
    out = _run(MLP_SMALL, dp=2, tp=2, pp=4, micro_batch_size=4, num_microbatches=8, dtype="fp16")
    assert sum(float(getattr(out, k)) for k in BREAKDOWN_TERMS) == pytest.approx(
        float(out.step_time_s), rel=1e-6
    )
    assert float(out.dp_comm_exposed_s) == pytest.approx(float(out.dp_comm_total_s), rel=1e-7)
    # DP overlap, ZeRO and recomputation are not DistIR knobs: they change nothing
    other = _run(
        MLP_SMALL,
        dp=2,
        tp=2,
        pp=4,
        micro_batch_size=4,
        num_microbatches=8,
        dtype="fp16",
        dp_overlap=False,
        zero_stage=1,
        recompute="full",
    )
    assert float(other.step_time_s) == pytest.approx(float(out.step_time_s), rel=1e-7)
    assert float(out.pp_p2p_s) > 0 and float(out.bubble_s) > 0


def test_pipeline_bubble_and_sends_by_hand():
    one = _run(MLP_SMALL, pp=1, micro_batch_size=4, dtype="fp16")
    two = _run(MLP_SMALL, pp=2, micro_batch_size=4, num_microbatches=2, dtype="fp16")
    # per stage and microbatch: half the layers; 1F1B fill/drain = (p-1) stage-microbatches
    stage_mb = float(two.compute_s) / 2
    assert float(two.bubble_s) == pytest.approx(stage_mb, rel=1e-6)
    assert stage_mb == pytest.approx(
        (float(one.compute_s) - 2 * float(op_s(4 * 8192, 2 * 4 * 8192))) / 2
        + 2 * float(op_s(4 * 8192, 2 * 4 * 8192)),
        rel=1e-5,
    )
    act = 2.0 * 4 * 8192  # b x h fp16 activation per send
    assert float(two.pp_p2p_s) == pytest.approx((2 * 2 + 2 * 1) * act / 3.125e9, rel=1e-6)


def test_validity_follows_distirs_transforms():
    assert not bool(_run(MLP_SMALL, pp=3, num_microbatches=2).valid)  # 16 layers in 3 stages
    assert not bool(_run(MLP_SMALL, pp=1, num_microbatches=2).valid)  # one stage, 2 microbatches
    assert not bool(_run(MLP_SMALL, tp=3).valid)
    gpt2 = load_model("gpt2").spec
    assert bool(_run(gpt2, tp=8, micro_batch_size=1).valid)  # DistIR only needs heads >= tp
    assert not bool(_run(gpt2, tp=16, micro_batch_size=1).valid)


def _reference_grid(n, batch):
    """examples/grid_search.py gen_configurations, written as the loops it is."""
    rows = []
    pows = [2**i for i in range(n.bit_length())]
    for d, h, p in itertools.product(pows, pows, pows):
        if d * h * p != n or batch // d == 0:
            continue
        for k in [1] if p == 1 else [2**j for j in range(1, 8)]:
            if (batch // d) // k and batch % (d * k) == 0:
                rows.append((d, h, p, batch // (d * k), k))
    return sorted(rows)


@pytest.mark.parametrize("n,batch", [(1, 8), (4, 4), (8, 128), (16, 64), (6, 12)])
def test_grid_columns_match_distirs_enumeration(n, batch):
    cols = distir_grid_columns(n, batch)
    assert set(cols) == {k.name for k in LEAF_KNOBS}
    names = ("dp", "tp", "pp", "micro_batch_size", "num_microbatches")
    got = sorted(zip(*(cols[k].astype(int).tolist() for k in names), strict=True))
    assert got == _reference_grid(n, batch)
    if got:
        assert np.all(cols["dtype"] == DTYPES.index("fp16"))
    # DistIR's stack: no DP overlap, no fused attention
    assert DISTIR_STACK.dp_overlap is False and DISTIR_STACK.fused_attention is False


def test_grid_vmap_equals_one_by_one():
    cols = distir_grid_columns(8, 128)
    grid = stack_strategies(cols, DISTIR_STACK)
    out = jax.jit(jax.vmap(distir_step_time, in_axes=(None, None, None, 0)))(
        MLP_SMALL, A100.spec, A100.constants, grid
    )
    for i in (0, 3, len(cols["dp"]) - 1):
        one = STEP(MLP_SMALL, A100.spec, A100.constants, jax.tree.map(lambda x, i=i: x[i], grid))
        assert float(out.step_time_s[i]) == pytest.approx(float(one.step_time_s), rel=1e-6)
