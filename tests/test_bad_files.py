"""Files the loaders cannot read (a directory, a FIFO, a file that returns an I/O error) give one
clear error line and exit 1 or 2, never a traceback: every command that reads a file, and the
library loaders as AisimError."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import calibration
import perfmodel
from aisim.app import app
from simbase.errors import AisimError

runner = CliRunner()
IO_ERROR = Path("/proc/self/mem")  # a regular file whose read fails with EIO


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad")
    (root / "dir").mkdir()
    files = {"directory": root / "dir"}
    if hasattr(os, "mkfifo"):
        os.mkfifo(root / "fifo")
        files["fifo"] = root / "fifo"
    if IO_ERROR.exists():
        files["io-error"] = IO_ERROR
    return files


# (command line with {f} for the bad file); each reads the file through one loader
COMMANDS = {
    "measurement csv (predict)": "calibrate predict {f}",
    "measurement csv (fit)": "calibrate fit {f} --hardware a100-80gb",
    "hardware json": "perf estimate --hardware-file {f}",
    "model json": "perf estimate --model-file {f}",
    "profile (estimate)": "perf estimate --profile {f}",
    "profile (grid)": "perf grid --gpus 8 --model gpt3-125m --profile {f}",
    "profile (sensitivity)": "perf sensitivity --gpus 8 --tp 1 --pp 1 --profile {f}",
    "colossal log": "calibrate import-colossal {f}",
    "fl experiment toml": "fl run --config {f} --rounds 1",
    "collab profile": "collab sweep --profile {f}",
    "collab table": "collab fit {f}",
}


def _one_error_line(r) -> None:
    assert r.exit_code in (1, 2), r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("kind", ["directory", "fifo", "io-error"])
@pytest.mark.parametrize("what", list(COMMANDS))
def test_commands_give_one_line(bad_files, kind, what):
    if kind not in bad_files:
        pytest.skip(f"no {kind} on this system")
    f = bad_files[kind]
    r = runner.invoke(app, COMMANDS[what].format(f=f).split())
    _one_error_line(r)
    assert str(f) in r.output


LOADERS = {
    "load_measurements": calibration.load_measurements,
    "read_profile": calibration.read_profile,
    "load_profile_covariance": calibration.load_profile_covariance,
    "load_hardware_file": perfmodel.load_hardware_file,
    "load_model_file": perfmodel.load_model_file,
}


@pytest.mark.parametrize("kind", ["directory", "fifo", "io-error"])
@pytest.mark.parametrize("loader", list(LOADERS))
def test_library_loaders_raise_aisim_error(bad_files, kind, loader):
    if kind not in bad_files:
        pytest.skip(f"no {kind} on this system")
    with pytest.raises(AisimError) as e:
        LOADERS[loader](bad_files[kind])
    assert str(bad_files[kind]) in str(e.value)


def test_the_message_names_what_was_expected_with_its_article(bad_files):
    from simbase.io import read_text

    for what, text in (("experiment file", "an experiment file"), ("CSV file", "a CSV file")):
        with pytest.raises(AisimError) as e:
            read_text(bad_files["directory"], what)
        assert str(e.value).endswith(f"not a regular file (expected {text})")
    r = runner.invoke(app, ["fl", "run", "--config", str(bad_files["directory"]), "--rounds", "1"])
    _one_error_line(r)
    assert "(expected an experiment file)" in r.output
