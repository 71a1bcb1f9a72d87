"""`aisim collab sweep --model`: a site's inner step is `aisim perf estimate`'s step time with the
same flags, the JSON carries inner_step_s and compute_utilization overall and per site, the
H x bandwidth table and its figure, and bad input is one line."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from aisim.app import app

runner = CliRunner()
SITE = ["--model", "gpt3-1.3b", "--seq-len", "2048", "--tp", "2", "--pp", "1", "--zero", "1"]
SITE += ["--recompute", "selective", "--micro-batch", "2", "--dtype", "bf16"]


def _json(*args):
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_inner_step_is_perf_estimates_step_time_with_the_same_flags():
    perf = _json(
        "perf",
        "estimate",
        *SITE,
        "--hardware",
        "h100-sxm",
        "--gpus",
        "8",
        "--global-batch",
        "64",
        "--fused-attention",
    )
    doc = _json(
        "collab",
        "sweep",
        *SITE,
        "--clients",
        "2",
        "--client-hardware",
        "h100-sxm",
        "--devices",
        "8",
        "--batch-size",
        "64",
        "--local-steps",
        "50",
        "--compression",
        "bf16",
    )
    assert doc["inner_step_s"] == pytest.approx(perf["step_time_s"], rel=1e-6)
    (row,) = doc["rows"]
    for site in row["sites"]:
        assert site["inner_step_s"] == pytest.approx(perf["step_time_s"], rel=1e-6)
        assert site["mfu"] <= perf["mfu"] + 1e-6
        assert site["memory_gib"] == pytest.approx(perf["memory"]["total_bytes"] / 2**30)
    # blocking ring all-reduce of bf16 over 2 sites on the preset's WAN: hand value
    params = doc["setting"]["params"]
    compute = 50 * perf["step_time_s"]
    assert doc["compute_utilization"] == pytest.approx(compute / row["round_s"], rel=1e-5)
    assert row["payload_bytes"] == pytest.approx(2 * params, rel=1e-6)
    assert 0 < doc["compute_utilization"] < 1


def test_the_h_by_bandwidth_table_csv_and_figure(tmp_path):
    out, fig = tmp_path / "t.csv", tmp_path / "t.png"
    r = runner.invoke(
        app,
        [
            "collab",
            "sweep",
            *SITE,
            "--clients",
            "3",
            "--client-hardware",
            "h100-sxm",
            "--devices",
            "8",
            "--batch-size",
            "64",
            "--local-steps",
            "10,100",
            "--wan-bandwidth",
            "100Mbps,1Gbps",
            "--compression",
            "int8",
            "--tokens",
            "10B",
            "--out",
            str(out),
            "--plot",
            str(fig),
        ],
    )
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out)
    assert len(df) == 4 and fig.stat().st_size > 1000
    by = df.set_index(["local_steps", "wan_bandwidth_bps"])["compute_utilization_pct"]
    assert by[(10, 1e8)] < by[(100, 1e8)] and by[(10, 1e8)] < by[(10, 1e9)]
    hand = 10e9 / df["tokens_per_round"] * df["round_s"]
    assert (abs(df["time_to_train_s"] / hand - 1) < 1e-6).all()


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--mode", "pipeline"], "--mode"),
        (["--devices", "6", "--tp", "4"], "--tp"),
        (["--compression", "int4"], "--compression"),
        (["--churn", "1.5"], "--churn"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(args, flag):
    r = runner.invoke(app, ["collab", "sweep", "--model", "gpt3-125m", "--devices", "8", *args])
    assert r.exit_code != 0
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and flag in lines[0], r.output
