"""The cross-site round model of real models (perfmodel.collab_sites): hand values of the ring and
the server, conservation of each site's time, the sign of each knob, streaming DiLoCo's overlap,
deadline and churn, and the one jit(vmap) against a loop."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from perfmodel.collab_sites import (
    PAYLOAD_BYTES,
    SiteRate,
    WanRound,
    cross_site_round,
    round_grid,
)

GBPS = 125e6  # bytes/s


def sites(n=3, step=20.0, bw=GBPS, lat=0.05, devices=8.0):
    f = np.float32
    one = np.ones(n, f)
    return SiteRate(
        inner_step_s=np.asarray(step, f) * one,
        devices=devices * one,
        peak_flops_per_s=989e12 * one,
        mfu=0.4 * one,
        tokens_per_step=1e6 * one,
        up_bytes_per_s=bw * one,
        down_bytes_per_s=bw * one,
        latency_s=lat * one,
        serialize_bytes_per_s=np.full(n, np.inf, f),
        deserialize_bytes_per_s=np.full(n, np.inf, f),
    )


def wan(params=1e9, h=100.0, **kw):
    f = jnp.float32
    nums = dict(
        params=params,
        local_steps=h,
        fragments=1.0,
        wan_efficiency=1.0,
        churn_rate=0.0,
        state_bytes=8.0 * params,
        deadline_s=0.0,
        topk_fraction=0.01,
        server_bytes_per_s=GBPS,
        tcp_window_bytes=math.inf,
    )
    static = {k: kw.pop(k) for k in ("mode", "topology", "compression", "overlap") if k in kw}
    nums.update(kw)
    return WanRound(**{k: jnp.asarray(v, f) for k, v in nums.items()}, **static)


def test_ring_sync_is_the_hand_formula_and_utilisation_is_compute_over_wall():
    r = cross_site_round(sites(3), wan(compression="int8"))
    payload = 1e9 * PAYLOAD_BYTES["int8"]
    hand = 2 * 2 * 0.05 + 2 * 2 / 3 * payload / GBPS
    assert float(r.sync_s) == pytest.approx(hand, rel=1e-5)
    compute = 100 * 20.0
    assert float(r.round_s) == pytest.approx(compute + hand, rel=1e-5)
    assert float(r.compute_utilization_pct) == pytest.approx(100 * compute / (compute + hand))
    np.testing.assert_allclose(r.bytes_sent, 2 * 2 / 3 * payload, rtol=1e-6)


def test_the_tcp_window_caps_a_long_link_at_window_over_rtt():
    # 3 sites, 1 Gbit/s lines, 50 ms one way (RTT 0.1 s), 4 MB window: 4e6 / 0.1 = 40 MB/s < 125 MB/s
    payload = 1e9 * PAYLOAD_BYTES["int8"]
    r = cross_site_round(sites(3), wan(compression="int8", tcp_window_bytes=4e6))
    hand = 2 * 2 * 0.05 + 2 * 2 / 3 * payload / 40e6
    assert float(r.sync_s) == pytest.approx(hand, rel=1e-5)
    # twice the latency, half the rate: the bulk term doubles (a ring across continents)
    far = cross_site_round(sites(3, lat=0.1), wan(compression="int8", tcp_window_bytes=4e6))
    assert float(far.sync_s) == pytest.approx(2 * 2 * 0.1 + 2 * 2 / 3 * payload / 20e6, rel=1e-5)
    # a window above the bandwidth-delay product (125 MB/s x 0.1 s = 12.5 MB) changes nothing
    wide = cross_site_round(sites(3), wan(compression="int8", tcp_window_bytes=20e6))
    free = cross_site_round(sites(3), wan(compression="int8"))
    assert float(wide.sync_s) == pytest.approx(float(free.sync_s), rel=1e-6)
    # server: each site's upload and download capped by its own RTT (2 x 0.05 s)
    srv = cross_site_round(
        sites(2),
        wan(compression="int8", topology="server", tcp_window_bytes=4e6, server_bytes_per_s=1e12),
    )
    assert float(srv.sync_s) == pytest.approx(2 * (0.05 + payload / 40e6), rel=1e-4)
    # a newcomer's state download (8 GB) is capped the same way
    churn = cross_site_round(sites(3), wan(churn_rate=0.1, tcp_window_bytes=4e6))
    assert float(churn.churn_s) == pytest.approx(0.3 * (0.05 + 8e9 / 40e6), rel=1e-5)


def test_server_sync_is_bounded_by_the_servers_own_link():
    # three sites upload 1 GB each over 1 Gbit/s, the server takes 3 GB in over the same rate
    r = cross_site_round(sites(3, lat=0.0), wan(topology="server", compression="int8"))
    assert float(r.sync_s) == pytest.approx(2 * 3 * 1e9 / GBPS, rel=1e-5)
    fast = wan(topology="server", compression="int8", server_bytes_per_s=100 * GBPS)
    assert float(cross_site_round(sites(3, lat=0.0), fast).sync_s) == pytest.approx(
        2 * 1e9 / GBPS, rel=1e-5
    )


@pytest.mark.parametrize(
    "kw",
    [
        dict(mode="diloco"),
        dict(mode="data-parallel", compression="bf16"),
        dict(mode="streaming-diloco", fragments=4.0, overlap=True),
        dict(mode="diloco", overlap=True, churn_rate=0.1),
        dict(mode="fedavg", topology="server", compression="topk"),
    ],
)
def test_each_sites_shares_add_up_to_the_round(kw):
    s = dataclasses.replace(sites(3), inner_step_s=np.array([10.0, 20.0, 15.0], np.float32))
    r = cross_site_round(s, wan(**kw))
    total = r.compute_s + r.communication_s + r.serialization_s + r.idle_s
    np.testing.assert_allclose(total, r.round_s, rtol=1e-5)
    shares = (
        r.compute_share_pct
        + r.communication_share_pct
        + r.serialization_share_pct
        + r.idle_share_pct
    )
    np.testing.assert_allclose(shares, 100.0, rtol=1e-5)
    # the slowest site never waits; the fastest waits for it
    assert float(r.idle_s[1]) == pytest.approx(0.0, abs=1e-3)
    assert float(r.idle_s[0]) > 0


def test_the_sign_of_each_published_knob():
    util = lambda s, r: float(cross_site_round(s, r).compute_utilization_pct)  # noqa: E731
    # more inner steps per sync: higher utilisation (DiLoCo, INTELLECT-1 H=100 vs DP)
    assert util(sites(), wan(h=10.0)) < util(sites(), wan(h=100.0)) < util(sites(), wan(h=500.0))
    # int8 instead of bf16: less communication
    c8 = cross_site_round(sites(), wan(compression="int8")).communication_s
    c16 = cross_site_round(sites(), wan(compression="bf16")).communication_s
    assert float(c8[0]) < float(c16[0])
    # more sites on the same links: a longer ring all-reduce
    assert float(cross_site_round(sites(4), wan()).sync_s) > float(
        cross_site_round(sites(2), wan()).sync_s
    )
    # a faster WAN: higher utilisation
    assert util(sites(bw=GBPS), wan()) < util(sites(bw=10 * GBPS), wan())


def test_streaming_diloco_hides_fragments_behind_the_next_inner_steps():
    s = sites(3, step=20.0)
    blocking = cross_site_round(s, wan(mode="diloco", compression="bf16"))
    stream = cross_site_round(s, wan(mode="streaming-diloco", fragments=4.0, overlap=True))
    # each fragment (0.5 GB bf16... fp32 here: 1 GB) syncs in ~11 s, under 25 inner steps
    assert float(stream.compute_utilization_pct) == pytest.approx(100.0, abs=1e-3)
    assert float(blocking.compute_utilization_pct) < 100.0
    # without overlap, F fragments cost at least the one full sync
    plain = cross_site_round(s, wan(mode="streaming-diloco", fragments=4.0))
    full = cross_site_round(s, wan(mode="diloco"))
    assert float(plain.round_s) >= float(full.round_s) - 1e-3
    # too little compute to hide it: the exposed part is what remains of each fragment
    short = cross_site_round(
        sites(3, step=0.01), wan(mode="streaming-diloco", fragments=4.0, overlap=True, h=4.0)
    )
    per = float(short.sync_s) / 4.0
    assert float(short.round_s) == pytest.approx(4 * 0.01 + 4 * (per - 0.01), rel=1e-4)


def test_a_deadline_drops_the_slow_site_and_churn_costs_a_state_download():
    s = dataclasses.replace(sites(3), inner_step_s=np.array([10.0, 10.0, 50.0], np.float32))
    r = cross_site_round(s, wan(deadline_s=2000.0))
    np.testing.assert_array_equal(r.dropped, [0.0, 0.0, 1.0])
    assert float(r.compute_share_pct[2]) == 0.0
    assert float(r.idle_share_pct[2]) == pytest.approx(100.0)
    assert float(r.tokens_per_round) == pytest.approx(2 * 100 * 1e6)
    # the fastest site always counts, even when every site misses the deadline
    s2 = dataclasses.replace(s, inner_step_s=np.array([10.0, 12.0, 50.0], np.float32))
    np.testing.assert_array_equal(cross_site_round(s2, wan(deadline_s=1.0)).dropped, [0, 1, 1])
    churn = cross_site_round(sites(3), wan(churn_rate=0.1))
    hand = min(1.0, 0.1 * 3) * (0.05 + 8e9 / GBPS)
    assert float(churn.churn_s) == pytest.approx(hand, rel=1e-5)
    assert float(churn.round_s) == pytest.approx(
        float(cross_site_round(sites(3), wan()).round_s) + hand, rel=1e-5
    )


def test_the_grid_is_the_loop():
    hs = [10.0, 100.0, 500.0]
    bws = [GBPS, 4 * GBPS, GBPS]
    ss = [sites(bw=b) for b in bws]
    rs = [wan(h=h, compression="int8") for h in hs]
    stack = lambda xs: jax.tree.map(lambda *a: jnp.stack([jnp.asarray(x) for x in a]), *xs)  # noqa: E731
    grid = round_grid(stack(ss), stack(rs))
    for i, (s, r) in enumerate(zip(ss, rs, strict=True)):
        one = cross_site_round(s, r)
        assert float(grid.round_s[i]) == pytest.approx(float(one.round_s), rel=1e-6)
        np.testing.assert_allclose(grid.compute_share_pct[i], one.compute_share_pct, rtol=1e-6)


def test_the_fitted_wan_efficiency_is_differentiable():
    def util(eff):
        return cross_site_round(sites(), wan(wan_efficiency=eff)).compute_utilization_pct

    g = jax.grad(util)(jnp.asarray(0.5, jnp.float32))
    assert math.isfinite(float(g)) and float(g) > 0


def test_a_fixed_window_sets_the_round_and_the_inner_steps_get_what_the_exchange_leaves():
    # 3 sites, 100 inner steps of 20 s = 2000 s of compute; an int8 ring sync of `hand` seconds
    payload = 1e9 * PAYLOAD_BYTES["int8"]
    hand = 2 * 2 * 0.05 + 2 * 2 / 3 * payload / GBPS
    # a 2500 s window holds the sync and all the steps: the round is the window, the rest idle
    r = cross_site_round(sites(3), wan(compression="int8", window_s=2500.0))
    assert float(r.round_s) == pytest.approx(2500.0)
    np.testing.assert_allclose(r.compute_s, 2000.0, rtol=1e-6)
    np.testing.assert_allclose(r.idle_s, 2500.0 - 2000.0 - hand, rtol=1e-5)
    assert float(r.compute_utilization_pct) == pytest.approx(80.0, rel=1e-6)
    assert float(r.tokens_per_round) == pytest.approx(3 * 100 * 1e6, rel=1e-6)
    # a 2000 s window: the steps run in 2000 - sync and stop at its end (fewer tokens, no idle)
    w = cross_site_round(sites(3), wan(compression="int8", window_s=2000.0))
    assert float(w.round_s) == pytest.approx(2000.0)
    np.testing.assert_allclose(w.compute_s, 2000.0 - hand, rtol=1e-5)
    np.testing.assert_allclose(w.idle_s, 0.0, atol=1e-3)
    assert float(w.tokens_per_round) == pytest.approx(3 * (2000.0 - hand) / 20.0 * 1e6, rel=1e-5)
    # an exchange longer than the window: the round is the exchange and nothing is computed
    x = cross_site_round(sites(3), wan(compression="int8", window_s=0.5 * hand))
    assert float(x.round_s) == pytest.approx(hand, rel=1e-6)
    assert float(x.compute_utilization_pct) == 0.0
    # no window (0): the round is compute + sync, as before
    free = cross_site_round(sites(3), wan(compression="int8"))
    assert float(free.round_s) == pytest.approx(2000.0 + hand, rel=1e-6)
