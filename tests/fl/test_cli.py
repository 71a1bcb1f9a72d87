"""`aisim fl run` through Typer's CliRunner: files, --json, --config, --resume, bad input."""

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from aisim.app import app

runner = CliRunner()
SMALL = [
    "fl",
    "run",
    "--dataset",
    "digits",
    "--clients",
    "20",
    "--clients-per-round",
    "5",
    "--rounds",
    "4",
    "--local-epochs",
    "1",
    "--lr",
    "0.05",
    "--devices",
    "server",
]
COLUMNS = [
    "round",
    "sim_time_s",
    "train_loss",
    "test_accuracy",
    "test_loss",
    "clients_sampled",
    "clients_kept",
    "bytes_up",
    "bytes_down",
    "epsilon",
    "clip_norm",
]


@pytest.mark.slow
def test_run_writes_metrics_summary_plot_and_json(tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, [*SMALL, "--out", str(out), "--json", "--plot"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    for key in (
        "final_test_accuracy",
        "best_test_accuracy",
        "final_train_loss",
        "rounds",
        "sim_time_s",
        "wall_time_s",
        "client_updates_per_s",
    ):
        assert key in summary
    assert summary["rounds"] == 4 and summary["sim_time_s"] > 0
    m = pd.read_csv(out / "metrics.csv")
    assert list(m.columns) == COLUMNS and len(m) == 4
    assert json.loads((out / "summary.json").read_text())["rounds"] == 4
    assert (out / "accuracy.png").stat().st_size > 1000


@pytest.mark.slow
def test_config_toml_and_command_line_override(tmp_path):
    cfg = tmp_path / "exp.toml"
    cfg.write_text(
        'dataset = "digits"\nclients = 20\nclients-per-round = 4\nrounds = 2\n'
        'lr = 0.05\ndevices = "server"\nalgorithm = "fedavgm"\nserver_lr = 0.5\n'
    )
    res = runner.invoke(app, ["fl", "run", "--config", str(cfg), "--rounds", "3", "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["rounds"] == 3 and s["algorithm"] == "fedavgm" and s["clients"] == 20


@pytest.mark.slow
def test_resume_continues_to_the_same_metrics(tmp_path):
    args = [*SMALL, "--rounds", "5", "--checkpoint-every", "2", "--stragglers", "0.4"]
    assert runner.invoke(app, [*args, "--out", str(tmp_path / "a")]).exit_code == 0
    full = pd.read_csv(tmp_path / "a" / "metrics.csv")
    from fl.simulation import load_config_json, simulate

    cfg = load_config_json(tmp_path / "a")
    simulate(cfg, tmp_path / "b", stop_after=3)  # interrupted after round 3, checkpoint at 2
    res = runner.invoke(app, ["fl", "run", "--resume", str(tmp_path / "b"), "--json"])
    assert res.exit_code == 0, res.output
    resumed = pd.read_csv(tmp_path / "b" / "metrics.csv")
    pd.testing.assert_frame_equal(full, resumed)


@pytest.mark.slow
def test_divergence_exit_1_keeps_metrics(tmp_path):
    res = runner.invoke(
        app,
        [
            "fl",
            "run",
            "--rounds",
            "20",
            "--lr",
            "1e36",
            "--devices",
            "server",
            "--out",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 1
    assert "diverged" in res.stderr and "Traceback" not in res.output
    assert len(pd.read_csv(tmp_path / "metrics.csv")) >= 1


@pytest.mark.parametrize(
    "args, needle",
    [
        (
            ["--dataset", "cifar"],
            "'--dataset' = 'cifar': expected a known data set; did you mean cifar10, cifar100?",
        ),
        (["--clients", "10", "--clients-per-round", "11"], "clients-per-round"),
        (["--lr", "-0.1"], "lr"),
        (["--algorithm", "fedsgdd"], "algorithm"),
        (["--devices", "toaster"], "toaster"),
        (["--stragglers", "1.5"], "stragglers"),
        (["--memory-budget", "lots"], "memory-budget"),
        (["--mu", "0.5"], "'--mu' = 0.5: expected 0.0 here (μ is FedProx's"),
        (["--dataset", "digits", "--iid"], "'--iid' = True: expected False here"),
        (["--algorithm", "dpfedavg", "--sampling", "size"], "'--sampling' = 'size'"),
        (["--clip-quantile", "0.9"], "--clip-quantile"),
        (["--algorithm", "fedprox", "--stragglers", "0.5"], "epochs); raise --local-epochs"),
        # numpy's and JAX's generators take 32-bit seeds: a negative or 20-digit one is refused
        # before any data is made, not a traceback from numpy
        (["--seed", "-1"], "'--seed' = -1: expected an integer seed from 0 to 4294967295"),
        (["--seed", "123456789012345678901"], "'--seed' = 123456789012345678901"),
        # inf is refused up front, not trained until the model diverges
        (["--lr", "inf"], "'--lr' = inf: expected a finite learning rate > 0"),
        (["--algorithm", "fedprox", "--mu", "inf"], "'--mu' = inf: expected a finite number"),
        (["--algorithm", "fedavgm", "--server-momentum", "5"], "a momentum in [0, 1)"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, needle):
    res = runner.invoke(app, ["fl", "run", *args])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in res.output


@pytest.mark.parametrize("seed", ["-1", "4294967296"])
def test_trace_refuses_a_seed_its_generator_cannot_take_and_writes_nothing(seed, tmp_path):
    out = tmp_path / "trace.csv"
    res = runner.invoke(app, ["fl", "trace", "--seed", seed, "--out", str(out)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert f"'--seed' = {seed}" in res.stderr and not out.exists()


def test_bad_config_key_is_one_line_exit_2(tmp_path):
    cfg = tmp_path / "exp.toml"
    cfg.write_text("clients = 20\nlocal_epoch = 3\n")
    res = runner.invoke(app, ["fl", "run", "--config", str(cfg)])
    assert res.exit_code == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "local_epoch" in lines[0] and "local-epochs" in lines[0]


@pytest.mark.slow
def test_fedbuff_trace_and_client_eval_from_toml_and_flags(tmp_path):
    trace = tmp_path / "trace.csv"
    res = runner.invoke(app, ["fl", "trace", "--clients", "20", "--seed", "2", "--out", str(trace)])
    assert res.exit_code == 0 and "20 clients" in res.stdout
    cfg = tmp_path / "exp.toml"
    cfg.write_text(
        'algorithm = "fedbuff"\nbuffer-size = 2\nconcurrency = 4\nclient-eval = true\n'
        'personalize = "finetune"\nfinetune-steps = 2\nmodel = "logreg"\n'
    )
    args = [a for a in SMALL if a not in ("--clients-per-round", "5")]
    res = runner.invoke(
        app, [*args, "--config", str(cfg), "--trace", str(trace), "--out", str(tmp_path / "r")]
    )
    assert res.exit_code == 0, res.output
    assert (
        "FedBuff: 4 server updates of K = 2" in res.stdout and "per-client accuracy" in res.stdout
    )
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["fedbuff"]["concurrency"] == 4 and s["client_eval"]["finetune_steps"] == 2
    assert s["trace"] == str(trace) and s["config"]["buffer_size"] == 2
    m = pd.read_csv(tmp_path / "r" / "metrics.csv")
    assert {"staleness_mean", "client_acc_worst10", "client_acc_global_mean"} <= set(m.columns)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--buffer-size", "5"], "'--buffer-size' = 5: expected 10 here"),
        (["--algorithm", "fedbuff", "--concurrency", "50"], "'--concurrency' = 50"),
        (["--finetune-steps", "3"], "'--finetune-steps' = 3"),
        (["--client-eval", "--personalize", "meta"], "'--personalize' = 'meta'"),
        (["--trace", "nope.csv"], "'--trace' = 'nope.csv': expected an existing CSV file"),
    ],
)
def test_new_options_bad_input_is_one_line_exit_2(args, needle):
    res = runner.invoke(app, ["fl", "run", "--rounds", "1", *args])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in res.output
