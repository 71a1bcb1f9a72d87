"""Prediction intervals: the linearised variance against a Monte-Carlo over the constants'
covariance, the covariance a fit stores in its profile, the intervals `aisim perf estimate`
prints, and the leave-one-out coverage on the shipped measurement sets."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from typer.testing import CliRunner

import calibration as cal
from aisim.app import app
from calibration.fit import covaried_entries
from calibration.intervals import shipped_coverage
from perfmodel import estimate, load_hardware, step_time
from perfmodel.plan.uncertainty import (
    ConstantsCovariance,
    covariance_from_dict,
    entry_values,
    log_interval,
    log_step_gradient,
    prediction_intervals,
    strategies_intervals,
    with_entries,
)
from simbase.errors import AisimError

pytestmark = pytest.mark.slow  # module fixtures fit calibrations

runner = CliRunner()
ENTRIES = (
    "matmul_efficiency_max",
    "memory_efficiency_max",
    "kernel_overhead_s",
    "link_bandwidth_efficiency.inter_node",
)


@pytest.fixture(scope="module")
def est():
    return estimate(
        "gpt3-13b", "a100-80gb", num_gpus=64, tp=4, pp=4, global_batch=256, recompute="selective"
    )


def _covariance(c, rel_sd=0.03, corr=0.3):
    x0 = np.asarray(entry_values(c, ENTRIES), np.float64)
    sd = rel_sd * x0
    r = np.full((len(x0), len(x0)), corr) + (1 - corr) * np.eye(len(x0))
    return x0, np.outer(sd, sd) * r


def test_linearised_variance_matches_monte_carlo(est):
    c = est.hardware.constants
    x0, cov = _covariance(c)
    g = np.asarray(log_step_gradient(est.model.spec, est.hardware.spec, c, est.strategy, ENTRIES))
    linear = float(g @ cov @ g)
    xs = np.random.default_rng(0).multivariate_normal(x0, cov, size=4000).astype(np.float32)

    def log_t(x):
        return jnp.log(
            step_time(
                est.model.spec, est.hardware.spec, with_entries(c, ENTRIES, x), est.strategy
            ).step_time_s
        )

    samples = np.asarray(jax.jit(jax.vmap(log_t))(jnp.asarray(xs)), np.float64)
    assert np.var(samples) == pytest.approx(linear, rel=0.1)


def test_interval_covers_monte_carlo_new_measurements(est):
    """With the residual scatter added, about 90% of simulated new runs fall in the 90% interval."""
    c = est.hardware.constants
    x0, cov = _covariance(c)
    sigma2 = 0.02**2
    cc = ConstantsCovariance(ENTRIES, cov, sigma2, dof=10_000)  # dof large: a normal quantile
    iv = prediction_intervals(est.model.spec, est.hardware.spec, c, est.strategy, cc)
    t = iv["step_time_s"]
    rng = np.random.default_rng(1)
    xs = rng.multivariate_normal(x0, cov, size=3000).astype(np.float32)
    times = np.asarray(
        jax.jit(
            jax.vmap(
                lambda x: (
                    step_time(
                        est.model.spec, est.hardware.spec, with_entries(c, ENTRIES, x), est.strategy
                    ).step_time_s
                )
            )
        )(jnp.asarray(xs)),
        np.float64,
    )
    new = times * np.exp(rng.normal(0.0, np.sqrt(sigma2), size=times.shape))
    inside = np.mean((new >= t.lo) & (new <= t.hi))
    assert inside == pytest.approx(0.9, abs=0.03)
    # the rates are the step time's reciprocal: the same interval, flipped
    tok = iv["tokens_per_s"]
    assert tok.lo == pytest.approx(tok.value * t.value / t.hi)
    assert iv["mfu"].hi == pytest.approx(iv["mfu"].value * t.value / t.lo)
    # several strategies of one stack in one program (a grid's reported rows): each as alone
    other = dataclasses.replace(est.strategy, memory=dataclasses.replace(
        est.strategy.memory, zero_stage=np.float32(1.0)))  # fmt: skip
    both = strategies_intervals(est.model.spec, est.hardware.spec, c, [other, est.strategy], cc)
    alone = prediction_intervals(est.model.spec, est.hardware.spec, c, other, cc)
    for got, want in ((both[0], alone), (both[1], iv)):
        for k, w in want.items():
            assert (got[k].lo, got[k].hi) == pytest.approx((w.lo, w.hi), rel=1e-6), k
    assert both[0]["step_time_s"].value != both[1]["step_time_s"].value


def test_log_interval_widths():
    cc = ConstantsCovariance(("kernel_overhead_s",), np.zeros((1, 1)), 0.01, dof=5)
    iv = log_interval(10.0, np.zeros(1), cc, 0.9)
    q = 2.015048  # Student t, 5 dof, 95th percentile
    assert iv.hi == pytest.approx(10.0 * np.exp(q * 0.1), rel=1e-5)
    assert iv.lo * iv.hi == pytest.approx(100.0)


def test_covariance_block_is_validated():
    good = {"entries": ["kernel_overhead_s"], "matrix": [[1e-12]], "residual_variance_log": 0.001,
            "dof": 3}  # fmt: skip
    assert covariance_from_dict(good).dof == 3
    for field, bad in (
        ("entries", ["no_such_constant"]),
        ("matrix", [[1.0, 2.0]]),
        ("dof", 0),
        ("residual_variance_log", -1.0),
    ):
        with pytest.raises(AisimError) as e:
            covariance_from_dict(good | {field: bad}, "p.json")
        assert e.value.source == "p.json" and e.value.field.startswith("covariance.")


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory):
    df = cal.load_measurements(cal.data_path("korthikanti2022_table5_iteration_time.csv"))
    fitted = cal.fit_measurements(df, cross_validate=False)
    path = tmp_path_factory.mktemp("profile") / "a100.json"
    path.write_text(fitted.profile_text())
    return path, fitted


def test_fit_stores_the_covariance(profile_path):
    path, fitted = profile_path
    doc = json.loads(path.read_text())
    cov = covariance_from_dict(doc["covariance"])
    assert cov.entries == covaried_entries(cal.parse_free(None, fitted.rows[0].hardware.constants))
    assert cov.dof == doc["rows"] - len(doc["fitted"])
    # its diagonal is the standard deviations the profile always carried
    for i, name in enumerate(cov.entries):
        assert np.sqrt(cov.covariance[i, i]) == pytest.approx(doc["uncertainty"][name], rel=1e-3)
    assert cal.load_profile_covariance(path).entries == cov.entries


def test_estimate_prints_and_carries_intervals(profile_path):
    path, _ = profile_path
    # without failures the days scale with the step time (with them: tests/perfmodel/test_reliability.py)
    args = ["perf", "estimate", "--profile", str(path), "--tokens", "15T", "--no-failures"]
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["step_time_s_lo"] < doc["step_time_s"] < doc["step_time_s_hi"]
    assert doc["tokens_per_s_lo"] < doc["tokens_per_s"] < doc["tokens_per_s_hi"]
    assert doc["train_days_lo"] < doc["train_days"] < doc["train_days_hi"]
    assert doc["train_days_hi"] / doc["train_days"] == pytest.approx(
        doc["step_time_s_hi"] / doc["step_time_s"], rel=1e-6
    )
    r = runner.invoke(app, args)
    assert r.exit_code == 0 and " s ± " in r.output and "(90%" in r.output


@pytest.mark.slow
def test_leave_one_out_coverage_on_the_shipped_sets():
    """Held-out rows inside their 90% interval: the number the docs quote."""
    results = shipped_coverage()
    inside = sum(int(c.inside.sum()) for c in results.values())
    total = sum(int(c.inside.size) for c in results.values())
    print(f"leave-one-out coverage of the 90% intervals: {inside}/{total}")
    assert total == 18
    # nominal 90%: with 18 rows, anything from 13 up is within binomial chance (P(X <= 12) < 2%)
    assert inside >= 13


def test_grid_rows_carry_intervals(profile_path):
    path, _ = profile_path
    r = runner.invoke(
        app,
        ["perf", "grid", "--model", "gpt3-13b", "--gpus", "64", "--global-batch", "256",
         "--profile", str(path), "--tokens", "300B", "--top", "2", "--json"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    for row in doc["top"]:
        assert row["step_time_s_lo"] < row["step_time_s"] < row["step_time_s_hi"]
        assert row["train_days_lo"] < row["train_days"] < row["train_days_hi"]
    # the same interval as estimate gives for that strategy
    b = doc["best"]
    est = estimate(
        "gpt3-13b",
        "a100-80gb",
        constants=cal.load_profile_constants(
            path, "a100-80gb", load_hardware("a100-80gb").constants
        ),
        num_gpus=64,
        tp=b["tp"],
        pp=b["pp"],
        global_batch=256,
        micro_batch_size=b["micro_batch_size"],
        interleave=b["interleave"],
        schedule=b["schedule"],
        zero_stage=b["zero_stage"],
        recompute=b["recompute"],
        sequence_parallel=b["sequence_parallel"],
    )
    iv = prediction_intervals(
        est.model.spec,
        est.hardware.spec,
        cal.load_profile_constants(path, "a100-80gb", est.hardware.constants),
        est.strategy,
        cal.load_profile_covariance(path),
    )
    assert b["step_time_s_hi"] == pytest.approx(iv["step_time_s"].hi, rel=1e-5)


def test_a_profile_without_covariance_gives_no_interval(profile_path, tmp_path):
    path, _ = profile_path
    doc = json.loads(path.read_text())
    del doc["covariance"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    assert cal.load_profile_covariance(old) is None
    r = runner.invoke(app, ["perf", "estimate", "--profile", str(old), "--json"])
    assert r.exit_code == 0, r.output
    assert "step_time_s_lo" not in json.loads(r.output)


def test_calibrate_predict_rows_carry_the_step_time_interval(profile_path):
    path, _ = profile_path
    table = cal.data_path("korthikanti2022_table5_iteration_time.csv")
    r = runner.invoke(app, ["calibrate", "predict", str(table), "--profile", str(path), "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)["predictions"]
    assert len(rows) == 8
    for row in rows:
        assert row["step_time_s_lo"] < row["predicted_step_time_s"] < row["step_time_s_hi"]
    # the interval is perfmodel.plan.uncertainty's of the row's strategy under the profile
    df = cal.load_measurements(table)
    rc = cal.resolve_rows(df, None)[0]
    consts = cal.load_profile_constants(path, rc.hardware.name, rc.hardware.constants)
    iv = prediction_intervals(
        rc.model.spec,
        rc.hardware.spec,
        consts,
        cal.row_strategy(rc),
        cal.load_profile_covariance(path),
    )["step_time_s"]
    assert rows[0]["step_time_s_lo"] == pytest.approx(iv.lo, rel=1e-5)
    assert rows[0]["step_time_s_hi"] == pytest.approx(iv.hi, rel=1e-5)
    # no profile (or one without a covariance): no interval columns
    r = runner.invoke(app, ["calibrate", "predict", str(table), "--json"])
    assert r.exit_code == 0 and "step_time_s_lo" not in json.loads(r.output)["predictions"][0]
