"""Hypothesis properties of the round model: the shares add up to 100 %, a faster link never
raises any site's communication share, and (sites of equal compute) doubling the slowest link's
bandwidth shortens the round at least as much as doubling any other link's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import collab
from perfmodel import load_hardware

A100 = load_hardware("a100-80gb")
CPU = load_hardware("cpu-host")
SITES = 3
AGG = collab.make_aggregator(CPU)
SETUPS = [
    collab.make_setup("fedavg", "server"),
    collab.make_setup("fedavg", "ring"),
    collab.make_setup("data-parallel", "server", "fp16"),
    collab.make_setup("pipeline"),
]
SIZES = st.sampled_from(["2M", "10M", "40M", "100M", "300M"])
RATES = st.lists(st.floats(1e7, 1e10), min_size=SITES, max_size=SITES)
STEPS = st.lists(st.integers(1, 500), min_size=SITES, max_size=SITES)
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)


def _sites(up, down, steps):
    return collab.stack(
        [
            collab.make_site(
                A100, local_steps=k, up_bytes_per_s=u, down_bytes_per_s=d, micro_batch_size=32
            )
            for u, d, k in zip(up, down, steps, strict=True)
        ]
    )


def _round(size, sites, setup):
    return collab.sweep(collab.size_models([size]), sites, AGG, setup)


@SETTINGS
@given(SIZES, RATES, RATES, STEPS, st.sampled_from(range(len(SETUPS))))
@pytest.mark.slow
def test_shares_add_up_to_100(size, up, down, steps, k):
    tl = _round(size, _sites(up, down, steps), SETUPS[k])
    shares = np.asarray(collab.source_shares(tl))
    np.testing.assert_allclose(shares.sum(axis=-1), 100.0, atol=1e-3)
    assert np.all(shares >= -1e-3)
    # the time not spent waiting is compute, communication, serialisation and other work
    phases = tl.compute_s + tl.communication_s + tl.serialization_s + tl.other_s + tl.idle_s
    round_s = np.broadcast_to(np.asarray(tl.round_s)[..., None], phases.shape)
    np.testing.assert_allclose(np.asarray(phases), round_s, rtol=1e-5)
    assert np.all(
        np.asarray(tl.compute_share_of_busy_pct) >= np.asarray(tl.compute_utilization_pct) - 1e-3
    )


@pytest.mark.slow  # a property over many drawn round setups, each evaluated twice
@SETTINGS
@given(
    SIZES,
    RATES,
    RATES,
    STEPS,
    st.sampled_from(range(len(SETUPS))),
    st.integers(0, SITES - 1),
    st.floats(1.01, 100.0),
)
def test_a_faster_link_never_raises_the_communication_share(size, up, down, steps, k, site, factor):
    before = _round(size, _sites(up, down, steps), SETUPS[k])
    up2, down2 = list(up), list(down)
    up2[site] *= factor
    down2[site] *= factor
    after = _round(size, _sites(up2, down2, steps), SETUPS[k])
    assert float(after.round_s[0]) <= float(before.round_s[0]) * (1 + 1e-5)
    # the source's communication share, waiting included
    comm_after = np.asarray(collab.source_shares(after))[..., 1]
    comm_before = np.asarray(collab.source_shares(before))[..., 1]
    assert np.all(comm_after <= comm_before + 1e-3)


@pytest.mark.slow  # a property over many drawn link settings, each a compiled sweep
@SETTINGS
@given(SIZES, RATES, st.integers(1, 500), st.sampled_from(range(len(SETUPS))))
def test_doubling_the_slowest_link_helps_most(size, rates, steps, k):
    base = _round(size, _sites(rates, rates, [steps] * SITES), SETUPS[k])
    slowest = int(np.argmin(rates))
    gains = []
    for i in range(SITES):
        r = list(rates)
        r[i] *= 2.0
        gains.append(
            float(base.round_s[0])
            - float(_round(size, _sites(r, r, [steps] * SITES), SETUPS[k]).round_s[0])
        )
    assert gains[slowest] >= max(gains) - 1e-5 * float(base.round_s[0])
    assert gains[slowest] >= -1e-5 * float(base.round_s[0])


def test_doubling_helps_when_the_link_is_the_bottleneck():
    """The property above is not vacuous: doubling a 10 Mbit/s link of one site shortens the round."""
    sites = _sites([1.25e6, 1.25e9, 1.25e9], [1.25e6, 1.25e9, 1.25e9], [10] * SITES)
    fast = dataclasses.replace(
        sites,
        up_bytes_per_s=sites.up_bytes_per_s.at[0].mul(2.0),
        down_bytes_per_s=sites.down_bytes_per_s.at[0].mul(2.0),
    )
    a, b = _round("10M", sites, SETUPS[0]), _round("10M", fast, SETUPS[0])
    assert float(b.round_s[0]) < 0.6 * float(a.round_s[0])
