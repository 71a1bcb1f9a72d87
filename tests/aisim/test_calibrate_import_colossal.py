"""`aisim calibrate import-colossal` through the command line: rows that load back as
measurements, and a bad option, a missing option or a log that is not a file as one line
(exit 2). The parser itself: tests/calibration/test_colossal.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from aisim.calibrate_import import import_colossal_command
from calibration import measurements as meas
from calibration.measurements import load_measurements

FIX = Path(__file__).parents[1] / "calibration" / "fixtures"


@pytest.fixture(autouse=True)
def presets(monkeypatch):
    names = {"model": ["gpt2", "llama2-7b", "llama2-13b", "llama2-70b"],
             "hardware": ["h100-sxm", "h200", "a100-40gb"]}  # fmt: skip
    monkeypatch.setattr(meas, "_preset_names", lambda kind: names[kind])


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("import-colossal")(import_colossal_command)
    app.command("noop")(lambda: None)  # a second command keeps the sub-command name
    return app


def test_cli_writes_csv_that_loads_back(tmp_path):
    out = tmp_path / "rows.csv"
    res = CliRunner().invoke(_app(), ["import-colossal", str(FIX / "llama2_7b_3d_tp2_pp2.log"),
                                      str(FIX / "sweep_two_runs.log"), "--hardware", "h100-sxm",
                                      "--out", str(out), "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert len(doc["rows"]) == 3 and len(doc["skipped"]) == 1
    back = load_measurements(out, purpose="fit")
    assert back["has_measurement"].all()
    assert back["measured_step_time_s"].tolist() == pytest.approx([32 / 4.10, 16 / 9.35, 24 / 9.45])


def test_cli_bad_option_is_one_line_exit_2(tmp_path):
    res = CliRunner().invoke(_app(), ["import-colossal", str(FIX / "sweep_two_runs.log"),
                                      "--hardware", "h1OO"])  # fmt: skip
    assert res.exit_code == 2
    assert "expected a hardware preset" in res.output


def test_cli_hint_names_the_flag(tmp_path):
    log = tmp_path / "multi.log"
    log.write_text("colossalai run --nproc_per_node 8 --hostfile hosts benchmark.py -c 70b -b 4\n"
                   "Throughput: 3.27 samples/sec, TFLOPS per GPU: 469.10\n")  # fmt: skip
    res = CliRunner().invoke(_app(), ["import-colossal", str(log), "--hardware", "h200"])
    assert res.exit_code == 2
    assert f"{log}: run 1: the command uses --hostfile" in res.output
    assert "pass --num-gpus (or --nnodes)" in res.output


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_cli_log_that_is_not_a_file_is_one_line(tmp_path, kind):
    import os

    path = tmp_path / "logs"
    if kind == "directory":
        path.mkdir()
    else:
        os.mkfifo(path)
    res = CliRunner().invoke(_app(), ["import-colossal", str(path)])
    assert res.exit_code == 2, res.output
    assert res.output.strip() == f"error: {path}: not a regular file (expected a log file)"
