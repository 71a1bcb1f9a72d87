"""One simulation over two processes (jax.distributed on 127.0.0.1) equals one process's."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from fl.distributed import initialize, process_group
from simbase.errors import AisimError

ROOT = Path(__file__).resolve().parents[2]


def test_process_group_from_flags_and_environment():
    assert process_group(environ={}) is None
    g = process_group("10.0.0.1:1234", 2, 1, environ={})
    assert (g.coordinator, g.num_processes, g.process_id) == ("10.0.0.1:1234", 2, 1)
    env = {"JAX_COORDINATOR_ADDRESS": "host:99", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
    assert process_group(environ=env) == process_group("host:99", 4, 3, environ={})
    assert process_group(process_id=0, environ=env).process_id == 0  # a flag wins


@pytest.mark.parametrize(
    "args,field",
    [
        (("h:1", 2, None), "process_id"),
        ((None, 2, 0), "coordinator"),
        (("nohost", 2, 0), "coordinator"),
        (("h:99999", 2, 0), "coordinator"),
        (("h:1", 0, 0), "num_processes"),
        (("h:1", 2, 2), "process_id"),
    ],
)
def test_bad_process_group_names_its_field(args, field):
    with pytest.raises(AisimError) as e:
        process_group(*args, environ={})
    assert e.value.field == field


def test_initialize_after_jax_started_is_an_error():
    import jax

    jax.numpy.zeros(1).block_until_ready()  # this process's backend is running
    with pytest.raises(AisimError, match="before JAX runs anything"):
        initialize(process_group("127.0.0.1:1", 2, 0, environ={}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RUN = [
    "fl", "run", "--dataset", "digits", "--partition", "dirichlet", "--clients", "40",
    "--clients-per-round", "12", "--rounds", "3", "--local-epochs", "2", "--lr", "0.05",
    "--algorithm", "fedprox", "--mu", "0.1", "--stragglers", "0.3", "--devices", "server",
]  # fmt: skip


def _cli(args, env_extra, out):
    env = dict(os.environ, JAX_PLATFORMS="cpu", **env_extra)
    env.pop("XLA_FLAGS", None) if "XLA_FLAGS" not in env_extra else None
    code = "import sys; from aisim.app import main; sys.argv = ['aisim'] + sys.argv[1:]; main()"
    return subprocess.Popen(
        [sys.executable, "-c", code, *RUN, *args, "--out", str(out), "--json"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_two_processes_give_the_metrics_of_one(tmp_path):
    port = _free_port()
    group = ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2"]
    # process 1 reads its group from the experiment file, as a cluster launcher would write it
    exp = tmp_path / "exp.toml"
    exp.write_text(f'coordinator = "127.0.0.1:{port}"\nnum-processes = 2\nprocess_id = 1\n')
    procs = [
        _cli([*group, "--process-id", "0"], {}, tmp_path / "p0"),
        _cli(["--config", str(exp)], {}, tmp_path / "p1"),
    ]
    one = _cli([], {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}, tmp_path / "one")
    outs = [p.communicate(timeout=300) for p in (*procs, one)]
    for p, (_, err) in zip((*procs, one), outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    assert (
        outs[1][0] == "" and not (tmp_path / "p1").exists()
    )  # process 1 neither prints nor writes
    assert json.loads(outs[0][0])["jax_processes"] == 2
    assert json.loads(outs[2][0])["jax_processes"] == 1
    two = pd.read_csv(tmp_path / "p0" / "metrics.csv")
    ref = pd.read_csv(tmp_path / "one" / "metrics.csv")
    assert len(two) == 3
    # The same sharded program over two devices, in two processes or one: the same numbers.
    pd.testing.assert_frame_equal(two, ref, check_exact=False, rtol=1e-6)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--num-processes", "2", "--process-id", "0"], "'--coordinator' = None: expected a value"),
        (["--coordinator", "nohost", "--num-processes", "2", "--process-id", "0"], "HOST:PORT"),
        (
            ["--coordinator", "h:1", "--num-processes", "2", "--process-id", "2"],
            "'--process-id' = 2",
        ),
        (["--coordinator", "h:1", "--num-processes", "2"], "'--process-id' = None"),
    ],
)
def test_cli_bad_process_flags_are_one_line_exit_2(args, needle, monkeypatch):
    from typer.testing import CliRunner

    from aisim.app import app

    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    res = CliRunner().invoke(app, ["fl", "run", "--rounds", "1", *args])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in res.output


@pytest.mark.parametrize(
    "toml, args, needle",
    [
        ('coordinator = "h:1"\nnum_processes = 2\nprocess_id = 2\n', [], "'process_id' = 2"),
        ('coordinator = "h:1"\nnum_processes = "two"\n', [], "'num_processes' = 'two'"),
        # a flag wins over the file, and its error names the flag
        ('coordinator = "h:1"\nnum_processes = 2\nprocess_id = 0\n', ["--process-id", "5"],
         "'--process-id' = 5"),
    ],
)  # fmt: skip
def test_process_group_in_the_experiment_file(toml, args, needle, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from aisim.app import app

    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    exp = tmp_path / "exp.toml"
    exp.write_text(toml)
    res = CliRunner().invoke(app, ["fl", "run", "--rounds", "1", "--config", str(exp), *args])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], lines
    assert ("exp.toml" in lines[0]) == (not args)  # the file is named when the value is its own
