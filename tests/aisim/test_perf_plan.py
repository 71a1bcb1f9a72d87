"""`aisim perf estimate --tokens`, `perf grid --tokens/--rank-by`, `perf compare` and the
presets' board power through the CLI: the plan's numbers against the formula, and bad values
(one line, exit 2). The formulas themselves: tests/perfmodel/plan/test_training.py."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from aisim.app import app
from perfmodel import load_hardware
from perfmodel.plan.training import DEFAULT_PUE, DEFAULT_UTILISATION

runner = CliRunner()
SMALL = ("--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "64")


def run(*args):
    return runner.invoke(app, list(args))


def test_estimate_tokens_json_matches_formula():
    # the failure-free plan (failures, checkpoints and stragglers: tests/perfmodel/test_reliability.py)
    r = run(
        "perf", "estimate", *SMALL, "--tp", "2", "--pp", "1", "--tokens", "300B", "--no-failures",
        "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    hw = load_hardware("a100-80gb")
    wall = 300e9 / doc["tokens_per_s"]
    assert doc["train_days"] == pytest.approx(wall / 86400, rel=1e-6)
    assert doc["gpu_hours"] == pytest.approx(16 * wall / 3600, rel=1e-6)
    price = float(hw.spec.price_per_device_hour_usd)
    assert doc["cost_usd"] == pytest.approx(doc["gpu_hours"] * price, rel=1e-6)
    # each GPU draws its node's rated power: the 400 W board and its share of the rest of a
    # DGX A100 (6.5 kW over 8 GPUs: 812.5 W, 412.5 W beyond the board)
    assert hw.board_power_w == 400 and hw.host_power_w == 6500 / 8 - 400
    energy = 16 * (400 + 412.5) * DEFAULT_UTILISATION * DEFAULT_PUE * wall / 3.6e9
    assert doc["energy_mwh"] == pytest.approx(energy, rel=1e-6)


def test_estimate_price_override_and_text():
    r = run(
        "perf",
        "estimate",
        *SMALL,
        "--tp",
        "2",
        "--pp",
        "1",
        "--tokens",
        "300B",
        "--price-per-gpu-hour",
        "1",
        "--pue",
        "1.1",
        "--utilisation",
        "0.9",
        "--json",
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["cost_usd"] == pytest.approx(doc["gpu_hours"], rel=1e-6)
    assert doc["pue"] == 1.1 and doc["utilisation_factor"] == 0.9
    r = run("perf", "estimate", *SMALL, "--tp", "2", "--pp", "1", "--tokens", "300B")
    assert r.exit_code == 0 and "to train 300B tokens" in r.output and "MWh" in r.output


def test_cpu_host_energy_is_unknown():
    r = run(
        "perf", "estimate", "--model", "mlp-xs", "--hardware", "cpu-host", "--gpus", "1",
        "--tp", "1", "--pp", "1", "--global-batch", "8", "--tokens", "1B", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["energy_mwh"] is None


@pytest.mark.parametrize(
    "args, flag",
    [
        (("--tokens", "abc"), "--tokens"),
        (("--tokens", "15T", "--pue", "0.9"), "--pue"),
        (("--tokens", "15T", "--utilisation", "0"), "--utilisation"),
        (("--tokens", "15T", "--price-per-gpu-hour", "-1"), "--price-per-gpu-hour"),
        # 1e30 is a typo, not a price or a facility (issue 29)
        (("--tokens", "15T", "--price-per-gpu-hour", "1e30"), "--price-per-gpu-hour"),
        (("--tokens", "15T", "--pue", "1e30"), "--pue"),
    ],
)
def test_bad_plan_options_one_line_exit_2(args, flag):
    for command in ("estimate", "grid"):
        r = run("perf", command, *SMALL, *args)
        assert r.exit_code == 2, r.output
        assert flag in r.output and "Traceback" not in r.output
        assert len(r.output.strip().splitlines()) == 1


def test_grid_rank_by_bad_value():
    r = run("perf", "grid", *SMALL, "--rank-by", "speed")
    assert r.exit_code == 2 and "--rank-by" in r.output and "energy" in r.output


@pytest.mark.slow
def test_grid_tokens_json_and_text():
    r = run("perf", "grid", *SMALL, "--tokens", "300B", "--rank-by", "cost", "--top", "2", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    for key in ("train_days", "gpu_hours", "cost_usd", "energy_mwh"):
        assert doc["best"][key] > 0
    assert doc["top"][0]["cost_usd"] <= doc["top"][1]["cost_usd"]
    r = run("perf", "grid", *SMALL, "--tokens", "300B", "--top", "2")
    assert r.exit_code == 0 and "best strategy to train 300B tokens" in r.output


@pytest.mark.slow
def test_compare_side_by_side(tmp_path):
    png = tmp_path / "cmp.png"
    r = run(
        "perf", "compare", "--hardware", "a100-80gb,h100-sxm", "--model", "gpt3-1.3b",
        "--gpus", "16", "--global-batch", "64", "--tokens", "300B", "--plot", str(png), "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert [h["hardware"] for h in doc["hardware"]] == ["a100-80gb", "h100-sxm"]
    for h in doc["hardware"]:
        assert h["train_days"] > 0 and h["cost_usd"] > 0 and h["energy_mwh"] > 0
    assert png.stat().st_size > 0
    r = run("perf", "compare", "--hardware", "a100-80gb", "--tokens", "1T", "--rank-by", "mfu")
    assert r.exit_code == 2 and "--rank-by" in r.output


@pytest.mark.slow  # each stack's grid crosses its own choices: about 20 s of compiles
def test_compare_under_several_stacks_is_each_stack_alone(tmp_path):
    out = tmp_path / "cmp.csv"
    base = ("perf", "compare", "--hardware", "h100-sxm", "--model", "gpt3-125m",
            "--gpus", "8", "--global-batch", "64", "--tokens", "10B", "--no-failures")  # fmt: skip
    r = run(*base, "--stack", "nemo,titan", "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)["hardware"]
    pairs = [(h["hardware"], h["stack"]) for h in rows]
    assert pairs == [("h100-sxm", "megatron-core@nemo"), ("h100-sxm", "torchtitan")]
    for name in ("nemo", "titan"):
        alone = json.loads(run(*base, "--stack", name, "--json").output)["hardware"]
        assert all("stack" not in h for h in alone)  # one stack: no stack column
        both = [h for h in rows if h["stack"] == alone[0]["best"]["stack"]]
        for a, b in zip(alone, both, strict=True):
            assert (a["hardware"], a["strategy"]) == (b["hardware"], b["strategy"])
            assert a["step_time_s"] == pytest.approx(b["step_time_s"], rel=1e-6)
    r = run(*base, "--stack", "nemo,titan", "--out", str(out))
    assert r.exit_code == 0, r.output
    assert "stack: best strategy" in r.output and "torchtitan:" in r.output
    assert list(pd.read_csv(out)["stack"]) == [s for _, s in pairs]
    r = run(*base, "--stack", "nemo,titan", "--profile", str(out))
    assert r.exit_code == 2 and "one stack with --profile" in r.output
    r = run(*base, "--stack", "nemo,megatron-core@nemo")  # one stack under two names
    assert r.exit_code == 2 and "different stacks" in r.output


@pytest.mark.slow
def test_grid_out_has_plan_columns(tmp_path):
    out = tmp_path / "all.csv"
    r = run("perf", "grid", *SMALL, "--tokens", "300B", "--no-failures", "--out", str(out))
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out)
    wall = 300e9 / df["tokens_per_s"].to_numpy()
    np.testing.assert_allclose(df["train_days"].to_numpy(), wall / 86400, rtol=1e-6)
    # a100-80gb: the 400 W board and its 412.5 W share of the DGX A100's 6.5 kW (8 GPUs)
    power_w = 400 + (6500 / 8 - 400)
    energy = df["num_gpus"].to_numpy() * power_w * DEFAULT_UTILISATION * DEFAULT_PUE * wall / 3.6e9
    np.testing.assert_allclose(df["energy_mwh"].to_numpy(), energy, rtol=1e-6)


@pytest.mark.slow  # two `perf compare` commands: about 5 s of compiles
def test_compare_out_table(tmp_path):
    out = tmp_path / "cmp.csv"
    r = run(
        "perf", "compare", "--hardware", "a100-80gb,cpu-host", "--model", "gpt3-125m",
        "--gpus", "8", "--global-batch", "64", "--tokens", "1B", "--out", str(out),
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out)
    assert list(df["hardware"]) == ["a100-80gb", "cpu-host"]
    assert np.isnan(df["energy_mwh"].iloc[1]) and df["energy_mwh"].iloc[0] > 0
    assert "unknown" in run(
        "perf", "compare", "--hardware", "cpu-host", "--model", "gpt3-125m", "--gpus", "8",
        "--global-batch", "64", "--tokens", "1B",
    ).output  # fmt: skip
