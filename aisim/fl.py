"""`aisim fl`: federated training simulation (``aisim fl run``, ``aisim fl trace``).

The commands are a thin shell over :mod:`fl`: ``run`` hands the options to
:func:`fl.experiment.plan_run` (command line over ``--config`` TOML, or a resumed run's stored
configuration), runs :func:`fl.simulate` with a progress bar on stderr, and prints the summary
(:func:`fl.summary.summary_lines`) or, with ``--json``, the summary as one JSON document.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aisim.console import console, err_console, flag_names, guard, print_json

app = typer.Typer(no_args_is_help=True, help="Federated training simulation.")

FLAGS = flag_names(out_dir="--resume")  # library field names -> flags (else --field-name)
DATA, MODEL, ALG, LOCAL = "Data", "Model", "Algorithm", "Rounds and local training"
SYS, DP, PER, ENGINE, OUT = "Systems", "Privacy", "Per-client evaluation", "Engine", "Output"


def _o(help: str, panel: str, *names: str):
    return typer.Option(*names, help=help, rich_help_panel=panel)


@app.command("run")
def run(
    ctx: typer.Context,
    dataset: Annotated[
        str,
        _o(
            "synthetic, digits, mnist, shakespeare, femnist, cifar10, "
            "cifar100, stackoverflow or sent140.",
            DATA,
        ),
    ] = "synthetic",
    data: Annotated[
        str | None,
        _o(
            "Your federated data: a .npz (x, y, client_id), a LEAF "
            "folder, a TFF .h5 or flwr:DATASET.",
            DATA,
        ),
    ] = None,
    data_format: Annotated[str, _o("auto, npz, leaf, tff or flwr.", DATA)] = "auto",
    data_dir: Annotated[
        str | None,
        _o("Cache of the field's data sets (default $AISIM_DATA or ~/.cache/aisim/fl).", DATA),
    ] = None,
    download: Annotated[
        bool, _o("Fetch a field data set from its source.", DATA, "--download")
    ] = False,
    alpha: Annotated[float, _o("Synthetic(α, β): std of the local model means.", DATA)] = 1.0,
    beta: Annotated[float, _o("Synthetic(α, β): std of the local input means.", DATA)] = 1.0,
    iid: Annotated[bool, _o("Synthetic-IID instead of Synthetic(α, β).", DATA, "--iid")] = False,
    partition: Annotated[str, _o("iid, dirichlet, shards or quantity.", DATA)] = "iid",
    dirichlet_alpha: Annotated[float, _o("Dirichlet label skew α.", DATA)] = 0.5,
    dirichlet_form: Annotated[
        str, _o("per-class (Flower, NIID-Bench) or per-client (Hsu et al. 2019).", DATA)
    ] = "per-class",
    clients: Annotated[int, _o("Population size (synthetic: up to 1M).", DATA)] = 30,
    model: Annotated[
        str | None,
        _o(
            "logreg, mlp, 2nn, cnn, lstm, simple-cnn, resnet18-gn, "
            "so-lstm, text-lstm (default: by data set).",
            MODEL,
        ),
    ] = None,
    model_module: Annotated[
        str | None,
        _o("Your model: PACKAGE.MODULE:FACTORY, called with (input_shape, num_outputs).", MODEL),
    ] = None,
    algorithm: Annotated[
        str,
        _o(
            "fedavg, fedprox, fedavgm, fedadam, fedyogi, fedadagrad, "
            "scaffold, dpfedavg or fedbuff.",
            ALG,
        ),
    ] = "fedavg",
    algorithm_module: Annotated[
        str | None,
        _o("Your algorithm: PACKAGE.MODULE:NAME of an fl.Algorithm (or a function).", ALG),
    ] = None,
    mu: Annotated[float, _o("FedProx proximal weight μ.", ALG)] = 0.0,
    server_lr: Annotated[
        float | None, _o("Server learning rate (default 1, adaptive 0.01).", ALG)
    ] = None,
    server_momentum: Annotated[float, _o("FedAvgM server momentum.", ALG)] = 0.9,
    tau: Annotated[float, _o("Adaptive optimisers' τ (Reddi et al. 2021).", ALG)] = 1e-3,
    adaptive_form: Annotated[str, _o("reddi (the paper's) or optax (eps = τ).", ALG)] = "reddi",
    buffer_size: Annotated[int, _o("fedbuff: updates K per server update.", ALG)] = 10,
    concurrency: Annotated[int, _o("fedbuff: clients in flight C.", ALG)] = 20,
    rounds: Annotated[int, _o("Communication rounds.", LOCAL)] = 200,
    clients_per_round: Annotated[int, _o("Clients sampled each round.", LOCAL)] = 10,
    sampling: Annotated[
        str, _o("uniform (size-weighted mean) or size (FedProx: ∝ data size, plain mean).", LOCAL)
    ] = "uniform",
    local_epochs: Annotated[int, _o("Local epochs E.", LOCAL)] = 1,
    batch_size: Annotated[int, _o("Local batch size (samples).", LOCAL)] = 10,
    lr: Annotated[float, _o("Client SGD learning rate.", LOCAL)] = 0.01,
    max_local_steps: Annotated[int | None, _o("Cap on local steps per round.", LOCAL)] = None,
    devices: Annotated[str, _o("Device preset mix, e.g. phone:0.7,laptop:0.3.", SYS)] = "phone",
    stragglers: Annotated[
        float, _o("Fraction of sampled clients that do 1..E−1 epochs.", SYS)
    ] = 0.0,
    deadline_s: Annotated[float | None, _o("Round deadline, simulated seconds.", SYS)] = None,
    trace: Annotated[
        str | None, _o("Availability and speed trace CSV (aisim fl trace).", SYS)
    ] = None,
    clip_norm: Annotated[float, _o("dpfedavg: L2 clip norm of each update.", DP)] = 1.0,
    noise_multiplier: Annotated[float, _o("dpfedavg: noise std / clip norm.", DP)] = 1.0,
    delta: Annotated[float, _o("dpfedavg: δ of the reported (ε, δ).", DP)] = 1e-5,
    adaptive_clip: Annotated[
        bool, _o("dpfedavg: adapt the clip norm (Andrew et al. 2021).", DP, "--adaptive-clip")
    ] = False,
    clip_quantile: Annotated[float, _o("Adaptive clipping: target quantile γ.", DP)] = 0.5,
    clip_lr: Annotated[float, _o("Adaptive clipping: learning rate η_C.", DP)] = 0.2,
    clip_count_stddev: Annotated[
        float | None, _o("Adaptive clipping: count noise σ_b (default m/20).", DP)
    ] = None,
    client_eval: Annotated[
        bool, _o("Evaluate each client on its own test split.", PER, "--client-eval")
    ] = False,
    local_test_fraction: Annotated[
        float, _o("Share of each client's samples held out.", PER)
    ] = 0.2,
    personalize: Annotated[str, _o("none, finetune or ditto (Li et al. 2021).", PER)] = "none",
    finetune_steps: Annotated[int, _o("finetune: local SGD steps.", PER)] = 5,
    ditto_lambda: Annotated[float, _o("ditto: pull λ to the global model.", PER)] = 0.1,
    memory_budget: Annotated[str, _o("Memory for one chunk of clients, e.g. 4GB.", ENGINE)] = "4GB",
    shard: Annotated[bool, _o("Shard the client axis over all JAX devices.", ENGINE)] = True,
    coordinator: Annotated[
        str | None, _o("HOST:PORT of process 0 (several processes).", ENGINE)
    ] = None,
    num_processes: Annotated[int | None, _o("Several processes: how many.", ENGINE)] = None,
    process_id: Annotated[int | None, _o("Several processes: this one's id.", ENGINE)] = None,
    seed: Annotated[int, _o("Seed of data, systems and training.", OUT)] = 0,
    eval_every: Annotated[int, _o("Evaluate the global model every K rounds.", OUT)] = 1,
    target_accuracy: Annotated[
        float | None, _o("Report rounds and time to this test accuracy.", OUT)
    ] = None,
    checkpoint_every: Annotated[int, _o("Checkpoint every K rounds.", OUT)] = 10,
    config: Annotated[
        Path | None, _o("EXPERIMENT.toml with the same names.", OUT, "--config")
    ] = None,
    out: Annotated[
        Path | None, _o("Output folder DIR (locked while the run lasts).", OUT, "--out")
    ] = None,
    resume: Annotated[Path | None, _o("Continue the run in DIR.", OUT, "--resume")] = None,
    plot: Annotated[bool, _o("Draw DIR/accuracy.png.", OUT, "--plot")] = False,
    json_out: Annotated[bool, _o("Print the summary as JSON.", OUT, "--json")] = False,
) -> None:
    """Simulate federated training; one metrics row per round."""
    with guard(FLAGS):
        from fl.distributed import initialize, is_writer
        from fl.experiment import plan_run
        from simbase.errors import AisimError

        given = {k for k in ctx.params if _source(ctx, k) == "COMMANDLINE"}
        plan = plan_run(ctx.params, given, config, out, resume)
        if plot and plan.out_dir is None:
            raise AisimError("--plot draws into the output folder; give --out DIR")
        if plan.group is not None:
            # Importing the libraries started JAX's local backend; nothing made so far is used
            # by the run, so the distributed backend replaces it.
            initialize(plan.group, restart_backend=True)
        writer = is_writer()
        result = _run_with_progress(plan, writer)
        if writer:  # process 0 writes and prints the run (fl.distributed)
            _report(result, plan, plot, json_out)


def _source(ctx: typer.Context, name: str) -> str:
    return getattr(ctx.get_parameter_source(name), "name", "")


def _run_with_progress(plan, writer: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from fl import simulate

    with Progress(
        TextColumn("[bold]fl run[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        console=err_console,
        transient=True,
        disable=not err_console.is_terminal,
    ) as progress:
        task = progress.add_task("rounds", total=plan.cfg.rounds, info="")

        def on_round(row):
            acc = row["test_accuracy"]
            progress.update(
                task, completed=row["round"], info=f"acc {acc:.3f}" if acc == acc else ""
            )

        out_dir = plan.out_dir if writer else None
        return simulate(plan.cfg, out_dir, resume=plan.resume, on_round=on_round)


def _report(result, plan, plot: bool, json_out: bool) -> None:
    from aisim.console import rich_table
    from fl import plot_accuracy
    from fl.summary import summary_lines

    s, out_dir = result.summary, plan.out_dir
    if plot:
        plot_accuracy({s["algorithm"]: result.metrics}, out_dir / "accuracy.png")
    if json_out:
        print_json(s)
    else:
        tail = result.metrics.dropna(subset=["test_accuracy"]).tail(5)
        tail = tail.dropna(axis=1, how="all")  # epsilon and clip_norm exist only with dpfedavg
        title = f"{s['algorithm']} on {s['dataset']} ({s['model']})"
        console.print(rich_table(tail, title=title))
        for line in summary_lines(s):
            console.print(line, highlight=False)
        if out_dir is not None:
            console.print(
                f"wrote {out_dir}/metrics.csv and {out_dir}/summary.json", highlight=False
            )
    if s["diverged"]:
        where = f" in {out_dir}/metrics.csv" if out_dir else ""
        err_console.print(
            f"[red]error:[/red] training diverged at round {s['diverged_round']} (NaN or "
            f"infinite model); metrics of the rounds so far are kept{where}",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1)


@app.command("trace")
def trace(
    clients: Annotated[int, typer.Option(help="Clients (the population of the run).")] = 100,
    seed: Annotated[int, typer.Option(help="Seed of the generator.")] = 0,
    out: Annotated[Path, typer.Option("--out", help="The trace CSV to write.")] = Path("trace.csv"),
) -> None:
    """Write a synthetic diurnal availability and speed trace (for fl run --trace)."""
    with guard(flag_names("clients", "seed")):
        from fl.traces import write_trace

        t = write_trace(clients, seed, out)
        console.print(
            f"wrote {out}: {clients} clients, expected share available by UTC hour "
            f"min {t['available_min']:.2f} (hour {t['available_min_hour']}), "
            f"max {t['available_max']:.2f} (hour {t['available_max_hour']}); "
            f"speed factor median {t['speed_factor_median']:.3g}",
            highlight=False,
        )
