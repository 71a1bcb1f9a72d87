"""Constants per software stack and hardware (calibration/stacks.py, perfmodel/plan/
stack_constants.py): the fit recovers constants it generated, and a stack's constants on
hardware it has no runs on are what the docstring's rule gives by hand."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from calibration.public_runs import MAIN_CSV, load_published_runs
from calibration.stacks import _pairs, _solve, _to_z
from perfmodel import load_hardware, load_stack
from perfmodel.plan.stack_constants import CARRIED, HOST_ENTRIES, stack_constants


@pytest.fixture(scope="module")
def megatron_readme(tmp_path_factory):
    """The nine Megatron-LM weak-scaling runs on H100 (one source, one stack)."""
    df = pd.read_csv(MAIN_CSV)
    sub = df[df.source_id == "megatron-lm-readme-2024"]
    path = tmp_path_factory.mktemp("runs") / "runs.csv"
    sub.to_csv(path, index=False)
    runs, skipped = load_published_runs(path)
    assert len(runs) == 9 and not skipped
    return runs


@pytest.mark.slow
def test_the_fit_recovers_the_constants_that_made_the_times(megatron_readme, monkeypatch):
    """Step times made by the model itself at known constants are fitted back to them by the
    Gauss-Newton solve from the preset's values; its weak prior only pulls a little towards
    the preset."""
    pairs = _pairs(megatron_readme)
    (pair,) = pairs.values()
    assert pair.entries == ("matmul_efficiency_max",)  # 9 runs: the GEMM efficiency alone
    true = {"matmul_efficiency_max": 0.55}
    z_true = _to_z(pair.entries, np.array([true[e] for e in pair.entries]))
    assert abs(z_true[0] - pair.z0[0]) > 0.3  # a real move from the preset
    pair.measured = pair.predicted(z_true)
    z = _solve(pair, np.ones(len(pair.idx)))
    preset = float(pair.base.matmul_efficiency_max)
    assert 0.55 < pair.values(z)["matmul_efficiency_max"] < 0.55 + 0.05 * (preset - 0.55)
    monkeypatch.setattr("calibration.stacks.PRIOR", 0.0)
    z = _solve(pair, np.ones(len(pair.idx)))
    assert pair.values(z)["matmul_efficiency_max"] == pytest.approx(0.55, rel=1e-4)


@pytest.mark.slow
def test_a_row_of_weight_zero_does_not_move_the_fit(megatron_readme):
    pairs = _pairs(megatron_readme)
    (pair,) = pairs.values()
    w = np.ones(len(pair.idx))
    z_all = _solve(pair, w)
    pair.measured = pair.measured.copy()
    pair.measured[0] *= 3.0  # an outlier, left out
    w[0] = 0.0
    assert _solve(pair, w) == pytest.approx(_solve(pair, np.where(w > 0, 1.0, 0.0)))
    assert not np.allclose(_solve(pair, np.ones(len(pair.idx))), z_all)


def _with_constants(name: str, block: dict):
    return dataclasses.replace(load_stack(name), constants=block)


BLOCK = {
    "h100-sxm": {
        "status": "fitted",
        "values": {"matmul_efficiency_max": 0.6, "kernel_overhead_s": 2e-5,
                   "step_overhead_s": 0.01},
        "runs": 20, "sources": ["a", "b"],
        "error_pct": {"leave_one_source_out": 7.5},
    },
    "b200": {
        "status": "fitted",
        "values": {"matmul_efficiency_max": 0.5, "kernel_overhead_s": 8e-5,
                   "step_overhead_s": 0.04},
        "runs": 10, "sources": ["c"],
    },
    CARRIED: {"residual_variance_log": 0.04},
}  # fmt: skip


def test_fitted_constants_are_the_preset_with_the_fitted_entries():
    hw = load_hardware("h100-sxm")
    sc = stack_constants(_with_constants("megatron-core", BLOCK), hw)
    assert sc.status == "fitted"
    assert float(sc.constants.matmul_efficiency_max) == pytest.approx(0.6)
    assert float(sc.constants.kernel_overhead_s) == pytest.approx(2e-5)
    assert float(sc.constants.memory_efficiency_max) == float(hw.constants.memory_efficiency_max)
    assert "20 published runs of 2 sources; 7.5% mean error on a source left out" in sc.reason


def test_carried_over_constants_by_hand():
    """No runs on A100: the A100 preset's device efficiencies, the stack's host costs as the
    geometric mean of its fits (sqrt(2e-5 · 8e-5) = 4e-5 s per kernel, sqrt(0.01 · 0.04) = 0.02
    s per step), and the interval's scatter from the block (sd 0.2 in log)."""
    hw = load_hardware("a100-80gb")
    sc = stack_constants(_with_constants("megatron-core", BLOCK), hw, fits={})
    assert sc.status == "carried over"
    assert float(sc.constants.kernel_overhead_s) == pytest.approx(4e-5, rel=1e-5)
    assert float(sc.constants.step_overhead_s) == pytest.approx(0.02, rel=1e-5)
    assert float(sc.constants.matmul_efficiency_max) == float(hw.constants.matmul_efficiency_max)
    assert sc.covariance.residual_variance == pytest.approx(0.04)
    assert sc.covariance.entries == ()
    assert "h100-sxm" in sc.reason and "b200" in sc.reason and "20%" in sc.reason
    assert "moe_layer_overhead_s" in HOST_ENTRIES  # the dispatcher's host syncs: the stack's


def test_a_stack_without_fits_runs_on_the_preset():
    hw = load_hardware("h100-sxm")
    sc = stack_constants(_with_constants("deepspeed", {}), hw, fits={})
    assert sc.status == "preset" and sc.covariance is None
    assert sc.constants is hw.constants
    assert stack_constants(None, hw).constants is hw.constants


def test_a_version_has_its_own_constants_over_the_stacks():
    """megatron-core@nemo's own GB200 fit replaces the pooled one; on hardware it has no fit
    of its own, the stack's pooled entry applies."""
    base, nemo = load_stack("megatron-core"), load_stack("megatron-core@nemo")
    doc = base.document
    own = doc["variants"]["nemo"].get("constants") or {}
    for hw, entry in base.constants.items():
        if hw == CARRIED:
            continue
        expect = own.get(hw, entry)
        assert nemo.constants[hw] == expect, hw
    assert any(own.get(hw) != base.constants.get(hw) for hw in own)


def test_shipped_intervals_carry_the_between_source_scatter():
    """A fitted entry's residual variance is at least the scatter of runs predicted without
    their source, so its 90% interval is wider than the fit's own residuals give."""
    for name in ("megatron-core", "pytorch-fsdp", "torchtitan", "deepspeed"):
        preset = load_stack(name)
        carried = preset.constants[CARRIED]["residual_variance_log"]
        assert 0.0 < carried < 1.0
        for hw, entry in preset.constants.items():
            if hw == CARRIED or "covariance" not in entry:
                continue
            var = entry["covariance"]["residual_variance_log"]
            sd = math.sqrt(var)
            assert 0.02 < sd < 0.6, (name, hw, sd)
