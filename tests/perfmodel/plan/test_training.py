"""Time, cost and energy to train: the formulas by hand, the presets' cited board power, sweeps
ranked by time and energy, and bad values (the command line's --tokens/--rank-by options and
`aisim perf compare`: tests/aisim/test_perf_plan.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perfmodel import hardware_names, load_hardware
from perfmodel.plan.training import (
    DEFAULT_PUE,
    DEFAULT_UTILISATION,
    parse_tokens,
    plan_sweep,
    plan_training,
    planning_defaults,
)
from simbase.errors import AisimError


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
