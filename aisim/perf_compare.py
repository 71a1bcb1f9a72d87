"""`aisim perf compare`: hardware side by side for one training run (best strategy of each,
time, cost and energy to train, and one figure).

A thin shell over :func:`perfmodel.planning.plan_sweep`, run once per hardware so that each gets
its own best strategy under the same ranking, GPU count and batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import typer
from rich.table import Table

from aisim.common import resolve_constants
from aisim.console import check_out_suffix, console, flag_names, guard, print_json
from aisim.perf_planning import PLAN_FLAGS, PlanOptions, PriceOpt, PueOpt, UtilisationOpt, money
from perfmodel import resolve_hardware, resolve_model, strategy_label
from perfmodel.planning import plan_sweep
from simbase.errors import bad_value
from simbase.io import write_table
from simbase.parse import split_list
from simbase.units import format_count

FLAGS = flag_names(num_gpus="--gpus") | PLAN_FLAGS
ROW_KEYS = (
    "hardware",
    "num_gpus",
    "step_time_s",
    "tokens_per_s",
    "mfu",
    "train_days",
    "gpu_hours",
    "cost_usd",
    "energy_mwh",
    "price_per_gpu_hour_usd",
    "board_power_w",
)


def compare_document(
    *,
    hardware: list[str],
    model: str | None = None,
    model_file: Path | None = None,
    tokens: str,
    gpus: int = 1024,
    global_batch: int = 1536,
    rank_by: str = "time",
    options: PlanOptions | None = None,
    profile: Path | None = None,
) -> dict[str, Any]:
    """The ``aisim perf compare --json`` document: ``tokens``, ``rank_by`` and ``hardware``, one
    entry per hardware with its best strategy (``strategy``, ``best``) and plan."""
    options = options or PlanOptions(tokens)
    m = resolve_model(model, model_file=model_file)
    rows = []
    for name in hardware:
        hw = resolve_hardware(name)
        consts = resolve_constants(hw, profile) if profile is not None else None
        result = plan_sweep(
            [m],
            [hw],
            tokens=options.token_count,
            rank_by=rank_by,
            price_per_gpu_hour_usd=options.price_per_gpu_hour_usd,
            utilisation_factor=options.utilisation_factor,
            pue=options.pue,
            num_gpus=[gpus],
            global_batch=[global_batch],
            constants=None if consts is None else (lambda _, c=consts: c),
            top=1,
        )
        best = result.best
        row = {k: best.get(k) for k in ROW_KEYS}
        row["strategy"] = strategy_label(best)
        row["best"] = best
        rows.append(row)
    return {
        "model": m.name,
        "tokens": options.token_count,
        "rank_by": rank_by,
        "num_gpus": gpus,
        "global_batch_size": global_batch,
        "hardware": rows,
    }


def print_compare(doc: dict[str, Any]) -> None:
    """The side-by-side table."""
    t = Table(
        title=f"{doc['model']}, {format_count(doc['tokens'])} tokens on {doc['num_gpus']} GPUs "
        f"(global batch {doc['global_batch_size']}, best by {doc['rank_by']})"
    )
    for h in ("hardware", "best strategy", "step s", "tokens/s", "MFU", "days", "GPU-h"):
        t.add_column(h, justify="left" if h in ("hardware", "best strategy") else "right")
    t.add_column("cost", justify="right")
    t.add_column("MWh", justify="right")
    for r in doc["hardware"]:
        t.add_row(
            r["hardware"],
            r["strategy"],
            f"{r['step_time_s']:.4g}",
            f"{r['tokens_per_s']:.4g}",
            f"{100 * r['mfu']:.1f}%",
            f"{r['train_days']:,.1f}",
            format_count(r["gpu_hours"]),
            "unknown" if r["cost_usd"] is None else money(r["cost_usd"]),
            "unknown" if r["energy_mwh"] is None else f"{r['energy_mwh']:,.0f}",
        )
    console.print(t)


def plot_compare(doc: dict[str, Any], path: Path) -> None:
    """One figure: days, cost and energy to train per hardware (bars; unknown ones empty)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["hardware"] for r in doc["hardware"]]
    panels = (
        ("train_days", "days to train", 1.0),
        ("cost_usd", "cost (million USD)", 1e6),
        ("energy_mwh", "energy (MWh)", 1.0),
    )
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.4), dpi=110)
    for ax, (key, label, scale) in zip(axes, panels, strict=True):
        vals = [(r[key] or 0.0) / scale for r in doc["hardware"]]
        ax.bar(names, vals, color="tab:blue")
        ax.set_title(label, fontsize=10)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.suptitle(
        f"{doc['model']}: {format_count(doc['tokens'])} tokens on {doc['num_gpus']} GPUs",
        fontsize=10,
    )
    fig.tight_layout()
    tmp = Path(str(path) + ".tmp.png")
    fig.savefig(tmp, metadata={"Software": None})
    plt.close(fig)
    tmp.replace(path)


def compare_command(
    hardware: Annotated[
        list[str],
        typer.Option("--hardware", help="Hardware presets to compare, comma-separated."),
    ],
    tokens: Annotated[str, typer.Option("--tokens", help="Tokens to train on, e.g. 15T or 300B.")],
    model: Annotated[str | None, typer.Option("--model", help="Model preset.")] = None,
    model_file: Annotated[
        Path | None, typer.Option("--model-file", help="Your own model JSON.")
    ] = None,
    gpus: Annotated[int, typer.Option(help="Total devices on each hardware.")] = 1024,
    global_batch: Annotated[
        int, typer.Option("--global-batch", help="Samples per optimiser step.")
    ] = 1536,
    rank_by: Annotated[
        str,
        typer.Option("--rank-by", help="Each hardware's best strategy by time, cost or energy."),
    ] = "time",
    price_per_gpu_hour: PriceOpt = None,
    utilisation: UtilisationOpt = None,
    pue: PueOpt = None,
    profile: Annotated[
        Path | None, typer.Option("--profile", help="Calibrated profile JSON (one hardware).")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Write a PNG: days, cost and energy per hardware.")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write one row per hardware to .csv, .parquet or .json."),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """Hardware side by side: each one's best strategy, time, cost and energy to train."""
    with guard(FLAGS):
        check_out_suffix(out)
        if plot is not None and plot.suffix.lower() != ".png":
            raise bad_value(None, "plot", str(plot), "a file name ending in .png")
        if rank_by not in ("time", "cost", "energy"):
            raise bad_value(None, "rank_by", rank_by, "one of time, cost, energy")
        options = PlanOptions(tokens, price_per_gpu_hour, utilisation, pue, profile)
        doc = compare_document(
            hardware=split_list(hardware) or [],
            model=model,
            model_file=model_file,
            tokens=tokens,
            gpus=gpus,
            global_batch=global_batch,
            rank_by=rank_by,
            options=options,
            profile=profile,
        )
        if plot is not None:
            plot_compare(doc, plot)
        if out is not None:
            write_table(
                pd.DataFrame([{k: r[k] for k in (*ROW_KEYS, "strategy")} for r in doc["hardware"]]),
                out,
            )
        if json_out:
            print_json(doc)
            return
        print_compare(doc)
        for path in (plot, out):
            if path is not None:
                console.print(f"wrote {path}")
