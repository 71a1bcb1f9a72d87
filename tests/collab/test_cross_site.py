"""Real models across sites (collab.cross_site): the pipeline whose stages are the sites sends
its activations over the WAN (hand value), and refuses sites that differ."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import collab
from perfmodel import load_hardware, resolve_model
from simbase.errors import AisimError

H100 = load_hardware("h100-sxm")


def test_pipeline_across_sites_sends_activations_over_the_wan():
    cs = collab.CrossSite(
        model=resolve_model("gpt3-1.3b", seq_len=2048),
        hardware=(H100,) * 4,
        devices=(8,),
        batch_size=(64,),
        knobs=dict(tp=1, pp=1, zero_stage=1, recompute="full", micro_batch_size=1, dtype="bf16"),
        up_bytes_per_s=(125e6,),
        down_bytes_per_s=(125e6,),
        latency_s=(0.03,),
        mode="pipeline",
        wan_efficiency=0.5,
    )
    res = collab.evaluate(cs, (100,))
    (row,) = collab.cross_site_frame(cs, res).to_dict(orient="records")
    (est, *_) = res.estimates
    m = float(est.strategy.batching.num_microbatches)
    act = 1 * 2048 * 2048 * 2.0  # micro-batch x tokens x hidden x bf16 bytes
    hand = 2 * (m + 4 - 1) * (0.03 + act / (125e6 * 0.5))
    assert row["local_steps"] == 1 and row["sync_s"] == pytest.approx(hand, rel=1e-4)
    assert row["payload_bytes"] == pytest.approx(2 * (m + 4 - 1) * act)
    # a round is one step: compute, the sends and the bubble (idle)
    assert row["round_s"] == pytest.approx(float(est.step_time_s), rel=1e-6)
    shares = row["compute_utilization_pct"] + row["communication_share_pct"]
    assert shares + row["idle_share_pct"] == pytest.approx(100.0)
    busy = row["compute_utilization_pct"] / (1 - row["idle_share_pct"] / 100)
    assert row["compute_share_of_busy_pct"] == pytest.approx(busy, rel=1e-5)
    with pytest.raises(AisimError, match="devices"):
        collab.evaluate(dataclasses.replace(cs, devices=(8, 8, 8, 16)))


def test_a_sites_inner_step_is_perfmodels_estimate():
    cs = collab.CrossSite(
        model=resolve_model("gpt3-125m"),
        hardware=(H100, H100),
        devices=(8,),
        batch_size=(64,),
        knobs=dict(tp=2, dtype="bf16", fused_attention=True),
    )
    res = collab.evaluate(cs, (10, 20), (125e6, 1.25e9))
    est = collab.site_estimates(cs)[0]
    np.testing.assert_allclose(np.asarray(res.sites.step_s), est.step_time_s, rtol=1e-7)
    assert [s["local_steps"] for s in res.settings] == [10, 10, 20, 20]
    r = res.rounds
    np.testing.assert_allclose(
        np.asarray(r.compute_s[:, 0]), np.array([10, 10, 20, 20]) * est.step_time_s, rtol=1e-6
    )
