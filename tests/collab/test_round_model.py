"""The one round model (collab.round_model): hand values of the ring, the server and the
pipeline, both utilisations by their definitions, conservation of each site's time, the sign of
each knob, streaming DiLoCo's overlap, deadline, churn and a fixed window, the one jit(vmap)
against a loop, and a gradient through it."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from collab import PAYLOAD_BYTES, Exchange, PipelineStage, SiteWork, collab_round, round_grid, stack

GBPS = 125e6  # bytes/s
_round = jax.jit(collab_round)


def sites(n=3, step=20.0, bw=GBPS, lat=0.05, devices=8.0, h=100.0, **kw):
    f = np.float32
    one = np.ones(n, f)
    leaves = dict(
        step_s=step * one, local_steps=h * one, overhead_s=0 * one, devices=devices * one,
        peak_flops_per_s=989e12 * one, mfu=0.4 * one, tokens_per_step=1e6 * one,
        up_bytes_per_s=bw * one, down_bytes_per_s=bw * one, latency_s=lat * one,
        link_efficiency=one, serialize_bytes_per_s=np.full(n, np.inf, f),
        deserialize_bytes_per_s=np.full(n, np.inf, f), reduce_s=0 * one,
    )  # fmt: skip
    for k, v in kw.items():
        leaves[k] = np.asarray(v, f) * one
    return SiteWork(**leaves)


def wan(params=1e9, **kw):
    f = jnp.float32
    nums = dict(
        params=params, fragments=1.0, wan_efficiency=1.0, churn_rate=0.0, state_bytes=8.0 * params,
        deadline_s=0.0, topk_fraction=0.01, server_bytes_per_s=GBPS, server_s=0.0,
        tcp_window_bytes=math.inf, window_s=0.0,
    )  # fmt: skip
    static = {k: kw.pop(k) for k in ("mode", "topology", "compression", "overlap") if k in kw}
    nums.update(kw)
    return Exchange(**{k: jnp.asarray(v, f) for k, v in nums.items()}, **static)


def test_ring_sync_is_the_hand_formula_and_both_utilisations_are_their_definitions():
    r = _round(sites(3), wan(compression="int8"))
    payload = 1e9 * PAYLOAD_BYTES["int8"]
    hand = 2 * 2 * 0.05 + 2 * 2 / 3 * payload / GBPS
    assert float(r.sync_s) == pytest.approx(hand, rel=1e-5)
    compute = 100 * 20.0
    assert float(r.round_s) == pytest.approx(compute + hand, rel=1e-5)
    # nothing idles: compute / wall time = compute / (compute + communication)
    util = 100 * compute / (compute + hand)
    assert float(r.overall_compute_utilization_pct) == pytest.approx(util, rel=1e-5)
    assert float(r.overall_compute_share_of_busy_pct) == pytest.approx(util, rel=1e-5)
    np.testing.assert_allclose(r.bytes_sent, 2 * 2 / 3 * payload, rtol=1e-6)


def test_the_two_utilisations_differ_by_the_idle_time_by_hand():
    # two sites of 8 and one of 16 devices; the last one's steps take 30 s, the others' 20 s
    s = dataclasses.replace(
        sites(3, h=10.0),
        step_s=np.array([20.0, 20.0, 30.0], np.float32),
        devices=np.array([8.0, 8.0, 16.0], np.float32),
    )
    r = _round(s, wan(compression="int8"))
    sync = 2 * 2 * 0.05 + 2 * 2 / 3 * 1e9 / GBPS
    round_s, compute = 300.0 + sync, np.array([200.0, 200.0, 300.0])
    idle = round_s - compute - sync
    np.testing.assert_allclose(r.idle_s, idle, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(r.compute_utilization_pct, 100 * compute / round_s, rtol=1e-5)
    np.testing.assert_allclose(
        r.compute_share_of_busy_pct, 100 * compute / (compute + sync), rtol=1e-5
    )
    w = np.array([8.0, 8.0, 16.0])
    assert float(r.overall_compute_utilization_pct) == pytest.approx(
        100 * (w @ compute) / (round_s * w.sum()), rel=1e-5
    )
    assert float(r.overall_compute_share_of_busy_pct) == pytest.approx(
        100 * (w @ compute) / (w @ (compute + sync)), rel=1e-5
    )


def test_covenants_published_figure_is_compute_over_compute_plus_communication():
    # a 1380 s window, 30 inner steps of 40 s and an exchange of 70 s: 94.5 % of the busy time
    # (the source's 94.5 %), 87.0 % of the wall time
    s = sites(1, step=40.0, h=30.0, lat=0.0)
    payload_s = 35.0  # upload then download, 35 s each: 70 s
    x = wan(params=35.0 * GBPS / 4.0, topology="server",
            server_bytes_per_s=1e15, window_s=1380.0)  # fmt: skip
    r = _round(s, x)
    assert float(r.sync_s) == pytest.approx(2 * payload_s, rel=1e-5)
    assert float(r.round_s) == pytest.approx(1380.0)
    assert float(r.overall_compute_share_of_busy_pct) == pytest.approx(
        100 * 1200 / (1200 + 70), rel=1e-5
    )
    assert float(r.overall_compute_utilization_pct) == pytest.approx(100 * 1200 / 1380, rel=1e-5)
    assert round(float(r.overall_compute_share_of_busy_pct), 1) == 94.5


def test_the_tcp_window_caps_a_long_link_at_window_over_rtt():
    # 3 sites, 1 Gbit/s lines, 50 ms one way (RTT 0.1 s), 4 MB window: 4e6 / 0.1 = 40 MB/s < 125 MB/s
    payload = 1e9 * PAYLOAD_BYTES["int8"]
    r = _round(sites(3), wan(compression="int8", tcp_window_bytes=4e6))
    hand = 2 * 2 * 0.05 + 2 * 2 / 3 * payload / 40e6
    assert float(r.sync_s) == pytest.approx(hand, rel=1e-5)
    far = _round(sites(3, lat=0.1), wan(compression="int8", tcp_window_bytes=4e6))
    assert float(far.sync_s) == pytest.approx(2 * 2 * 0.1 + 2 * 2 / 3 * payload / 20e6, rel=1e-5)
    # a window above the bandwidth-delay product (125 MB/s x 0.1 s = 12.5 MB) changes nothing
    wide = _round(sites(3), wan(compression="int8", tcp_window_bytes=20e6))
    free = _round(sites(3), wan(compression="int8"))
    assert float(wide.sync_s) == pytest.approx(float(free.sync_s), rel=1e-6)
    # server: each site's upload and download capped by its own RTT (2 x 0.05 s)
    srv = _round(
        sites(2),
        wan(compression="int8", topology="server", tcp_window_bytes=4e6, server_bytes_per_s=1e12),
    )
    assert float(srv.sync_s) == pytest.approx(2 * (0.05 + payload / 40e6), rel=1e-4)
    # a newcomer's state download (8 GB) is capped the same way
    churn = _round(sites(3), wan(churn_rate=0.1, tcp_window_bytes=4e6))
    assert float(churn.churn_s) == pytest.approx(0.3 * (0.05 + 8e9 / 40e6), rel=1e-5)


def test_server_sync_is_bounded_by_the_servers_own_link():
    # three sites upload 1 GB each over 1 Gbit/s, the server takes 3 GB in over the same rate
    r = _round(sites(3, lat=0.0), wan(topology="server", compression="int8"))
    assert float(r.sync_s) == pytest.approx(2 * 3 * 1e9 / GBPS, rel=1e-5)
    np.testing.assert_allclose(r.communication_s, float(r.sync_s), rtol=1e-5)
    fast = wan(topology="server", compression="int8", server_bytes_per_s=100 * GBPS)
    assert float(_round(sites(3, lat=0.0), fast).sync_s) == pytest.approx(2 * 1e9 / GBPS, rel=1e-5)


def test_a_blocking_server_round_is_each_sites_chain_by_hand():
    # site 1 computes 10 s and has a slow uplink (10 MB/s), site 2 computes 30 s on fast links:
    # the round is the longest chain download + deserialise + compute + serialise + upload, then
    # the server's average; each site waits for the rest
    s = dataclasses.replace(
        sites(2, h=1.0, lat=0.01, serialize_bytes_per_s=1e9, deserialize_bytes_per_s=2e9),
        step_s=np.array([10.0, 30.0], np.float32),
        up_bytes_per_s=np.array([1e7, 1e9], np.float32),
        down_bytes_per_s=np.array([1e9, 1e9], np.float32),
    )
    x = wan(params=1e8, topology="server", server_bytes_per_s=np.inf, server_s=0.5)
    r = _round(s, x)
    nbytes = 4e8
    chains = [
        (0.01 + nbytes / 1e9) + nbytes / 2e9 + 10.0 + nbytes / 1e9 + (0.01 + nbytes / 1e7),
        (0.01 + nbytes / 1e9) + nbytes / 2e9 + 30.0 + nbytes / 1e9 + (0.01 + nbytes / 1e9),
    ]
    assert float(r.round_s) == pytest.approx(max(chains) + 0.5, rel=1e-5)
    np.testing.assert_allclose(r.idle_s, max(chains) - np.array(chains), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(r.other_s, 0.5)
    np.testing.assert_allclose(r.serialization_s, nbytes / 1e9 + nbytes / 2e9, rtol=1e-6)


@pytest.mark.parametrize(
    "kw",
    [
        dict(mode="diloco"),
        dict(mode="data-parallel", compression="bf16"),
        dict(mode="streaming-diloco", fragments=4.0, overlap=True),
        dict(mode="diloco", overlap=True, churn_rate=0.1),
        dict(mode="fedavg", topology="server", compression="topk"),
        dict(mode="fedavg", topology="server", server_s=3.0),
        dict(mode="diloco", topology="server", server_s=3.0, overlap=True, churn_rate=0.1),
    ],
)
def test_each_sites_phases_add_up_to_the_round(kw):
    s = dataclasses.replace(sites(3), step_s=np.array([10.0, 20.0, 15.0], np.float32))
    r = _round(s, wan(**kw))
    total = r.compute_s + r.communication_s + r.serialization_s + r.other_s + r.idle_s
    np.testing.assert_allclose(total, r.round_s, rtol=1e-5)
    shares = (
        r.compute_utilization_pct
        + r.communication_share_pct
        + r.serialization_share_pct
        + r.other_share_pct
        + r.idle_share_pct
    )
    np.testing.assert_allclose(shares, 100.0, rtol=1e-5)
    # the slowest site never waits; the fastest waits for it
    assert float(r.idle_s[1]) == pytest.approx(0.0, abs=1e-3)
    assert float(r.idle_s[0]) > 0


def test_the_sign_of_each_published_knob():
    def util(s, x):
        return float(_round(s, x).overall_compute_utilization_pct)

    # more inner steps per sync: higher utilisation (DiLoCo, INTELLECT-1 H=100 vs DP)
    assert util(sites(h=10.0), wan()) < util(sites(h=100.0), wan()) < util(sites(h=500.0), wan())
    c8 = _round(sites(), wan(compression="int8")).communication_s
    c16 = _round(sites(), wan(compression="bf16")).communication_s
    assert float(c8[0]) < float(c16[0])
    assert float(_round(sites(4), wan()).sync_s) > float(_round(sites(2), wan()).sync_s)
    assert util(sites(bw=GBPS), wan()) < util(sites(bw=10 * GBPS), wan())


def test_streaming_diloco_hides_fragments_behind_the_next_inner_steps():
    s = sites(3, step=20.0)
    blocking = _round(s, wan(mode="diloco", compression="bf16"))
    stream = _round(s, wan(mode="streaming-diloco", fragments=4.0, overlap=True))
    assert float(stream.overall_compute_utilization_pct) == pytest.approx(100.0, abs=1e-3)
    assert float(blocking.overall_compute_utilization_pct) < 100.0
    plain = _round(s, wan(mode="streaming-diloco", fragments=4.0))
    full = _round(s, wan(mode="diloco"))
    assert float(plain.round_s) >= float(full.round_s) - 1e-3
    short = _round(
        sites(3, step=0.01, h=4.0), wan(mode="streaming-diloco", fragments=4.0, overlap=True)
    )
    per = float(short.sync_s) / 4.0
    assert float(short.round_s) == pytest.approx(4 * 0.01 + 4 * (per - 0.01), rel=1e-4)


def test_a_deadline_drops_the_slow_site_and_churn_costs_a_state_download():
    s = dataclasses.replace(sites(3), step_s=np.array([10.0, 10.0, 50.0], np.float32))
    r = _round(s, wan(deadline_s=2000.0))
    np.testing.assert_array_equal(r.dropped, [0.0, 0.0, 1.0])
    assert float(r.compute_utilization_pct[2]) == 0.0
    assert float(r.idle_share_pct[2]) == pytest.approx(100.0)
    assert float(r.compute_share_of_busy_pct[2]) == 0.0
    assert float(r.tokens_per_round) == pytest.approx(2 * 100 * 1e6)
    s2 = dataclasses.replace(s, step_s=np.array([10.0, 12.0, 50.0], np.float32))
    np.testing.assert_array_equal(_round(s2, wan(deadline_s=1.0)).dropped, [0, 1, 1])
    churn = _round(sites(3), wan(churn_rate=0.1))
    hand = min(1.0, 0.1 * 3) * (0.05 + 8e9 / GBPS)
    assert float(churn.churn_s) == pytest.approx(hand, rel=1e-5)
    assert float(churn.round_s) == pytest.approx(
        float(_round(sites(3), wan()).round_s) + hand, rel=1e-5
    )


def test_a_fixed_window_sets_the_round_and_the_inner_steps_get_what_the_exchange_leaves():
    payload = 1e9 * PAYLOAD_BYTES["int8"]
    hand = 2 * 2 * 0.05 + 2 * 2 / 3 * payload / GBPS
    r = _round(sites(3), wan(compression="int8", window_s=2500.0))
    assert float(r.round_s) == pytest.approx(2500.0)
    np.testing.assert_allclose(r.compute_s, 2000.0, rtol=1e-6)
    np.testing.assert_allclose(r.idle_s, 2500.0 - 2000.0 - hand, rtol=1e-5)
    assert float(r.overall_compute_utilization_pct) == pytest.approx(80.0, rel=1e-6)
    # the time not idle is compute and the exchange
    assert float(r.overall_compute_share_of_busy_pct) == pytest.approx(
        100 * 2000 / (2000 + hand), rel=1e-5
    )
    assert float(r.tokens_per_round) == pytest.approx(3 * 100 * 1e6, rel=1e-6)
    w = _round(sites(3), wan(compression="int8", window_s=2000.0))
    np.testing.assert_allclose(w.compute_s, 2000.0 - hand, rtol=1e-5)
    np.testing.assert_allclose(w.idle_s, 0.0, atol=1e-3)
    assert float(w.tokens_per_round) == pytest.approx(3 * (2000.0 - hand) / 20.0 * 1e6, rel=1e-5)
    x = _round(sites(3), wan(compression="int8", window_s=0.5 * hand))
    assert float(x.round_s) == pytest.approx(hand, rel=1e-6)
    assert float(x.overall_compute_utilization_pct) == 0.0


def test_a_pipeline_round_by_hand():
    # 2 stages: a 10 s step of which 3 s WAN sends and 2 s bubble; 1 GB of messages per step
    stage = PipelineStage(
        p2p_s=np.full(2, 3.0, np.float32),
        bubble_s=np.full(2, 2.0, np.float32),
        message_bytes=np.full(2, 1e9, np.float32),
    )
    s = dataclasses.replace(
        sites(2, step=10.0, serialize_bytes_per_s=1e9, deserialize_bytes_per_s=2e9), stage=stage
    )
    r = _round(s, wan(mode="pipeline"))
    np.testing.assert_allclose(r.compute_s, 5.0)
    np.testing.assert_allclose(r.communication_s, 3.0)
    np.testing.assert_allclose(r.serialization_s, 1.5)
    np.testing.assert_allclose(r.idle_s, 2.0)
    assert float(r.round_s) == pytest.approx(11.5)
    np.testing.assert_allclose(r.compute_share_of_busy_pct, 100 * 5.0 / 9.5, rtol=1e-6)


def test_the_grid_is_the_loop():
    hs = [10.0, 100.0, 500.0]
    bws = [GBPS, 4 * GBPS, GBPS]
    ss = [sites(bw=b, h=h) for b, h in zip(bws, hs, strict=True)]
    xs = [wan(compression="int8", window_s=w) for w in (0.0, 0.0, 5000.0)]
    grid = round_grid(stack(ss), stack(xs))
    for i, (s, x) in enumerate(zip(ss, xs, strict=True)):
        one = collab_round(s, x)
        assert float(grid.round_s[i]) == pytest.approx(float(one.round_s), rel=1e-6)
        for k in ("compute_utilization_pct", "compute_share_of_busy_pct", "idle_s"):
            np.testing.assert_allclose(getattr(grid, k)[i], getattr(one, k), rtol=1e-6, atol=1e-6)


def test_the_wan_efficiency_and_the_latency_have_finite_gradients():
    def util(eff, lat):
        s = dataclasses.replace(sites(), latency_s=lat * np.ones(3, np.float32))
        r = collab_round(s, wan(wan_efficiency=eff, topology="server"))
        return r.overall_compute_utilization_pct

    g = jax.grad(util, argnums=(0, 1))(jnp.asarray(0.5, jnp.float32), jnp.asarray(0.05))
    assert all(math.isfinite(float(v)) for v in g) and float(g[0]) > 0 and float(g[1]) < 0
