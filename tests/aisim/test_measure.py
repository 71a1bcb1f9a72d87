"""`aisim measure` through the command line: real timed steps on four host devices whose CSV
loads back as measurements, a sweep of widths, and bad options (one line, exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pandas as pd
import pytest
from typer.testing import CliRunner

from aisim.app import app
from calibration.measurements import load_measurements

ROOT = Path(__file__).resolve().parents[2]
TINY_GPT = ["--model", "gpt2", "--layers", "1", "--hidden", "32", "--heads", "4", "--seq-len",
            "16", "--vocab", "64"]  # fmt: skip


@pytest.mark.slow
def test_subprocess_on_four_host_devices_writes_loadable_rows(tmp_path):
    out = tmp_path / "meas.csv"
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    cmd = [sys.executable, "-m", "aisim", "measure", *TINY_GPT, "--dp", "1,2", "--tp", "2",
           "--global-batch", "8", "--steps", "2", "--warmup", "1", "--out", str(out), "--json"]  # fmt: skip
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert len(doc["rows"]) == 2
    df = load_measurements(out, purpose="fit")
    assert df["num_gpus"].tolist() == [2, 4]
    assert df["dp"].tolist() == [1, 2] and df["tp"].tolist() == [2, 2]
    assert df["pp"].tolist() == [1, 1] and df["num_microbatches"].tolist() == [1, 1]
    assert df["micro_batch_size"].tolist() == [8, 4]
    assert set(df["hardware"]) == {"cpu-host"} and set(df["device_kind"]) == {"cpu"}
    assert df["num_layers"].tolist() == [1, 1] and df["hidden_size"].tolist() == [32, 32]
    assert df["has_measurement"].all() and (df["measured_step_time_s"] > 0).all()
    assert df["throughput_samples_per_s"].to_numpy() == pytest.approx(
        8 / df["step_time_s"].to_numpy()
    )
    assert set(df["jax_version"]) == {jax.__version__}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--params", "20K", "--dp", "3"], "divisor of the"),
        (["--params", "20K", "--global-batch", "0"], "comma-separated positive integers"),
        (["--params", "20K", "--dp", "1", "--global-batch", "8", "--heads", "4"], "MLP has no"),
        (["--model", "gtp2"], "did you mean gpt2"),
        ([], "exactly one of --model"),
        (["--params", "20K", "--dtype", "fp64"], "one of fp32, bf16, fp16"),
        (["--params", "20K", "--out", "x.txt"], "expected a file name ending in .csv"),
        ([*TINY_GPT, "--hidden", "30"], "a divisor of --hidden 30"),
        # a zero dimension is refused before JAX sees a zero-size array (or divides by it)
        (["--model", "gpt2", "--seq-len", "0"], "'--seq-len' = 0: expected a positive integer"),
        (["--model", "gpt2", "--heads", "0"], "'--heads' = 0: expected a positive integer"),
    ],
)
def test_bad_options_one_line_exit_2(args, needle):
    res = CliRunner().invoke(app, ["measure", *args])
    assert res.exit_code == 2, res.output
    assert needle in res.output
    assert "Traceback" not in res.output


@pytest.mark.slow
def test_measure_sweeps_widths_and_rejects_a_bad_statistic(tmp_path):
    out = tmp_path / "m.csv"
    res = CliRunner().invoke(app, ["measure", "--model", "mlp-small", "--layers", "1,2", "--hidden",
                                   "8,16", "--global-batch", "4", "--steps", "1", "--warmup", "0",
                                   "--out", str(out), "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out)
    assert list(zip(df["num_layers"], df["hidden_size"], strict=True)) == [
        (1, 8),
        (1, 16),
        (2, 8),
        (2, 16),
    ]
    assert (df["input_size"] == df["hidden_size"]).all()
    res = CliRunner().invoke(app, ["measure", "--params", "20K", "--statistic", "mean"])
    assert res.exit_code == 2 and "one of median, min" in res.output
