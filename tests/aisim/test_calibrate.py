"""`aisim calibrate fit/predict`: JSON keys, profile round trip, determinism, bad rows."""

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from aisim.app import app
from simbase.errors import AisimError

DATA = Path(__file__).parents[2] / "calibration" / "data"
SHIPPED = Path(__file__).parents[2] / "calibration" / "data"
runner = CliRunner()


@pytest.mark.slow
def test_fit_json_profile_is_deterministic_and_usable(tmp_path):
    meas = str(DATA / "korthikanti2022_table5_iteration_time.csv")
    p1, p2, png = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "parity.png"
    r = runner.invoke(
        app,
        [
            "calibrate",
            "fit",
            meas,
            "--hardware",
            "a100-80gb",
            "--json",
            "--out",
            str(p1),
            "--plot",
            str(png),
        ],
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    for key in (
        "rows",
        "in_sample_mape_pct",
        "in_sample_max_error_pct",
        "cv_mape_pct",
        "constants",
    ):
        assert key in doc
    assert doc["rows"] == 8 and doc["in_sample_mape_pct"] < 3 and doc["in_sample_max_error_pct"] < 8
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r2 = runner.invoke(app, ["calibrate", "fit", meas, "--hardware", "a100-80gb", "--out", str(p2)])
    assert r2.exit_code == 0, r2.output
    assert p1.read_bytes() == p2.read_bytes()  # same data and seed: same bytes
    prof = json.loads(p1.read_text())
    assert (
        prof["schema"] == "aisim.profile/1"
        and prof["hardware"] == "a100-80gb"
        and len(prof["data_sha256"]) == 64
    )
    # the profile feeds predict: its predictions reproduce the fit's in-sample errors
    out = tmp_path / "pred.csv"
    r3 = runner.invoke(app, ["calibrate", "predict", meas, "--profile", str(p1), "--out", str(out)])
    assert r3.exit_code == 0, r3.output
    pred = pd.read_csv(out)
    assert (
        len(pred) == 8 and "predicted_step_time_s" in pred and "measured_iteration_time_s" in pred
    )
    fitted = [row["error_pct"] for row in doc["per_row"]]
    assert (pred["error_pct"] - pd.Series(fitted)).abs().max() < 0.01


@pytest.mark.slow
def test_colossal_seed_single_row_then_predict_fills_the_rest(tmp_path):
    seed = str(SHIPPED / "seed_distir_vs_colossal.csv")
    prof = tmp_path / "v100.json"
    common = ["--hardware", "v100-32gb", "--model", "mlp-small", "--dtype", "fp16"]
    r = runner.invoke(
        app,
        ["calibrate", "fit", seed, *common, "--fit", "efficiency", "--out", str(prof), "--json"],
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["rows"] == 1
    out = tmp_path / "pred.csv"
    r = runner.invoke(
        app, ["calibrate", "predict", seed, *common, "--profile", str(prof), "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    pred = pd.read_csv(out)
    measured = pred[(pred["kind"] == "measured")]
    assert abs(measured["predicted_throughput_samples_per_s"].iloc[0] - 4.5) < 0.01
    assert measured[
        "predicted_throughput_samples_per_s"
    ].is_monotonic_increasing  # bigger batches, more samples/s


@pytest.mark.slow  # two predictions with a micro-batch search each
def test_benchmark_rows_bad_row_rejected_unless_skipped(tmp_path):
    bench = str(SHIPPED / "colossalai_readme_benchmark.csv")
    r = runner.invoke(app, ["calibrate", "predict", bench, "--out", str(tmp_path / "p.csv")])
    assert r.exit_code == 2
    assert ":3: field 'dp' = 2" in r.stderr and "--skip-bad-rows" in r.stderr
    r = runner.invoke(
        app, ["calibrate", "predict", bench, "--skip-bad-rows", "--out", str(tmp_path / "p.csv")]
    )
    assert r.exit_code == 0, r.output
    pred = pd.read_csv(tmp_path / "p.csv")
    assert len(pred) == 3 and pred["chosen_micro_batch_size"].notna().all()


def test_bad_fit_names_exit_2(tmp_path):
    meas = str(DATA / "korthikanti2022_table5_iteration_time.csv")
    r = runner.invoke(app, ["calibrate", "fit", meas, "--fit", "matmul_eficiency_max"])
    assert r.exit_code == 2 and "--fit" in r.stderr and "matmul_efficiency_max" in r.stderr


def test_bad_fit_names_are_data_in_the_library():
    from calibration import parse_free
    from perfmodel import load_hardware

    base = load_hardware("a100-80gb").constants
    with pytest.raises(AisimError) as e:
        parse_free("matmul_eficiency_max", base)
    assert e.value.field == "free" and e.value.value == "matmul_eficiency_max"
    assert "matmul_efficiency_max" in e.value.expected and "--fit" not in str(e.value)


@pytest.mark.parametrize("command", ["fit", "predict"])
def test_input_that_is_not_a_regular_file_is_one_line(tmp_path, command):
    # a directory, a FIFO (which pandas would block on) and /proc/self/mem (an I/O error)
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    for path, why in (
        (tmp_path, "not a regular file (expected a CSV file)"),
        (fifo, "not a regular file (expected a CSV file)"),
        (Path("/proc/self/mem"), "cannot read the CSV file"),
    ):
        r = runner.invoke(app, ["calibrate", command, str(path), "--hardware", "a100-80gb"])
        assert r.exit_code == 2, r.output
        assert r.stderr.startswith(f"error: {path}: {why}"), r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.output


def test_profile_for_other_hardware_names_the_flag(tmp_path):
    prof = tmp_path / "p.json"
    prof.write_text(
        json.dumps({"schema": "aisim.profile/1", "hardware": "a100-80gb", "constants": {}})
    )
    table = tmp_path / "t.csv"
    table.write_text("model,num_gpus,tp,pp,global_batch_size,micro_batch_size\ngpt2,8,1,1,64,8\n")
    r = runner.invoke(
        app, ["calibrate", "predict", str(table), "--hardware", "h200", "--profile", str(prof)]
    )
    assert r.exit_code == 2, r.output
    assert f"{prof}: field 'hardware' = 'a100-80gb'" in r.stderr
    assert "pass --hardware a100-80gb" in r.stderr


def test_fit_without_measured_rows_is_one_line(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("model,hardware,num_gpus,global_batch_size,step_time_s\ngpt2,h200,8,64,\n")
    r = runner.invoke(app, ["calibrate", "fit", str(table)])
    assert r.exit_code == 2, r.output
    assert f"{table}: field 'measured_step_time_s'" in r.stderr and "nothing to fit" in r.stderr
