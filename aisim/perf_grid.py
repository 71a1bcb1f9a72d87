"""`aisim perf grid`: every valid strategy, evaluated in one vectorised pass, ranked.

The knobs of ``aisim perf estimate`` accept several values here (``--tp 4,8 --pp 1,2,4``)
and become axes of the grid; an omitted knob means all its valid values. ``--gpus``,
``--global-batch``, ``--model`` and ``--hardware`` accept several values too (a sweep). Each
(model, hardware) pair is one jitted evaluation of its whole grid (all GPU counts and batches
together), reduced on the device (:func:`perfmodel.search.search`); :func:`run_grid` is the
library entry point and returns the ``--json`` document.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pandas as pd
import typer
from rich.table import Table

from aisim.common import parse_int_list, resolve_constants, resolve_hardware, resolve_model
from aisim.console import check_out_suffix, console, err_console, guard, print_json
from perfmodel import search as srch
from perfmodel.report import row_to_result
from perfmodel.step_time import BREAKDOWN_TERMS, COST_MODELS, select_step_fn
from perfmodel.strategy import (
    DTYPES,
    KNOBS,
    RECOMPUTE,
    SCHEDULES,
    StrategyGrid,
    concat_grids,
    enumerate_strategies,
)
from perfmodel.workload import total_params
from simbase import units
from simbase.errors import AisimError, bad_value
from simbase.io import write_table

Multi = list[str] | None
_ON = {
    "on": True,
    "true": True,
    "yes": True,
    "1": True,
    "off": False,
    "false": False,
    "no": False,
    "0": False,
}


def _split(values: Multi) -> list[str] | None:
    if not values:
        return None
    out = [p.strip() for v in values for p in str(v).split(",") if p.strip()]
    return out or None


def _ints(values: Multi, option: str, minimum: int = 1) -> list[int] | None:
    parts = _split(values)
    return None if parts is None else parse_int_list(",".join(parts), option, minimum=minimum)


def _choices(
    values: Multi, option: str, choices: tuple[str, ...], aliases: dict | None = None
) -> list[str] | None:
    parts = _split(values)
    if parts is None:
        return None
    out = []
    for p in parts:
        key = (aliases or {}).get(p.lower(), p.lower())
        if key not in choices:
            raise bad_value("command line", option, p, "one or more of " + ", ".join(choices))
        out.append(key)
    return out


def _bools(values: Multi, option: str) -> list[bool] | None:
    parts = _split(values)
    if parts is None:
        return None
    out: list[bool] = []
    for p in parts:
        if p.lower() == "both":
            out += [False, True]
        elif p.lower() in _ON:
            out.append(_ON[p.lower()])
        else:
            raise bad_value("command line", option, p, "on, off or both")
    return out


def _distir_grid(
    num_gpus: list[int], global_batch: list[int], knobs: dict, gpn: int
) -> StrategyGrid:
    """DistIR's own grid (power-of-two dp·tp·pp = N, 1 microbatch when pp = 1, else 2..128),
    restricted by the knobs given, with the knobs DistIR does not sweep at their defaults."""
    from perfmodel.distir import distir_grid_columns

    defaults = dict(
        interleave=1,
        schedule=1,
        zero_stage=0,
        recompute=0,
        sequence_parallel=0,
        dtype=DTYPES.index("bf16"),
        dp_overlap=1,
        fused_attention=0,
        gpus_per_node=gpn,
    )
    parts = []
    for n in num_gpus:
        for b in global_batch:
            cols = {
                k: np.asarray(v, np.float32) for k, v in distir_grid_columns(int(n), int(b)).items()
            }
            rows = len(cols["dp"])
            full = {
                k: np.broadcast_to(cols.get(k, np.float32(defaults.get(k, 0))), (rows,)).astype(
                    np.float32
                )
                for k in KNOBS
            }
            parts.append(StrategyGrid(full, {}))
    g = concat_grids(parts)
    dtypes = knobs.get("dtype")
    if dtypes:  # cross the grid with the dtypes asked for
        codes = [DTYPES.index(d) for d in dict.fromkeys(dtypes)]
        g = StrategyGrid({k: np.tile(v, len(codes)) for k, v in g.columns.items()}, {})
        g.columns["dtype"] = np.repeat(np.asarray(codes, np.float32), len(g) // len(codes))
    keep = np.ones(len(g), bool)
    for knob, col in (("tp", "tp"), ("pp", "pp"), ("micro_batch", "micro_batch_size")):
        if knobs.get(knob):
            keep &= np.isin(g.columns[col], knobs[knob])
    return g.take(keep)


def run_grid(
    *,
    models: list[str] | None = None,
    model_file: Path | None = None,
    params: str | None = None,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
    hardware: list[str] | None = None,
    hardware_file: Path | None = None,
    gpus: list[int] | None = None,
    gpus_per_node: int | None = None,
    global_batch: list[int] | None = None,
    knobs: dict | None = None,
    allow_cross_node_tp: bool = False,
    profile: Path | None = None,
    cost_model: str = "aisim",
    top: int = 10,
    rank_by: str = "throughput",
    want_all: bool = False,
    progress: bool = True,
) -> tuple[dict, pd.DataFrame | None, list]:
    """Searches every (model, hardware) pair and returns ``(json_doc, all_feasible, results)``.

    ``knobs`` holds the restricted axes (``tp``, ``pp``, ``micro_batch``, ``schedule``,
    ``interleave``, ``zero``, ``recompute``, ``sequence_parallel``, ``dtype``, ``dp_overlap``,
    ``fused_attention``;
    ``None`` = every valid value). ``all_feasible`` is every feasible strategy (``want_all``).

    Raises:
      AisimError: bad input (usage), or no feasible strategy (``usage=False``, with why).
    """
    t0 = time.perf_counter()
    knobs = dict(knobs or {})
    if cost_model not in COST_MODELS:
        raise bad_value(
            "command line", "--cost-model", cost_model, "one of " + ", ".join(COST_MODELS)
        )
    if rank_by not in srch.RANK_KEYS:
        raise bad_value("command line", "--rank-by", rank_by, "one of " + ", ".join(srch.RANK_KEYS))
    if top < 1:
        raise bad_value("command line", "--top", top, "a positive integer")
    step_fn = select_step_fn(cost_model)
    gpus = gpus or [1024]
    global_batch = global_batch or [1536]
    model_list = [
        resolve_model(
            name,
            model_file=model_file,
            params=params,
            layers=layers,
            hidden=hidden,
            heads=heads,
            seq_len=seq_len,
            vocab=vocab,
        )
        for name in (models or [None if (model_file or params) else "gpt3-175b"])
    ]
    hw_list = [resolve_hardware(h, hardware_file) for h in (hardware or [None])]
    pairs = [(m, h) for m in model_list for h in hw_list]

    results, frames_top, frames_pareto, frames_point, frames_all, caps = [], [], [], [], [], []
    started = time.perf_counter()
    bar = None
    task = None
    try:
        for i, (m, hw) in enumerate(pairs):
            if progress and bar is None and time.perf_counter() - started > 1.0 and len(pairs) > 1:
                from rich.progress import Progress

                bar = Progress(console=err_console, transient=True)
                bar.start()
                task = bar.add_task("searching", total=len(pairs), completed=i)
            if bar is not None:
                bar.update(task, completed=i, description=f"{m.name} on {hw.name}")
            consts = resolve_constants(hw, profile)
            gpn = gpus_per_node if gpus_per_node is not None else int(hw.spec.gpus_per_node)
            if gpn < 1:
                raise bad_value("command line", "--gpus-per-node", gpn, "a positive integer")
            spec = m.spec
            tf = spec.kind == "transformer"
            heads_n = int(spec.num_heads) if tf else int(spec.hidden_size)
            kv_n = int(spec.num_kv_heads) if tf else int(spec.hidden_size)
            supported = [d for j, d in enumerate(DTYPES) if float(hw.spec.peak_flops_per_s[j]) > 0]
            if cost_model == "distir":
                grid = _distir_grid(gpus, global_batch, knobs, gpn)
            else:
                grid = enumerate_strategies(
                    num_layers=int(spec.num_layers),
                    num_heads=heads_n,
                    num_kv_heads=kv_n,
                    num_gpus=gpus,
                    global_batch=global_batch,
                    gpus_per_node=gpn,
                    tp=knobs.get("tp"),
                    pp=knobs.get("pp"),
                    micro_batch=knobs.get("micro_batch"),
                    schedule=knobs.get("schedule"),
                    interleave=knobs.get("interleave"),
                    zero=knobs.get("zero"),
                    recompute=knobs.get("recompute"),
                    sequence_parallel=knobs.get("sequence_parallel"),
                    dtype=knobs.get("dtype"),
                    dp_overlap=knobs.get("dp_overlap"),
                    fused_attention=knobs.get("fused_attention"),
                    allow_cross_node_tp=allow_cross_node_tp,
                    supported_dtypes=supported,
                )
            r = srch.search(spec, hw.spec, consts, grid, step_fn=step_fn, k=top, rank_by=rank_by)
            results.append((m, hw, r))
            caps.append(float(hw.spec.memory_capacity_bytes) / units.GIB)
            tag = dict(
                model=m.name,
                hardware=hw.name,
                cost_model=cost_model,
                params=float(total_params(spec)),
            )
            for frame, bucket in (
                (r.top, frames_top),
                (r.pareto, frames_pareto),
                (r.best_per_point, frames_point),
            ):
                if not frame.empty:
                    bucket.append(frame.assign(**tag))
            if want_all and r.feasible:
                frames_all.append(
                    srch.feasible_frame(spec, hw.spec, consts, grid, step_fn=step_fn).assign(**tag)
                )
    finally:
        if bar is not None:
            bar.stop()

    evaluated = sum(r.evaluated for _, _, r in results)
    feasible = sum(r.feasible for _, _, r in results)
    reasons = srch.infeasible_reasons([r for _, _, r in results], caps)
    if feasible == 0:
        msgs = [
            srch.no_feasible_message(r, m.name, float(hw.spec.memory_capacity_bytes))
            for m, hw, r in results
        ]
        if len(msgs) > 1:
            msgs = [f"{hw.name}: {s}" for (_, hw, _), s in zip(results, msgs, strict=True)]
        raise AisimError("; ".join(dict.fromkeys(msgs)), usage=False)

    key, larger = srch.RANK_KEYS[rank_by]
    top_df = pd.concat(frames_top, ignore_index=True)
    top_df = (
        top_df.sort_values(key, ascending=not larger, kind="stable")
        .head(top)
        .reset_index(drop=True)
    )
    mem_front = srch.pareto_frame(
        pd.concat(frames_pareto, ignore_index=True), "memory_per_device_bytes"
    )
    points = pd.concat(frames_point, ignore_index=True) if frames_point else pd.DataFrame()
    doc: dict[str, Any] = {
        "best": _result(top_df.iloc[0]),
        "top": [_result(row) for _, row in top_df.iterrows()],
        "evaluated": int(evaluated),
        "feasible": int(feasible),
        "seconds": time.perf_counter() - t0,
        "pareto": [_result(row) for _, row in mem_front.iterrows()],
        "infeasible_reasons": reasons,
    }
    if len(points) > 1:
        doc["sweep"] = [_result(row) for _, row in points.iterrows()]
        if len(set(points["num_gpus"])) > 1:
            gpu_front = srch.pareto_frame(points, "num_gpus")
            doc["pareto_gpus"] = [_result(row) for _, row in gpu_front.iterrows()]
    if len(hw_list) > 1 and not points.empty:
        # the cheapest per token of each hardware, among the best strategies of its sweep points
        priced = points[np.isfinite(points["cost_per_million_tokens_usd"].to_numpy(float))]
        if not priced.empty:
            by_hw = (
                priced.sort_values("cost_per_million_tokens_usd", kind="stable")
                .groupby(["model", "hardware"], sort=False)
                .head(1)
            )
            doc["cost_by_hardware"] = [_result(row) for _, row in by_hw.iterrows()]
            doc["cheapest_hardware"] = doc["cost_by_hardware"][0]
    all_df = pd.concat(frames_all, ignore_index=True) if frames_all else None
    return doc, all_df, results


def _result(row: pd.Series) -> dict:
    doc = row_to_result(row)
    for k in ("model", "hardware", "cost_model", "params"):
        doc[k] = row[k].item() if hasattr(row[k], "item") else row[k]
    return doc


def strategy_label(r: dict) -> str:
    """``dp64 tp8 pp2 mbs4 m6 interleaved v12 zero2 selective sp``: one strategy on one line."""
    sched = r["schedule"] + (f" v{r['interleave']}" if r["interleave"] > 1 else "")
    return (
        f"dp{r['dp']} tp{r['tp']} pp{r['pp']} mbs{r['micro_batch_size']} m{r['num_microbatches']} {sched} "
        f"zero{r['zero_stage']} {r['recompute']}"
        + (" sp" if r["sequence_parallel"] else "")
        + (f" {r['dtype']}" if r["dtype"] != "bf16" else "")
        + ("" if r["dp_overlap"] else " no-overlap")
        + (" fa" if r.get("fused_attention") else "")
    )


def _print_wide(table: Table) -> None:
    """Prints a table at its natural width (wider than the console if need be, never folded)."""
    from rich.console import Console
    from rich.measure import Measurement

    need = Measurement.get(console, console.options.update(width=10_000), table).maximum
    if need <= console.width:
        console.print(table)
    else:
        Console(file=console.file, width=need, color_system=console.color_system).print(table)


def _sec(v: float) -> str:
    return f"{v:.3f}" if v < 100 else f"{v:.4g}"


def print_top(doc: dict) -> None:
    """A rich table of the top strategies with their full breakdown, and the fronts."""
    from rich import box

    rows = doc["top"]
    multi = len({(r["model"], r["hardware"]) for r in doc.get("sweep", rows)}) > 1
    sweep_gpus = len({r["num_gpus"] for r in doc.get("sweep", rows)}) > 1
    t = Table(
        title=f"top {len(rows)} of {doc['feasible']} feasible strategies ({doc['evaluated']} evaluated "
        f"in {doc['seconds']:.2f} s, cost model {rows[0]['cost_model']}); times in seconds per step",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1),
        collapse_padding=True,
    )
    heads = (
        (["model", "hardware"] if multi else [])
        + (["gpus"] if sweep_gpus else [])
        + [
            "#",
            "strategy",
            "compute",
            "tp",
            "dp",
            "p2p",
            "bubble",
            "optim",
            "overhd",
            "step",
            "tokens/s",
            "MFU",
            "GiB",
            "$/Mtok",
        ]
    )
    for h in heads:
        t.add_column(
            h, justify="left" if h in ("model", "hardware", "strategy") else "right", no_wrap=True
        )
    for i, r in enumerate(rows, 1):
        cells = (
            ([r["model"], r["hardware"]] if multi else [])
            + ([str(r["num_gpus"])] if sweep_gpus else [])
            + [str(i), strategy_label(r)]
        )
        cells += [_sec(r["breakdown"][k]) for k in BREAKDOWN_TERMS]
        cost = r["cost_per_million_tokens_usd"]
        cells += [
            _sec(r["step_time_s"]),
            f"{r['tokens_per_s']:.4g}",
            f"{100 * r['mfu']:.1f}%",
            f"{r['memory']['total_bytes'] / units.GIB:.1f}",
            "-" if cost is None else f"{cost:.3g}",
        ]
        t.add_row(*cells)
    _print_wide(t)
    front = doc["pareto"]
    console.print(
        f"Pareto front (memory per device vs tokens/s): {len(front)} strategies, from "
        f"{front[0]['memory']['total_bytes'] / units.GIB:.1f} GiB at {front[0]['tokens_per_s']:.4g} tokens/s to "
        f"{front[-1]['memory']['total_bytes'] / units.GIB:.1f} GiB at {front[-1]['tokens_per_s']:.4g} tokens/s"
    )
    if "sweep" in doc:
        s = Table(
            title="best strategy of each sweep point", title_justify="left", box=box.SIMPLE_HEAD
        )
        for h in (
            "model",
            "hardware",
            "gpus",
            "global batch",
            "dp",
            "tp",
            "pp",
            "mbs",
            "schedule",
            "v",
            "zero",
            "recomp",
            "tokens/s",
            "MFU",
            "$/Mtok",
        ):
            s.add_column(
                h, justify="left" if h in ("model", "hardware", "schedule", "recomp") else "right"
            )
        for r in doc["sweep"]:
            cost = r["cost_per_million_tokens_usd"]
            s.add_row(
                r["model"],
                r["hardware"],
                str(r["num_gpus"]),
                str(r["global_batch_size"]),
                str(r["dp"]),
                str(r["tp"]),
                str(r["pp"]),
                str(r["micro_batch_size"]),
                r["schedule"],
                str(r["interleave"]),
                str(r["zero_stage"]),
                r["recompute"],
                f"{r['tokens_per_s']:.4g}",
                f"{100 * r['mfu']:.1f}%",
                "-" if cost is None else f"{cost:.3g}",
            )
        _print_wide(s)
    if "cheapest_hardware" in doc:
        c = doc["cheapest_hardware"]
        console.print(
            f"cheapest per million tokens: {c['hardware']} at ${c['cost_per_million_tokens_usd']:.3g} "
            f"({c['num_gpus']} GPUs, {c['tokens_per_s']:.4g} tokens/s)"
        )
    if doc["infeasible_reasons"]:
        console.print(
            "not feasible: " + "; ".join(f"{k} ({v})" for k, v in doc["infeasible_reasons"].items())
        )


def plot_grid(doc: dict, path: Path) -> None:
    """Pareto front (memory per device vs tokens/s; GPUs vs tokens/s in a GPU sweep) and a
    stacked bar of the breakdown of the top strategies, written atomically as a PNG."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from simbase.io import atomic_write_bytes

    panels = 3 if "pareto_gpus" in doc else 2
    fig, axes = plt.subplots(1, panels, figsize=(6.0 * panels, 4.6))
    ax = axes[0]
    front = doc["pareto"]
    ax.plot(
        [r["memory"]["total_bytes"] / units.GIB for r in front],
        [r["tokens_per_s"] for r in front],
        "o-",
        color="tab:blue",
        label="Pareto front",
    )
    ax.plot(
        [r["memory"]["total_bytes"] / units.GIB for r in doc["top"]],
        [r["tokens_per_s"] for r in doc["top"]],
        "x",
        color="tab:red",
        label=f"top {len(doc['top'])}",
    )
    ax.set_xlabel("memory per device (GiB)")
    ax.set_ylabel("tokens/s")
    ax.set_title("throughput vs memory per device")
    ax.grid(alpha=0.3)
    ax.legend()
    ax = axes[1]
    rows = doc["top"]
    bottom = np.zeros(len(rows))
    labels = [
        f"dp{r['dp']} tp{r['tp']} pp{r['pp']}\nmbs{r['micro_batch_size']} v{r['interleave']} "
        f"z{r['zero_stage']} {r['recompute'][:3]}"
        for r in rows
    ]
    for k in BREAKDOWN_TERMS:
        vals = np.array([r["breakdown"][k] for r in rows])
        ax.bar(range(len(rows)), vals, bottom=bottom, label=k.removesuffix("_s"))
        bottom += vals
    ax.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("seconds per step")
    ax.set_title("step-time breakdown of the top strategies")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if panels == 3:
        ax = axes[2]
        pts = doc["sweep"]
        ax.plot(
            [r["num_gpus"] for r in pts],
            [r["tokens_per_s"] for r in pts],
            ".",
            color="0.6",
            label="best per point",
        )
        g = doc["pareto_gpus"]
        ax.plot(
            [r["num_gpus"] for r in g], [r["tokens_per_s"] for r in g], "o-", label="Pareto front"
        )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
        ax.set_ylabel("tokens/s")
        ax.set_title("scaling: best strategy per GPU count")
        ax.grid(alpha=0.3)
        ax.legend()
    best = doc["best"]
    fig.suptitle(
        f"{best['model']} on {best['hardware']}, global batch {best['global_batch_size']} "
        f"[{best['cost_model']}]"
    )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def grid_command(
    model: Annotated[
        Multi,
        typer.Option(
            "--model",
            help="Model preset(s), comma-separated or repeated (default gpt3-175b); 'custom' with --layers --hidden --heads --seq-len --vocab.",
        ),
    ] = None,
    model_file: Annotated[
        Path | None, typer.Option("--model-file", help="Your own model JSON.")
    ] = None,
    params: Annotated[
        str | None,
        typer.Option(
            "--params", help="A square bias-free MLP with about this many parameters, e.g. 60M."
        ),
    ] = None,
    layers: Annotated[
        int | None, typer.Option(help="Transformer layers (overrides the preset).")
    ] = None,
    hidden: Annotated[int | None, typer.Option(help="Hidden size.")] = None,
    heads: Annotated[int | None, typer.Option(help="Attention heads.")] = None,
    seq_len: Annotated[
        int | None, typer.Option("--seq-len", help="Sequence length in tokens.")
    ] = None,
    vocab: Annotated[int | None, typer.Option(help="Vocabulary size.")] = None,
    hardware: Annotated[
        Multi,
        typer.Option(
            "--hardware",
            help="Hardware preset(s) (default a100-80gb); several give the cheapest hardware per token.",
        ),
    ] = None,
    hardware_file: Annotated[
        Path | None, typer.Option("--hardware-file", help="Your own hardware JSON.")
    ] = None,
    gpus: Annotated[
        Multi,
        typer.Option(help="Total devices; several sweep, e.g. 64,128,...,4096 (default 1024)."),
    ] = None,
    gpus_per_node: Annotated[
        int | None,
        typer.Option("--gpus-per-node", help="Devices per node (default: the preset's)."),
    ] = None,
    global_batch: Annotated[
        Multi,
        typer.Option(
            "--global-batch", help="Samples per optimiser step; several sweep (default 1536)."
        ),
    ] = None,
    tp: Annotated[
        Multi,
        typer.Option(
            help="Tensor-parallel degrees to try (default: every divisor of the heads within a node)."
        ),
    ] = None,
    pp: Annotated[
        Multi,
        typer.Option(help="Pipeline-parallel degrees to try (default: all up to the layers)."),
    ] = None,
    micro_batch: Annotated[
        Multi,
        typer.Option(
            "--micro-batch",
            help="Micro-batch sizes to try (default: every divisor of the per-replica batch).",
        ),
    ] = None,
    schedule: Annotated[
        Multi, typer.Option(help="Pipeline schedules: gpipe, 1f1b, interleaved (default all).")
    ] = None,
    interleave: Annotated[
        Multi,
        typer.Option(
            help="Model chunks per device v for the interleaved schedule (default: every divisor of the layers per stage)."
        ),
    ] = None,
    recompute: Annotated[
        Multi, typer.Option(help="Activation recomputation: none, selective, full (default all).")
    ] = None,
    sequence_parallel: Annotated[
        Multi,
        typer.Option(
            "--sequence-parallel",
            help="Megatron sequence parallelism: on, off or both (default both; off when tp = 1).",
        ),
    ] = None,
    zero: Annotated[Multi, typer.Option(help="ZeRO stages 0-3 to try (default all).")] = None,
    dtype: Annotated[
        Multi, typer.Option(help="fp32, tf32, bf16, fp16, fp8 (default bf16).")
    ] = None,
    dp_overlap: Annotated[
        Multi,
        typer.Option(
            "--dp-overlap",
            help="Overlap the DP gradient reduction with the backward pass: on, off or both (default on).",
        ),
    ] = None,
    fused_attention: Annotated[
        Multi,
        typer.Option(
            "--fused-attention",
            help="A fused attention kernel (FlashAttention) that keeps no s x s scores: on, off or both (default off).",
        ),
    ] = None,
    allow_cross_node_tp: Annotated[
        bool, typer.Option("--allow-cross-node-tp", help="Let tp span nodes.")
    ] = False,
    top: Annotated[int, typer.Option(help="How many of the best strategies to show.")] = 10,
    rank_by: Annotated[
        str,
        typer.Option(
            "--rank-by", help="throughput (tokens/s), cost ($ per million tokens) or mfu."
        ),
    ] = "throughput",
    profile: Annotated[
        Path | None,
        typer.Option("--profile", help="Calibrated profile JSON from `aisim calibrate fit --out`."),
    ] = None,
    cost_model: Annotated[
        str,
        typer.Option(
            "--cost-model",
            help="aisim (default) or distir (DistIR's formulas, constants and grid).",
        ),
    ] = "aisim",
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write every feasible strategy to .csv, .parquet or .json."),
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot", help="Write a PNG: Pareto front and breakdown of the top strategies."
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """Every valid strategy, evaluated in one vectorised pass, ranked (default: GPT-3 175B on
    1024 x A100-80GB, global batch 1536)."""
    with guard():
        check_out_suffix(out)
        if plot is not None and plot.suffix.lower() != ".png":
            raise AisimError(f"--plot {plot}: suffix {plot.suffix or '(none)'!r}: expected .png")
        zeros = _ints(zero, "--zero", minimum=0)
        if zeros and max(zeros) > 3:
            raise bad_value("command line", "--zero", max(zeros), "ZeRO stages among 0, 1, 2, 3")
        knobs = dict(
            tp=_ints(tp, "--tp"),
            pp=_ints(pp, "--pp"),
            micro_batch=_ints(micro_batch, "--micro-batch"),
            schedule=_choices(schedule, "--schedule", SCHEDULES),
            interleave=_ints(interleave, "--interleave"),
            zero=zeros,
            recompute=_choices(
                recompute,
                "--recompute",
                RECOMPUTE,
                {"true": "full", "false": "none", "yes": "full", "no": "none"},
            ),
            sequence_parallel=_bools(sequence_parallel, "--sequence-parallel"),
            dtype=_choices(dtype, "--dtype", DTYPES),
            dp_overlap=_bools(dp_overlap, "--dp-overlap"),
            fused_attention=_bools(fused_attention, "--fused-attention"),
        )
        doc, all_df, _ = run_grid(
            models=_split(model),
            model_file=model_file,
            params=params,
            layers=layers,
            hidden=hidden,
            heads=heads,
            seq_len=seq_len,
            vocab=vocab,
            hardware=_split(hardware),
            hardware_file=hardware_file,
            gpus=_ints(gpus, "--gpus"),
            gpus_per_node=gpus_per_node,
            global_batch=_ints(global_batch, "--global-batch"),
            knobs=knobs,
            allow_cross_node_tp=allow_cross_node_tp,
            profile=profile,
            cost_model=cost_model,
            top=top,
            rank_by=rank_by,
            want_all=out is not None,
            progress=not json_out,
        )
        if out is not None and all_df is not None:
            write_table(all_df, out)
        if plot is not None:
            plot_grid(doc, plot)
        if json_out:
            print_json(doc)
            return
        print_top(doc)
        if out is not None:
            console.print(f"wrote {doc['feasible']} feasible strategies to {out}")
        if plot is not None:
            console.print(f"wrote {plot}")
