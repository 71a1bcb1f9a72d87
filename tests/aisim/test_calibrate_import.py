"""`aisim calibrate import LOG...`: every log format through the command line, detection,
overrides with provenance ``option``, the one-line error naming the option a log lacks, --out
files that load as measurements, and bad options (exit 2)."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aisim.app import app
from calibration import load_measurements

FIXTURES = Path(__file__).parents[1] / "calibration" / "logs" / "fixtures"
MEGATRON = str(FIXTURES / "megatron_gpt_tp2_pp2.log")
TORCHTITAN = str(FIXTURES / "torchtitan_llama3_8b_fsdp4_tp2.log")
DEEPSPEED = str(FIXTURES / "deepspeed_zero2_bf16_8gpu.log")
COLOSSAL = str(FIXTURES / "colossal_llama2_13b_gemini_namespace.log")
runner = CliRunner()


def _import(*args: str, env: dict[str, str] | None = None):
    return runner.invoke(app, ["calibrate", "import", *args], env=env)


def _rows(*args: str) -> list[dict]:
    r = _import(*args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["rows"]


def _provenance(row: dict) -> dict[str, str]:
    return dict(x.split("=", 1) for x in row["provenance"].split(";"))


def _error_line(r) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.output
    return lines[0]


@pytest.mark.parametrize(
    ("log", "extra", "fmt", "expected"),
    [
        (MEGATRON, [], "megatron", dict(num_gpus=8, dp=2, tp=2, pp=2, global_batch_size=32)),
        (TORCHTITAN, [], "torchtitan", dict(model="llama3-8b", num_gpus=8, dp=4, tp=2, pp=1)),
        (DEEPSPEED, ["--model", "gpt3-1.3b"], "deepspeed", dict(num_gpus=8, dp=8, zero_stage=2)),
        (
            COLOSSAL,
            ["--num-gpus", "8"],
            "colossal",
            dict(model="llama2-13b", dp=8, plugin="gemini"),
        ),
    ],
)
def test_each_format_is_detected_and_imported(log, extra, fmt, expected):
    (auto,) = _rows(log, *extra)
    (forced,) = _rows(log, *extra, "--format", fmt)
    assert auto["format"] == forced["format"] == fmt
    assert auto == forced
    for key, value in expected.items():
        assert auto[key] == value, key
    assert auto["step_time_s"] > 0 and auto["iterations_averaged"] >= 3
    assert auto["source"].startswith(log + ":L")


def test_several_logs_of_several_formats_in_one_call():
    rows = _rows(MEGATRON, TORCHTITAN, DEEPSPEED, "--model", "gpt3-1.3b")
    assert [r["format"] for r in rows] == ["megatron", "torchtitan", "deepspeed"]
    assert {r["model"] for r in rows} == {"gpt3-1.3b"}  # the option wins over every log


def test_table_names_the_runs():
    r = _import(MEGATRON, env={"COLUMNS": "100"})
    assert r.exit_code == 0, r.output
    assert "1 run from 1 log" in r.stdout and "megatron_gpt_tp2_pp2.log:L5-L115" in r.stdout
    assert all(len(line) <= 100 for line in r.stdout.splitlines())


def test_override_wins_with_provenance_option():
    (logged,) = _rows(MEGATRON)
    (row,) = _rows(MEGATRON, "--tp", "4", "--hardware", "h100-sxm", "--skip-iterations", "3")
    assert logged["tp"] == 2 and _provenance(logged)["tp"] == "L36"
    assert row["tp"] == 4 and row["hardware"] == "h100-sxm"
    assert _provenance(row)["tp"] == _provenance(row)["hardware"] == "option"
    assert row["iterations_averaged"] != logged["iterations_averaged"]  # another warm-up


def test_the_stack_and_any_knob_are_stated_at_import(tmp_path):
    # what the log does not print (the framework's stack, eager PyTorch) is stated once for every
    # row, with "option" as its provenance; the measurement loader reads it back
    out = tmp_path / "rows.csv"
    r = _import(TORCHTITAN, "--stack", "torchtitan", "--set", "eager=on", "--out", str(out))
    assert r.exit_code == 0, r.output
    (row,) = _rows(TORCHTITAN, "--stack", "torchtitan", "--set", "eager=on")
    assert row["stack"] == "torchtitan" and row["eager"] is True
    assert _provenance(row)["stack"] == _provenance(row)["eager"] == "option"
    df = load_measurements(out, purpose="fit")
    assert df["stack"].tolist() == ["torchtitan"] and df["eager"].tolist() == [True]
    r = _import(TORCHTITAN, "--stack", "torchtitn")
    assert r.exit_code == 2 and "'--stack' = 'torchtitn'" in _error_line(r)
    assert "torchtitan" in _error_line(r)
    r = _import(TORCHTITAN, "--set", "nope=1")
    assert r.exit_code == 2 and "'--set' = 'nope=1'" in _error_line(r)


@pytest.mark.parametrize(
    ("log", "field", "flag"),
    [(COLOSSAL, "num_gpus", "--num-gpus"), (DEEPSPEED, "model", "--model")],
)
def test_missing_field_is_one_line_naming_the_option(log, field, flag):
    r = _import(log)
    assert r.exit_code == 2
    line = _error_line(r)
    assert f"field '{field}'" in line and line.endswith(f"pass {flag}")
    assert log in line


def test_bad_format_exits_2_naming_the_option():
    r = _import(MEGATRON, "--format", "nemo")
    assert r.exit_code == 2
    line = _error_line(r)
    assert "'--format' = 'nemo'" in line and "megatron" in line


def test_bad_out_suffix_and_missing_log_are_one_line(tmp_path):
    r = _import(MEGATRON, "--out", str(tmp_path / "rows.txt"))
    assert r.exit_code == 2 and "--out" in _error_line(r)
    r = _import(str(tmp_path / "nope.log"))
    assert r.exit_code == 2 and "nope.log" in _error_line(r)


@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_out_rows_load_as_measurements_for_fit(tmp_path, suffix):
    out = tmp_path / f"rows{suffix}"
    r = _import(MEGATRON, TORCHTITAN, "--hardware", "h100-sxm", "--out", str(out))
    assert r.exit_code == 0, r.output
    assert f"wrote 2 rows to {out}" in r.stdout
    if suffix == ".json":
        assert len(json.loads(out.read_text())) == 2
        return
    df = load_measurements(out, purpose="fit")
    assert len(df) == 2
    assert df["measured_step_time_s"].tolist() == pytest.approx([1.5035778, 2.0165041], rel=1e-6)
    assert set(df["hardware"]) == {"h100-sxm"}


@pytest.mark.slow
def test_out_csv_is_fitted_by_calibrate_fit(tmp_path):
    out = tmp_path / "rows.csv"
    r = _import(MEGATRON, TORCHTITAN, "--hardware", "h100-sxm", "--out", str(out))
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["calibrate", "fit", str(out), "--fit", "efficiency", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["rows"] == 2


def test_import_colossal_keeps_its_own_options():
    r = runner.invoke(app, ["calibrate", "import-colossal", "--help"])
    assert r.exit_code == 0
    for flag in ("--plugin", "--nnodes", "--skip-bad-rows", "--batch-size"):
        assert flag in r.stdout
    r = runner.invoke(app, ["calibrate", "import", "--help"])
    assert r.exit_code == 0 and "--skip-iterations" in r.stdout and "--format" in r.stdout
