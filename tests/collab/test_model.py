"""The model sizes (collab.scenario_model) against hand values: one server round of two sites
term by term, the ring all-reduce, compression bytes, the pipeline on perfmodel's step time, the
source's four shares adding up to 100 %, vmap over sizes == one by one, and the sites' work going
through the one round model (collab.collab_round) that real models use too."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

import collab
from collab.scenario_model import exchange, site_work
from perfmodel import load_hardware, mlp_from_params
from perfmodel.step.collectives import all_reduce_s
from perfmodel.step.step_time import step_time

A100 = load_hardware("a100-80gb")
CPU = load_hardware("cpu-host")


def _sites(**kw):
    a = collab.make_site(A100, local_steps=100, up_bytes_per_s=1.25e8, overhead_s=2.0, **kw)
    b = collab.make_site(A100, local_steps=50, up_bytes_per_s=2.5e8, down_bytes_per_s=5e8, **kw)
    return collab.stack([a, b])


@pytest.mark.slow
def test_server_round_matches_hand_computation():
    m = mlp_from_params("20M").spec
    sites, agg = _sites(), collab.make_aggregator(CPU, time_factor=3.0)
    tl = collab.round_timeline(m, sites, agg, collab.make_setup())
    n = float(m.num_layers * m.hidden_size**2)  # bias-free square MLP
    nbytes = 4.0 * n
    step = [
        float(collab.local_step_s(m, jax.tree.map(lambda x, i=i: x[i], sites))) for i in range(2)
    ]
    eff, lat = 0.9, 0.02  # the a100-80gb preset's wan tier
    ser, deser = collab.SERDE_DEFAULT_BYTES_PER_S["msgpack"]
    arrival = [
        lat
        + nbytes / (1.25e8 * eff)
        + nbytes / deser
        + 100 * step[0]
        + 2.0
        + nbytes / ser
        + lat
        + nbytes / (1.25e8 * eff),
        lat
        + nbytes / (5e8 * eff)
        + nbytes / deser
        + 50 * step[1]
        + nbytes / ser
        + lat
        + nbytes / (2.5e8 * eff),
    ]
    assert float(tl.params) == pytest.approx(n)
    assert np.asarray(tl.compute_s) == pytest.approx([100 * step[0] + 2.0, 50 * step[1]], rel=1e-5)
    agg_s = float(tl.other_s[0])
    assert agg_s > 2 * nbytes / deser + nbytes / ser  # the server's serde plus the reduction
    assert float(tl.round_s) == pytest.approx(max(arrival) + agg_s, rel=1e-5)
    # the slow site waits for nobody, the fast one for the difference
    assert float(tl.idle_s[0]) == pytest.approx(0.0, abs=1e-4)
    assert float(tl.idle_s[1]) == pytest.approx(arrival[0] - arrival[1], rel=1e-4)
    # the source's shares: waiting counts as communication
    shares = np.asarray(collab.source_shares(tl))
    np.testing.assert_allclose(shares.sum(axis=-1), 100.0, atol=1e-3)
    np.testing.assert_allclose(
        shares[:, 1], 100 * np.asarray(tl.communication_s + tl.idle_s) / float(tl.round_s)
    )
    # the client that waits computes for a smaller share of the wall time than of its busy time
    busy = float(tl.round_s - tl.idle_s[1])
    assert float(tl.compute_share_of_busy_pct[1]) == pytest.approx(
        100 * float(tl.compute_s[1]) / busy, rel=1e-5
    )
    assert float(tl.compute_share_of_busy_pct[1]) > float(tl.compute_utilization_pct[1])


def test_step_time_is_perfmodels_with_dp_over_the_sites_devices():
    m = mlp_from_params("60M").spec
    site = collab.make_site(A100, devices=8, micro_batch_size=32)
    from perfmodel import make_strategy

    ref = step_time(
        m, A100.spec, A100.constants, make_strategy(dp=8, micro_batch_size=32, dtype="fp32")
    )
    assert float(collab.local_step_s(m, site)) == pytest.approx(float(ref.step_time_s), rel=1e-6)


@pytest.mark.slow  # a property over many drawn rings, each a compiled sweep
def test_ring_all_reduce_is_bounded_by_the_slowest_link():
    m = mlp_from_params("10M").spec
    sites = _sites()
    tl = collab.round_timeline(
        m, sites, collab.make_aggregator(CPU), collab.make_setup(topology="ring")
    )
    nbytes = 4.0 * float(m.num_layers * m.hidden_size**2)
    ring = float(all_reduce_s(2, nbytes, 0.02, 1.25e8 * 0.9))
    assert float(tl.upload_s[0] + tl.download_s[0]) == pytest.approx(ring, rel=1e-5)


@pytest.mark.slow  # a several-second compile (pyproject's markers)
@pytest.mark.parametrize("compression, ratio", [("fp16", 0.5), ("int8", 0.25), ("topk", 0.02)])
def test_compression_shrinks_the_payload(compression, ratio):
    m = mlp_from_params("10M").spec
    args = (m, _sites(), collab.make_aggregator(CPU))
    base = collab.round_timeline(*args, collab.make_setup("data-parallel"))
    comp = collab.round_timeline(
        *args, collab.make_setup("data-parallel", compression=compression, topk_fraction=0.01)
    )
    assert float(comp.upload_bytes) == pytest.approx(ratio * float(base.upload_bytes), rel=1e-6)
    assert float(comp.round_s) < float(base.round_s)


@pytest.mark.slow  # a pipelined round and a pipelined step, each compiled
def test_pipeline_uses_step_times_pipeline_with_the_wan_as_pp_tier():
    m = mlp_from_params("100M").spec
    sites = collab.stack(
        [collab.make_site(A100, devices=2, micro_batch_size=16, up_bytes_per_s=1.25e8)] * 2
    )
    tl = collab.round_timeline(
        m, sites, collab.make_aggregator(CPU), collab.make_setup("pipeline", num_microbatches=8)
    )
    from perfmodel import make_strategy

    wan_tier_hw = A100.replace_spec(link_bandwidth_bytes_per_s=[3e11, 1.25e8, 1.25e8])
    c = dataclasses.replace(
        A100.constants,
        link_latency_s=np.asarray([3e-6, 0.02, 0.02], np.float32),
        link_bandwidth_efficiency=np.asarray([0.75, 0.9, 0.9], np.float32),
    )
    ref = step_time(
        m,
        wan_tier_hw.spec,
        c,
        make_strategy(
            dp=2, pp=2, micro_batch_size=16, num_microbatches=8, dtype="fp32", gpus_per_node=2
        ),
    )
    p2p = float(tl.upload_s[0] + tl.download_s[0])
    assert (
        p2p == pytest.approx(float(ref.pp_p2p_s), rel=1e-5) and p2p > 0.3
    )  # 18 WAN messages of 20 ms
    assert float(tl.round_s) == pytest.approx(
        float(ref.step_time_s + tl.serialization_s[0]), rel=1e-5
    )
    assert float(tl.idle_s[0]) == pytest.approx(float(ref.bubble_s), rel=1e-4)
    # compute is all of the step but the WAN sends and the bubble (the optimiser included, as
    # a local step's time includes it in the other modes)
    compute = ref.step_time_s - ref.pp_p2p_s - ref.bubble_s
    assert float(tl.compute_s[0]) == pytest.approx(float(compute), rel=1e-5)
    np.testing.assert_allclose(np.asarray(tl.other_s), 0.0)


@pytest.mark.slow  # a vmapped sweep compiled beside the one-size program
def test_sweep_equals_one_by_one():
    sizes = ["10M", "40M", "100M"]
    sites, agg, setup = _sites(), collab.make_aggregator(CPU), collab.make_setup()
    many = collab.sweep(collab.size_models(sizes), sites, agg, setup)
    for i, s in enumerate(sizes):
        one = collab.round_timeline(mlp_from_params(s).spec, sites, agg, setup)
        for k in ("compute_utilization_pct", "compute_share_of_busy_pct", "idle_s"):
            np.testing.assert_allclose(
                np.asarray(getattr(many, k)[i]), np.asarray(getattr(one, k)), rtol=1e-5, atol=1e-6
            )
        assert float(many.round_s[i]) == pytest.approx(float(one.round_s), rel=1e-5)


@pytest.mark.slow  # the round's gradient: a compile of its own
def test_gradient_of_round_time_is_finite():
    m = mlp_from_params("20M").spec
    agg, setup = collab.make_aggregator(CPU), collab.make_setup()

    def f(bw):
        sites = dataclasses.replace(_sites(), up_bytes_per_s=bw, down_bytes_per_s=bw)
        return collab.round_timeline(m, sites, agg, setup).round_s

    g = jax.grad(f)(np.asarray([1.25e8, 2.5e8], np.float32))
    assert np.all(np.isfinite(np.asarray(g))) and float(g[0]) < 0.0


def test_the_sites_work_goes_through_the_one_round_model():
    m = mlp_from_params("40M").spec
    sites, agg = _sites(), collab.make_aggregator(CPU, time_factor=2.0)
    for setup in (collab.make_setup(), collab.make_setup(topology="ring", compression="int8")):
        n = jax.numpy.asarray(2.0)
        work = jax.vmap(site_work, in_axes=(None, 0, None, None, None))(m, sites, agg, setup, n)
        direct = collab.collab_round(work, exchange(m, agg, setup, n))
        tl = collab.round_timeline(m, sites, agg, setup)
        assert float(direct.round_s) == pytest.approx(float(tl.round_s), rel=1e-6)
        # a site's step is perfmodel's, and its compute that step times its local steps
        step = [
            float(collab.local_step_s(m, jax.tree.map(lambda x, i=i: x[i], sites))) for i in (0, 1)
        ]
        np.testing.assert_allclose(np.asarray(work.step_s), step, rtol=1e-6)
        np.testing.assert_allclose(
            np.asarray(tl.compute_s), [100 * step[0] + 2.0, 50 * step[1]], rtol=1e-5
        )
