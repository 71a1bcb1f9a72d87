"""Runs that cannot mix: a resumed run must be the stored one, a folder has one writer at a
time, and every output is written atomically (a new user's sequence of commands, replayed)."""

from __future__ import annotations

import fcntl
import json
import os

import pytest
from typer.testing import CliRunner

from aisim.app import app
from fl import checkpoint
from fl.run_folder import CHECKPOINT, LOCK, locked
from simbase.errors import AisimError

runner = CliRunner()
BASE = [
    "fl",
    "run",
    "--dataset",
    "digits",
    "--clients",
    "10",
    "--clients-per-round",
    "3",
    "--rounds",
    "2",
    "--devices",
    "server",
    "--checkpoint-every",
    "1",
]


def _err(res) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if ln.strip()]


@pytest.mark.slow
def test_resume_into_a_folder_of_another_run_is_refused(tmp_path):
    out = str(tmp_path / "run")
    # seed 1 finishes in the folder (its checkpoint stays there)
    assert runner.invoke(app, [*BASE, "--seed", "1", "--out", out]).exit_code == 0
    assert (tmp_path / "run" / CHECKPOINT).exists()
    # seed 2 with another learning rate starts in the same folder and dies before its first
    # checkpoint: its start replaced config.json and dropped seed 1's checkpoint
    from fl.run_folder import start_fresh

    cfg2 = json.loads((tmp_path / "run" / "config.json").read_text()) | {"seed": 2, "lr": 0.1}
    start_fresh(tmp_path / "run", cfg2)
    assert not (tmp_path / "run" / CHECKPOINT).exists()
    # resuming runs seed 2 from its start, not seed 1's results under seed 2's config
    res = runner.invoke(app, ["fl", "run", "--resume", out, "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["config"]["seed"] == 2 and s["config"]["lr"] == 0.1 and s["rounds"] == 2
    # asking to resume with a setting that differs from the stored one is refused in one line
    res = runner.invoke(app, ["fl", "run", "--resume", out, "--seed", "1"])
    assert res.exit_code == 1 and len(_err(res)) == 1
    assert "holds another run (seed 2 (asked 1))" in res.stderr


def test_a_checkpoint_of_another_configuration_is_refused(tmp_path):
    checkpoint.save(tmp_path, {"w": 0}, [], 0.0, checkpoint.TrainClock(), {"seed": 1, "lr": 0.01})
    with pytest.raises(AisimError, match=r"holds another run \(lr 0.01 \(asked 0.1\), seed 1"):
        checkpoint.load(tmp_path, {"w": 0}, {"seed": 2, "lr": 0.1})


def test_a_second_run_on_the_same_folder_is_refused(tmp_path):
    with locked(tmp_path):
        assert (tmp_path / LOCK).read_text().strip() == str(os.getpid())
        with pytest.raises(AisimError, match="another aisim fl run holds its lock"):
            with locked(tmp_path):
                pass
    with locked(tmp_path):  # released at the end of the first run
        pass


@pytest.mark.slow
def test_cli_refuses_a_folder_another_process_holds(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as another process's run would
    try:
        res = runner.invoke(app, [*BASE, "--out", str(out)])
    finally:
        os.close(fd)
    assert res.exit_code == 1 and len(_err(res)) == 1 and "holds its lock" in res.stderr


def test_trace_is_written_atomically(tmp_path, monkeypatch):
    import simbase.io

    out = tmp_path / "trace.csv"
    out.write_text("an older trace\n")

    def fail(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(simbase.io.os, "replace", fail)
    res = runner.invoke(app, ["fl", "trace", "--clients", "5", "--out", str(out)])
    assert res.exit_code != 0
    assert out.read_text() == "an older trace\n"  # never half a file
    assert [p.name for p in tmp_path.iterdir()] == ["trace.csv"]  # no temporary left
