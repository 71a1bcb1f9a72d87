"""Text to a collaboration (collab.settings, collab.sweeps): every bad value is one error with
the parameter's name and the value as typed, checked before any computation (inf, 1e30,
negative values in lists, settings that only the other kind of sweep takes); a real model's
sites get the registry's knobs over their defaults; the sweep's documents carry both
utilisations."""

from __future__ import annotations

import math

import pytest

import collab
from collab.settings import parse_counts, parse_rates, parse_seconds, parse_sizes
from simbase.errors import AisimError


@pytest.mark.parametrize(
    "call, field, value",
    [
        (lambda: parse_sizes("1e30"), "sizes", "1e30"),
        (lambda: parse_sizes("4"), "sizes", "4"),
        (lambda: parse_counts("1e30", "devices"), "devices", "1e30"),
        (lambda: parse_counts("-8", "devices"), "devices", "-8"),
        (lambda: parse_counts("inf", "local_steps"), "local_steps", "inf"),
        (lambda: parse_counts("1.5", "local_steps"), "local_steps", "1.5"),
        (lambda: parse_rates("1e30Gbps", "wan_bandwidth"), "wan_bandwidth", "1e30Gbps"),
        (lambda: parse_rates("infGbps", "wan_up"), "wan_up", "infGbps"),
        (lambda: parse_rates(" , ", "wan_up"), "wan_up", " , "),
        (lambda: parse_seconds("inf", "inner_step_s"), "inner_step_s", "inf"),
        (lambda: parse_seconds("-1", "inner_step_s"), "inner_step_s", "-1"),
        (lambda: collab.scenario_from_text(clients=100_000), "clients", 100_000),
        (lambda: collab.scenario_from_text(clients=0), "clients", 0),
        (lambda: collab.scenario_from_text(wan_latency_ms=math.inf), "wan_latency_ms", math.inf),
        (lambda: collab.scenario_from_text(serde_format="json"), "serde_format", "json"),
        (lambda: collab.run_sweep(rounds=math.inf), "rounds", math.inf),
        (lambda: collab.run_sweep(churn=0.1), "churn", 0.1),
        (lambda: collab.run_sweep(tokens="1T"), "tokens", "1T"),
        (lambda: collab.run_sweep(knobs={"tp": "2"}), "tp", "2"),
        (lambda: collab.run_sweep(model="gpt3-125m", rounds=3.0), "rounds", 3.0),
        (lambda: collab.run_sweep(model="gpt3-125m", sizes="10M"), "sizes", "10M"),
        (lambda: collab.run_sweep(model="gpt3-125m", tokens="inf"), "tokens", "inf"),
        (
            lambda: collab.run_sweep(model="gpt3-125m", local_steps="1e30"),
            "local_steps",
            "1e30",
        ),
        (
            lambda: collab.cross_site_from_text(model="gpt3-125m", churn=math.inf),
            "churn_rate",
            math.inf,
        ),
        (
            lambda: collab.cross_site_from_text(model="gpt3-125m", tcp_window="0MiB"),
            "tcp_window_bytes",
            "0MiB",
        ),
        (
            lambda: collab.cross_site_from_text(
                model="gpt3-125m", batch_size="64", knobs={"global_batch_size": "64"}
            ),
            "global_batch_size",
            "64",
        ),
    ],
)
def test_a_bad_setting_is_one_error_naming_the_parameter(call, field, value):
    with pytest.raises(AisimError) as e:
        call()
    assert (e.value.source, e.value.field, e.value.value) == (None, field, value)
    assert "--" not in e.value.render()


def test_a_real_models_sites_take_the_knobs_over_their_defaults():
    cs = collab.cross_site_from_text(model="gpt3-125m", knobs={"tp": "2", "eager": True})
    assert cs.knobs == dict(
        tp="2", pp=1, zero_stage="auto", recompute="auto", micro_batch_size=1, dtype="bf16",
        fused_attention=True, eager=True,
    )  # fmt: skip
    assert cs.devices == (8,) and cs.batch_size == (128,) and cs.topology == "ring"
    # a stack decides the attention kernel itself
    stacked = collab.cross_site_from_text(model="gpt3-125m", stack="torchtitan")
    assert "fused_attention" not in stacked.knobs and stacked.stack is not None
    # the registry's name for a site's batch
    glob = collab.cross_site_from_text(model="gpt3-125m", knobs={"global_batch_size": "32,64"})
    assert glob.batch_size == (32, 64) and "global_batch_size" not in glob.knobs


def test_a_sizes_sweep_document_carries_both_utilisations():
    result = collab.run_sweep(sizes="10M", client_hardware="a100-80gb,h100-sxm", devices="8")
    doc = result.document()
    (row,) = doc["rows"]
    assert doc["setting"]["hardware"] == ["a100-80gb", "h100-sxm"]
    for i in (1, 2):
        wall = row[f"client{i}_compute_utilization_pct"]
        busy = row[f"client{i}_compute_share_of_busy_pct"]
        assert busy >= wall - 1e-6
    # the faster client waits: its two utilisations differ by its wait
    wait = row["client2_wait_s"] / row["round_time_s"]
    assert wait > 0
    assert row["client2_compute_share_of_busy_pct"] == pytest.approx(
        row["client2_compute_utilization_pct"] / (1 - wait), rel=1e-5
    )


def test_a_sizes_sweep_has_one_row_of_shares_per_size_and_client():
    result = collab.run_sweep(sizes="10M,20M", client_hardware="a100-80gb,h100-sxm", devices="8")
    t = result.client_shares()
    assert t[["model_params", "client"]].values.tolist() == [
        ["10M", 1], ["10M", 2], ["20M", 1], ["20M", 2]
    ]  # fmt: skip
    row = result.frame.iloc[1]
    assert t["total_task_time_s"][2] == row["total_task_time_s"]
    for k in ("compute_utilization_pct", "compute_share_of_busy_pct", "other_share_pct"):
        assert t[k][3] == row[f"client2_{k}"]
