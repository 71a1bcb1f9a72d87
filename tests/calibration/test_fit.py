"""Fit: recovery of known constants, Korthikanti's 8 rows, constraints and the single-row Colossal fit."""

import dataclasses
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from calibration.fit import fit
from calibration.measurements import load_measurements, normalise_measurements
from calibration.objective import predicted_step_time_s
from calibration.parameterization import parse_free
from calibration.rows import build_batch, resolve_rows

DATA = Path(__file__).parents[2] / "calibration" / "data"
SHARED = Path(__file__).parents[1].parent / "calibration" / "data"

# (model, gpus, tp, pp, micro_batch, microbatches): small and large kernels, intra- and
# inter-node groups, pipelines, so that every free constant below moves some rows
DESIGN = [
    ("gpt3-125m", 8, 1, 1, 1, 1),
    ("gpt3-125m", 8, 4, 1, 1, 16),
    ("gpt3-125m", 16, 1, 1, 4, 2),
    ("gpt3-125m", 8, 2, 4, 1, 32),
    ("gpt3-350m", 8, 2, 1, 2, 4),
    ("gpt3-350m", 32, 1, 1, 1, 1),
    ("gpt3-350m", 8, 8, 1, 1, 8),
    ("gpt3-1.3b", 8, 8, 1, 1, 1),
    ("gpt3-1.3b", 16, 2, 1, 4, 2),
    ("gpt3-1.3b", 64, 1, 1, 2, 1),
    ("gpt3-6.7b", 16, 8, 2, 1, 8),
    ("gpt3-6.7b", 32, 4, 2, 2, 4),
    ("gpt3-13b", 64, 8, 4, 1, 16),
    ("gpt3-13b", 16, 8, 1, 8, 1),
    ("gpt3-2.7b", 8, 4, 1, 16, 1),
    ("gpt3-2.7b", 32, 2, 2, 4, 4),
    ("gpt3-760m", 16, 1, 1, 2, 2),
    ("gpt3-760m", 4, 1, 1, 32, 1),
    ("gpt3-760m", 8, 4, 2, 1, 32),
    ("gpt3-125m", 32, 1, 1, 8, 1),
]


@pytest.mark.slow
def test_recovers_constants_from_noisy_synthetic_measurements():
    recs = [
        dict(
            model=m,
            hardware="a100-80gb",
            num_gpus=g,
            tp=tp,
            pp=pp,
            micro_batch_size=b,
            global_batch_size=(g // (tp * pp)) * b * k,
            dtype="bf16",
            step_time_s=1.0,
        )
        for m, g, tp, pp, b, k in DESIGN
    ]
    rows = resolve_rows(normalise_measurements(pd.DataFrame(recs), purpose="fit"))
    batch = build_batch(rows)
    base = rows[0].hardware.constants
    true = {
        "matmul_efficiency_max": 0.68,
        "memory_efficiency_max": 0.70,
        "link_bandwidth_efficiency.intra_node": 0.60,
        "link_bandwidth_efficiency.inter_node": 0.60,
        "optimizer_time_factor": 1.5,
    }
    c = dataclasses.replace(
        base,
        matmul_efficiency_max=jnp.float32(0.68),
        memory_efficiency_max=jnp.float32(0.70),
        link_bandwidth_efficiency=base.link_bandwidth_efficiency.at[0].set(0.6).at[1].set(0.6),
        optimizer_time_factor=jnp.float32(1.5),
    )
    t = np.asarray(predicted_step_time_s(batch, c), np.float64)
    noisy = t * np.exp(np.random.default_rng(0).normal(0.0, 0.005, len(t)))
    r = fit(parse_free(",".join(true), base), batch, noisy, cross_validate=False)
    for k, v in true.items():
        assert abs(r.values[k] / v - 1) < 0.05, (k, r.values[k], v)
        assert abs(r.values[k] - v) < 4 * r.stddev[k], (
            k,
            r.values[k],
            v,
            r.stddev[k],
        )  # honest error bars
    assert r.in_sample_mape_pct < 1.0


@pytest.mark.slow
def test_korthikanti_table5_within_calculon_bounds():
    df = load_measurements(DATA / "korthikanti2022_table5_iteration_time.csv", purpose="fit")
    rows = resolve_rows(df)
    r = fit(
        parse_free(None, rows[0].hardware.constants),
        build_batch(rows),
        df["measured_step_time_s"].to_numpy(),
    )
    assert r.in_sample_mape_pct < 3.0  # Calculon: 3.65% mean
    assert r.in_sample_max_error_pct < 8.0  # Calculon: 8.87% max
    assert r.cv_method == "leave-one-out" and np.isfinite(r.cv_error_pct).all()
    assert r.cv_mape_pct >= r.in_sample_mape_pct  # held out is the harder figure
    assert r.cv_mape_pct < 8.0
    # constraints hold after the fit
    assert 0 < float(r.constants.matmul_efficiency_max) < 1
    assert float(r.constants.kernel_overhead_s) > 0


@pytest.mark.slow  # compiles a fit's gradient
def test_single_row_efficiency_fit_reproduces_the_measured_row():
    df = load_measurements(
        SHARED / "seed_distir_vs_colossal.csv",
        defaults={"model": "mlp-small", "hardware": "v100-32gb", "dtype": "fp16"},
    )
    df = df[df["has_measurement"]].reset_index(drop=True)
    rows = resolve_rows(df)
    param = parse_free("efficiency", rows[0].hardware.constants)
    assert param.free == ("efficiency",)
    r = fit(param, build_batch(rows), df["measured_step_time_s"].to_numpy())
    assert len(r.measured_s) == 1 and abs(r.error_pct[0]) < 0.1  # 4.5 samples/s at batch 4
    assert r.cv_mape_pct is None and r.stddev["efficiency"] is None  # nothing to hold out
    eff = np.asarray(r.constants.link_bandwidth_efficiency)
    assert (
        (eff > 0).all() and (eff < 1).all() and r.values["efficiency"] < 0
    )  # the run was slower than the preset
