"""Time, cost and energy to train: the formulas by hand, the presets' cited board power, the
--tokens/--rank-by options of estimate and grid, `aisim perf compare`, and bad values."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from aisim.app import app
from perfmodel import hardware_names, load_hardware
from perfmodel.planning import (
    DEFAULT_PUE,
    DEFAULT_UTILISATION,
    parse_tokens,
    plan_sweep,
    plan_training,
    planning_defaults,
)
from simbase.errors import AisimError

runner = CliRunner()
SMALL = ("--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "64")


def run(*args):
    return runner.invoke(app, list(args))


def test_energy_and_cost_by_hand():
    # 1e12 tokens at 1e6 tokens/s on 100 GPUs: 1e6 s = 11.574 days, 27,777.8 GPU-hours;
    # at $2/GPU-hour $55,555.6; 100 x 700 W x 0.5 x 1.2 x 1e6 s = 4.2e10 J = 11.667 MWh
    p = plan_training(
        tokens=1e12,
        tokens_per_s=1e6,
        num_gpus=100,
        price_per_gpu_hour_usd=2.0,
        board_power_w=700.0,
        utilisation_factor=0.5,
        pue=1.2,
    )
    assert p.train_days == pytest.approx(1e6 / 86400)
    assert p.gpu_hours == pytest.approx(100 * 1e6 / 3600)
    assert p.cost_usd == pytest.approx(55555.5556, rel=1e-9)
    assert p.energy_mwh == pytest.approx(4.2e10 / 3.6e9)


def test_unknown_price_or_power_is_none_not_zero():
    p = plan_training(tokens=1e9, tokens_per_s=1e3, num_gpus=8, price_per_gpu_hour_usd=math.nan)
    assert p.cost_usd is None and p.energy_mwh is None
    assert p.utilisation_factor == DEFAULT_UTILISATION and p.pue == DEFAULT_PUE


def test_presets_cite_their_board_power():
    for name in hardware_names():
        hw = load_hardware(name)
        assert "power" in hw.sources, name
        if name == "cpu-host":
            assert hw.board_power_w is None
        else:
            assert hw.board_power_w > 0
    expected = {"a100-80gb": 400, "h100-sxm": 700, "h200": 700, "b200": 1000, "v100-32gb": 300}
    for name, watts in expected.items():
        assert load_hardware(name).board_power_w == watts
    doc = planning_defaults()
    assert set(doc["sources"]) >= {"utilisation_factor", "pue", "hbm_capacity_tiers_gib"}


def test_parse_tokens():
    assert parse_tokens("15T") == 15e12
    assert parse_tokens("300B") == 3e11
    for bad in ("0", "-1", "lots"):
        with pytest.raises(AisimError) as e:
            parse_tokens(bad)
        assert e.value.field == "tokens"


def test_estimate_tokens_json_matches_formula():
    r = run("perf", "estimate", *SMALL, "--tp", "2", "--pp", "1", "--tokens", "300B", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    hw = load_hardware("a100-80gb")
    wall = 300e9 / doc["tokens_per_s"]
    assert doc["train_days"] == pytest.approx(wall / 86400, rel=1e-6)
    assert doc["gpu_hours"] == pytest.approx(16 * wall / 3600, rel=1e-6)
    price = float(hw.spec.price_per_device_hour_usd)
    assert doc["cost_usd"] == pytest.approx(doc["gpu_hours"] * price, rel=1e-6)
    energy = 16 * 400 * DEFAULT_UTILISATION * DEFAULT_PUE * wall / 3.6e9
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


def test_rank_by_energy_is_the_least_energy_of_all_feasible():
    result = plan_sweep(
        "gpt3-1.3b",
        ["a100-80gb", "h100-sxm"],
        tokens=1e11,
        rank_by="energy",
        num_gpus=[16],
        global_batch=[64],
        keep_all=True,
        top=3,
    )
    df = result.all_feasible
    watts = df["hardware"].map({"a100-80gb": 400.0, "h100-sxm": 700.0}).to_numpy()
    per_token = df["num_gpus"].to_numpy(float) * watts / df["tokens_per_s"].to_numpy(float)
    best = result.best
    best_per_token = best["num_gpus"] * best["board_power_w"] / best["tokens_per_s"]
    assert best_per_token == pytest.approx(float(np.min(per_token)), rel=1e-6)
    energies = [r["energy_mwh"] for r in result.top]
    assert energies == sorted(energies)


def test_rank_by_time_is_throughput():
    t = plan_sweep("gpt3-1.3b", "a100-80gb", tokens=1e11, rank_by="time", num_gpus=[16],
                   global_batch=[64], top=5)  # fmt: skip
    days = [r["train_days"] for r in t.top]
    assert days == sorted(days)
    assert t.best["train_days"] == pytest.approx(1e11 / t.best["tokens_per_s"] / 86400)


def test_grid_tokens_json_and_text():
    r = run("perf", "grid", *SMALL, "--tokens", "300B", "--rank-by", "cost", "--top", "2", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    for key in ("train_days", "gpu_hours", "cost_usd", "energy_mwh"):
        assert doc["best"][key] > 0
    assert doc["top"][0]["cost_usd"] <= doc["top"][1]["cost_usd"]
    r = run("perf", "grid", *SMALL, "--tokens", "300B", "--top", "2")
    assert r.exit_code == 0 and "best strategy to train 300B tokens" in r.output


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


def test_grid_out_has_plan_columns(tmp_path):
    out = tmp_path / "all.csv"
    r = run("perf", "grid", *SMALL, "--tokens", "300B", "--out", str(out))
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out)
    wall = 300e9 / df["tokens_per_s"].to_numpy()
    np.testing.assert_allclose(df["train_days"].to_numpy(), wall / 86400, rtol=1e-6)
    energy = df["num_gpus"].to_numpy() * 400 * DEFAULT_UTILISATION * DEFAULT_PUE * wall / 3.6e9
    np.testing.assert_allclose(df["energy_mwh"].to_numpy(), energy, rtol=1e-6)


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


def test_presets_show_the_board_power():
    r = runner.invoke(app, ["presets", "hardware", "--json"])
    assert r.exit_code == 0, r.output
    power = {h["name"]: h["board_power_w"] for h in json.loads(r.output)["hardware"]}
    assert power == {n: load_hardware(n).board_power_w for n in hardware_names()}
    assert power["b200"] == 1000.0 and power["cpu-host"] is None
    wide = runner.invoke(app, ["presets", "hardware", "--wide"], env={"COLUMNS": "80"}).stdout
    b200 = next(line for line in wide.splitlines() if "b200" in line)
    assert "board W" in wide and b200.split("│")[-2].strip() == "1000"
    for columns in (60, 80, 100):
        out = runner.invoke(app, ["presets", "hardware"], env={"COLUMNS": str(columns)}).stdout
        assert max(len(line) for line in out.splitlines()) <= columns, out
        assert "hidden: board W" in out  # the first column hidden when narrow
    out = runner.invoke(app, ["presets", "hardware"], env={"COLUMNS": "120"}).stdout
    assert "board W" in out and "hidden:" not in out
