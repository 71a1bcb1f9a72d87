"""`aisim fl`: federated training simulation (``aisim fl run``).

The command is a thin shell over :func:`fl.simulate`: it merges ``--config`` TOML values under
the options given on the command line, validates them (an error about a value that came from the
file names the file), shows a progress bar on stderr, writes ``DIR/metrics.csv`` and
``DIR/summary.json`` and, with ``--json``, prints the summary as one JSON document.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from aisim.console import console, err_console, flag_names, guard, print_json
from simbase.errors import AisimError

app = typer.Typer(no_args_is_help=True, help="Federated training simulation.")

_opt = typer.Option
# library field names -> flags (the config fields are --field-name)
FLAGS = flag_names(out_dir="--resume")


@app.command("run")
def run(
    ctx: typer.Context,
    dataset: Annotated[
        str, _opt(help="synthetic, digits, mnist or shakespeare (one client per role).")
    ] = "synthetic",
    alpha: Annotated[float, _opt(help="Synthetic(α, β): std of the local model means.")] = 1.0,
    beta: Annotated[float, _opt(help="Synthetic(α, β): std of the local input means.")] = 1.0,
    iid: Annotated[bool, _opt("--iid", help="Synthetic-IID instead of Synthetic(α, β).")] = False,
    partition: Annotated[
        str, _opt(help="digits/mnist: iid, dirichlet, shards or quantity.")
    ] = "iid",
    dirichlet_alpha: Annotated[
        float, _opt(help="Concentration α of the Dirichlet label skew.")
    ] = 0.5,
    dirichlet_form: Annotated[
        str,
        _opt(
            help="per-class (each class split over clients by Dir(α), Flower/NIID-Bench) or "
            "per-client (each client's classes ~ Dir(α·prior), Hsu et al. 2019)."
        ),
    ] = "per-class",
    model: Annotated[
        str | None, _opt(help="logreg, mlp, 2nn, cnn or lstm (default: by data set).")
    ] = None,
    clients: Annotated[int, _opt(help="Population size (synthetic: up to 1M).")] = 30,
    clients_per_round: Annotated[int, _opt(help="Clients sampled each round.")] = 10,
    rounds: Annotated[int, _opt(help="Communication rounds.")] = 200,
    local_epochs: Annotated[int, _opt(help="Local epochs E.")] = 1,
    batch_size: Annotated[int, _opt(help="Local batch size (samples).")] = 10,
    lr: Annotated[float, _opt(help="Client SGD learning rate.")] = 0.01,
    algorithm: Annotated[
        str,
        _opt(
            help="fedavg, fedprox, fedavgm, fedadam, fedyogi, fedadagrad, scaffold, dpfedavg "
            "or fedbuff (asynchronous; --rounds counts server updates)."
        ),
    ] = "fedavg",
    mu: Annotated[float, _opt(help="FedProx proximal weight μ.")] = 0.0,
    server_lr: Annotated[
        float | None, _opt(help="Server learning rate (default 1, adaptive 0.01).")
    ] = None,
    server_momentum: Annotated[float, _opt(help="FedAvgM server momentum.")] = 0.9,
    tau: Annotated[
        float, _opt(help="FedAdam/FedYogi/FedAdagrad adaptivity τ (Reddi et al. 2021).")
    ] = 1e-3,
    adaptive_form: Annotated[
        str,
        _opt(help="reddi (the paper's: no bias correction, τ beside √v) or optax (eps = τ)."),
    ] = "reddi",
    sampling: Annotated[
        str,
        _opt(
            help="uniform (without replacement, size-weighted mean) or size (FedProx: "
            "with replacement ∝ data size, plain mean)."
        ),
    ] = "uniform",
    stragglers: Annotated[
        float,
        _opt(
            help="Fraction f of sampled clients that straggle: m − round(m(1−f)) of them, 1..E−1 epochs."
        ),
    ] = 0.0,
    deadline_s: Annotated[
        float | None,
        _opt(
            help="Round deadline in simulated seconds (also how long a silent client is waited for)."
        ),
    ] = None,
    devices: Annotated[str, _opt(help="Device preset mix, e.g. phone:0.7,laptop:0.3.")] = "phone",
    max_local_steps: Annotated[
        int | None, _opt(help="Cap on local steps per client per round.")
    ] = None,
    memory_budget: Annotated[str, _opt(help="Memory for one chunk of clients, e.g. 4GB.")] = "4GB",
    clip_norm: Annotated[float, _opt(help="DP-FedAvg: L2 clip norm of each update.")] = 1.0,
    noise_multiplier: Annotated[float, _opt(help="DP-FedAvg: noise std / clip norm.")] = 1.0,
    delta: Annotated[float, _opt(help="DP-FedAvg: δ of the reported (ε, δ).")] = 1e-5,
    adaptive_clip: Annotated[
        bool,
        _opt(
            "--adaptive-clip",
            help="DP-FedAvg: adapt the clip norm to a quantile (Andrew et al. 2021).",
        ),
    ] = False,
    clip_quantile: Annotated[
        float, _opt(help="Adaptive clipping: target quantile γ of update norms.")
    ] = 0.5,
    clip_lr: Annotated[float, _opt(help="Adaptive clipping: geometric learning rate η_C.")] = 0.2,
    clip_count_stddev: Annotated[
        float | None,
        _opt(help="Adaptive clipping: noise σ_b on the unclipped count (default m/20)."),
    ] = None,
    seed: Annotated[int, _opt(help="Seed of data, systems and training.")] = 0,
    eval_every: Annotated[int, _opt(help="Evaluate the global model every K rounds.")] = 1,
    checkpoint_every: Annotated[
        int, _opt(help="Write DIR/checkpoint.msgpack every K rounds.")
    ] = 10,
    target_accuracy: Annotated[
        float | None, _opt(help="Report rounds and time to this test accuracy.")
    ] = None,
    shard: Annotated[bool, _opt(help="Shard the client axis over all JAX devices.")] = True,
    buffer_size: Annotated[
        int, _opt(help="fedbuff: client updates K per server update (Nguyen et al. 2022).")
    ] = 10,
    concurrency: Annotated[int, _opt(help="fedbuff: clients in flight C.")] = 20,
    trace: Annotated[
        str | None,
        _opt(help="Per-client availability and speed trace CSV (see aisim fl trace)."),
    ] = None,
    client_eval: Annotated[
        bool,
        _opt(
            "--client-eval",
            help="Evaluate every --eval-every rounds on each client's own local test split.",
        ),
    ] = False,
    local_test_fraction: Annotated[
        float, _opt(help="--client-eval: share of each client's samples held out for its test.")
    ] = 0.2,
    personalize: Annotated[
        str, _opt(help="--client-eval: none, finetune (local steps) or ditto (Li et al. 2021).")
    ] = "none",
    finetune_steps: Annotated[
        int, _opt(help="--personalize finetune: local SGD steps before evaluation.")
    ] = 5,
    ditto_lambda: Annotated[
        float, _opt(help="--personalize ditto: pull λ of each personal model to the global one.")
    ] = 0.1,
    coordinator: Annotated[
        str | None,
        _opt(
            help="Several processes or hosts: HOST:PORT of process 0's jax.distributed service "
            "(or JAX_COORDINATOR_ADDRESS)."
        ),
    ] = None,
    num_processes: Annotated[
        int | None, _opt(help="Several processes: how many (or JAX_NUM_PROCESSES).")
    ] = None,
    process_id: Annotated[
        int | None,
        _opt(help="Several processes: this one's id, 0..N-1; 0 writes (or JAX_PROCESS_ID)."),
    ] = None,
    config: Annotated[
        Path | None, _opt("--config", help="EXPERIMENT.toml with the same option names.")
    ] = None,
    out: Annotated[Path | None, _opt("--out", help="Output folder DIR.")] = None,
    resume: Annotated[Path | None, _opt("--resume", help="Continue the run in DIR.")] = None,
    plot: Annotated[bool, _opt("--plot", help="Draw DIR/accuracy.png.")] = False,
    json_out: Annotated[bool, _opt("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Simulate federated training; one metrics row per round."""
    with guard(FLAGS):
        from fl.config import PROCESS_FIELDS, load_toml
        from fl.distributed import initialize, is_writer, process_group

        values = load_toml(config) if config is not None and resume is None else {}
        placed = dict(coordinator=coordinator, num_processes=num_processes, process_id=process_id)
        from_file_process = []
        for name in PROCESS_FIELDS:  # the command line wins over the experiment file
            in_file = values.pop(name, None)
            if placed[name] is None and in_file is not None:
                placed[name] = in_file
                from_file_process.append(name)
        try:
            group = process_group(**placed)
        except AisimError as e:
            if e.source is None and e.field in from_file_process:
                raise e.relabel(source=str(config)) from None
            raise
        if group is not None:
            if resume is not None and group.num_processes > 1:
                raise AisimError("--resume runs in one process; drop --coordinator")
            # Importing the libraries has started JAX's local backend; nothing made so far is
            # used by the run, so the distributed backend replaces it.
            initialize(group, restart_backend=True)
        from fl import ExperimentConfig, load_config_json, simulate, validate

        from_file: dict[str, str] = {}  # config field -> the file its value came from
        if resume is not None:
            if out is not None and Path(out) != Path(resume):
                raise AisimError("--resume DIR writes into DIR; drop --out or make it the same")
            cfg = load_config_json(resume)
            out_dir: Path | None = Path(resume)
            from_file = dict.fromkeys(cfg.to_dict(), str(Path(resume) / "config.json"))
        else:
            for f in dataclasses.fields(ExperimentConfig):
                src = ctx.get_parameter_source(f.name)
                if f.name not in values or getattr(src, "name", "") == "COMMANDLINE":
                    values[f.name] = ctx.params[f.name]
                else:
                    from_file[f.name] = str(config)
            cfg = ExperimentConfig(**values)
            out_dir = out
        try:
            validate(cfg)
        except AisimError as e:
            if e.source is None and e.field in from_file:
                raise e.relabel(source=from_file[e.field]) from None
            raise
        if plot and out_dir is None:
            raise AisimError("--plot draws into the output folder; give --out DIR")
        writer = is_writer()
        result = _run_with_progress(cfg, out_dir if writer else None, resume is not None, simulate)
        if not writer:  # process 0 writes and prints the run (fl.distributed)
            return
        s = result.summary
        if plot and out_dir is not None:
            from fl import plot_accuracy

            plot_accuracy({cfg.algorithm: result.metrics}, out_dir / "accuracy.png")
        if json_out:
            print_json({k: v for k, v in s.items()})
        else:
            _print_human(result, out_dir)
        if s["diverged"]:
            err_console.print(
                f"[red]error:[/red] training diverged at round {s['diverged_round']} (NaN or "
                f"infinite model); metrics of the rounds so far are kept"
                + (f" in {out_dir}/metrics.csv" if out_dir else ""),
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(1)


def _run_with_progress(cfg, out_dir, resume, simulate):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("[bold]fl run[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
        disable=not err_console.is_terminal,
    ) as progress:
        task = progress.add_task("rounds", total=cfg.rounds, info="")

        def on_round(row):
            acc = row["test_accuracy"]
            info = f"acc {acc:.3f}" if acc == acc else ""
            progress.update(task, completed=row["round"], info=info)

        return simulate(cfg, out_dir, resume=resume, on_round=on_round)


def _print_human(result, out_dir) -> None:
    from aisim.console import rich_table

    s = result.summary
    tail = result.metrics.dropna(subset=["test_accuracy"]).tail(5)
    tail = tail.dropna(axis=1, how="all")  # epsilon and clip_norm exist only with dpfedavg
    console.print(rich_table(tail, title=f"{s['algorithm']} on {s['dataset']} ({s['model']})"))
    rate = s["client_updates_per_s"]
    rate = "n/a" if rate is None else f"{rate:.4g}"
    console.print(
        f"final test accuracy {s['final_test_accuracy']}, best {s['best_test_accuracy']}, "
        f"final train loss {s['final_train_loss']}, {s['rounds']} rounds, "
        f"simulated {s['sim_time_s']:.4g} s, wall {s['wall_time_s']:.3g} s, "
        f"{rate} client updates/s (training only: no evaluation, no first-round compile)",
        highlight=False,
    )
    if "privacy" in s:
        p = s["privacy"]
        console.print(
            f"DP: noise multiplier {p['noise_multiplier']}, ε = {p['epsilon']:.4g} at "
            f"δ = {p['delta']:g} ({p['accountant']}; {p['sampling_bound']})",
            highlight=False,
        )
    if "fedbuff" in s:
        f = s["fedbuff"]
        console.print(
            f"FedBuff: {f['server_updates']} server updates of K = {f['buffer_size']} with "
            f"C = {f['concurrency']} in flight, mean staleness {f['staleness_mean']:.3g} "
            f"(max {f['staleness_max']})",
            highlight=False,
        )
    if "client_eval" in s:
        c = s["client_eval"]
        line = (
            f"per-client accuracy ({c['personalize']}): mean {c['client_acc_mean']:.4g}, "
            f"p10 {c['client_acc_p10']:.4g}, p50 {c['client_acc_p50']:.4g}, "
            f"p90 {c['client_acc_p90']:.4g}, worst 10% {c['client_acc_worst10']:.4g}"
        )
        if "client_acc_global_mean" in c:
            line += f" (global model: mean {c['client_acc_global_mean']:.4g})"
        console.print(line, highlight=False)
    if s.get("time_to_target_s") is not None:
        console.print(
            f"reached {s['target_accuracy']:g} test accuracy at round {s['rounds_to_target']}, "
            f"simulated {s['time_to_target_s']:.4g} s",
            highlight=False,
        )
    if out_dir is not None:
        console.print(f"wrote {out_dir}/metrics.csv and {out_dir}/summary.json", highlight=False)


@app.command("trace")
def trace(
    clients: Annotated[int, _opt(help="Clients of the trace (the population of the run).")] = 100,
    seed: Annotated[int, _opt(help="Seed of the generator.")] = 0,
    out: Annotated[Path, _opt("--out", help="The trace CSV to write.")] = Path("trace.csv"),
) -> None:
    """Write a synthetic diurnal availability and speed trace (for fl run --trace)."""
    with guard(flag_names("clients")):
        from fl import generate_trace

        t = generate_trace(clients, seed)
        out.parent.mkdir(parents=True, exist_ok=True)
        t.to_csv(out, index=False)
        hourly = t[[f"p{h}" for h in range(24)]].to_numpy().mean(axis=0)
        console.print(
            f"wrote {out}: {clients} clients, expected share available by UTC hour "
            f"min {hourly.min():.2f} (hour {hourly.argmin()}), "
            f"max {hourly.max():.2f} (hour {hourly.argmax()}); "
            f"speed factor median {t['speed_factor'].median():.3g}",
            highlight=False,
        )
