"""`aisim perf grid`: every valid strategy, evaluated in one vectorised pass, ranked.

A thin shell over :func:`perfmodel.sweep`: the knobs of ``aisim perf estimate`` accept several
values here (``--tp 4,8 --pp 1,2,4``) and become axes of the grid; an omitted knob means all its
valid values. ``--gpus``, ``--global-batch``, ``--model`` and ``--hardware`` accept several
values too (a sweep). This module parses the options, calls the library inside
:func:`~aisim.console.guard` (which names the flag of a bad argument), and prints tables that
fit the terminal (``--wide`` for every column; ``--json`` and ``--out`` keep everything).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from aisim.common import resolve_constants
from aisim.console import (
    COMPACT,
    check_out_suffix,
    console,
    err_console,
    fitted_table,
    flag_names,
    guard,
    print_json,
    print_table,
)
from aisim.perf_knobs import FLAGS as KNOB_FLAGS
from aisim.perf_knobs import (
    GridAttentionKernelOpt,
    GridCpCommOpt,
    GridCpOpt,
    GridEagerOpt,
    GridEpOpt,
    GridEtpOpt,
    GridGradReduceOpt,
    GridMoeDispatchOpt,
    GridMoeImbalanceOpt,
    GridMoeOverlapOpt,
    GridRecomputeLayersOpt,
    GridReshardOpt,
    GridShardSizeOpt,
    GridTpOverlapOpt,
)
from aisim.perf_knobs import grid_knobs as modern_grid_knobs
from aisim.perf_planning import (
    PLAN_FLAGS,
    PlanOptions,
    PriceOpt,
    PueOpt,
    TokensOpt,
    UtilisationOpt,
    annotate_sweep,
    interval_line,
    plan_line,
)
from aisim.perf_sensitivity import SensitivityOpt, add_best_sensitivity
from perfmodel import (
    BREAKDOWN_TERMS,
    SweepResult,
    plot_sweep,
    resolve_hardware,
    resolve_model,
    strategy_label,
)
from perfmodel import sweep as run_sweep
from perfmodel.planning import plan_sweep
from simbase import units
from simbase.errors import bad_value
from simbase.io import write_table
from simbase.parse import bool_word, parse_int_list, split_list

Multi = list[str] | None
# library parameter -> this command's option, where the option is not --<name-with-dashes>
FLAGS = (
    flag_names(
        num_gpus="--gpus",
        num_layers="--layers",
        hidden_size="--hidden",
        num_heads="--heads",
        vocab_size="--vocab",
    )
    | KNOB_FLAGS
)
# the knob options that take on/off/both
ON_OFF = ("sequence_parallel", "dp_overlap", "fused_attention")


def _ints(values: Multi, field: str, minimum: int = 1) -> list[int] | None:
    """A repeated or comma-separated integer option (``64,128,...,1024``) as a list."""
    parts = split_list(values)
    return None if parts is None else parse_int_list(",".join(parts), field, minimum=minimum)


def _on_off(values: Multi, field: str) -> list[bool] | None:
    """``on``, ``off`` (any yes/no word) or ``both``, repeated or comma-separated."""
    out: list[bool] = []
    for p in split_list(values) or []:
        word = bool_word(p)
        if p.lower() == "both":
            out += [False, True]
        elif word is None:
            raise bad_value(None, field, p, "on, off or both")
        else:
            out.append(word)
    return out or None


def grid_knobs(
    *,
    tp: Multi = None,
    pp: Multi = None,
    micro_batch: Multi = None,
    schedule: Multi = None,
    interleave: Multi = None,
    zero: Multi = None,
    recompute: Multi = None,
    sequence_parallel: Multi = None,
    dtype: Multi = None,
    dp_overlap: Multi = None,
    fused_attention: Multi = None,
) -> dict[str, list | None]:
    """The knob options as :func:`perfmodel.sweep`'s restrictions (names are checked there)."""
    knobs: dict[str, list | None] = dict(
        tp=_ints(tp, "tp"),
        pp=_ints(pp, "pp"),
        micro_batch=_ints(micro_batch, "micro_batch"),
        interleave=_ints(interleave, "interleave"),
        zero=_ints(zero, "zero", minimum=0),
        schedule=split_list(schedule),
        recompute=split_list(recompute),
        dtype=split_list(dtype),
    )
    for name, values in zip(ON_OFF, (sequence_parallel, dp_overlap, fused_attention), strict=True):
        knobs[name] = _on_off(values, name)
    return knobs


class SweepProgress:
    """A progress bar on stderr for a sweep of several (model, hardware) pairs, shown once the
    sweep has run for a second (a quick sweep prints nothing); use as a context manager."""

    def __init__(self, enabled: bool = True, delay_s: float = 1.0):
        self.enabled = enabled
        self.delay_s = delay_s
        self.started = time.perf_counter()
        self.bar = None
        self.task = None

    def __call__(self, i: int, total: int, what: str) -> None:
        late = time.perf_counter() - self.started > self.delay_s
        if self.enabled and self.bar is None and late and total > 1 and i < total:
            from rich.progress import Progress

            self.bar = Progress(console=err_console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task("searching", total=total, completed=i)
        if self.bar is not None:
            self.bar.update(self.task, completed=i, description=what or "done")

    def __enter__(self) -> SweepProgress:
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()


def _sec(v: float) -> str:
    return f"{v:.3f}" if v < 100 else f"{v:.4g}"


def _cost(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


# headers of the breakdown terms, and which columns go first when the terminal is narrow
TERM_HEADERS = {
    "compute_s": "compute",
    "tp_comm_s": "tp",
    "cp_comm_s": "cp",
    "ep_comm_s": "ep",
    "dp_comm_exposed_s": "dp",
    "pp_p2p_s": "p2p",
    "bubble_s": "bubble",
    "optimizer_s": "optim",
    "overhead_s": "overhead",
}
TOP_DROP = (
    "overhead",
    "optim",
    "p2p",
    "$/Mtok",
    "cp",
    "ep",
    "dp",
    "tp",
    "bubble",
    "GiB",
    "compute",
    "#",
)
POINTS_DROP = ("$/Mtok", "MFU")
# the coordinates of a sweep point, and their headers
POINT_HEADERS = {
    "model": "model",
    "hardware": "hardware",
    "num_gpus": "gpus",
    "global_batch_size": "global batch",
}


def _term_cells(breakdown: dict) -> list[str]:
    """The breakdown terms of one row in seconds, the largest (the term that dominates the
    step) in bold."""
    top = max(BREAKDOWN_TERMS, key=lambda k: breakdown[k])
    return [
        f"[bold]{_sec(breakdown[k])}[/bold]" if k == top else _sec(breakdown[k])
        for k in BREAKDOWN_TERMS
    ]


def _drop_order(rows: list[dict]) -> list[str]:
    """The columns to hide when the terminal is narrow, first hidden first: :data:`TOP_DROP`,
    with its breakdown terms reordered by their largest value in the rows (zero terms first,
    the dominating ones last), so a dense model loses its empty cp and ep columns and a MoE
    model keeps ep while it matters."""
    header_of = {h: k for k, h in TERM_HEADERS.items()}
    slots = [h for h in TOP_DROP if h in header_of]
    # what the table shows: a term printed as 0.000 in every row is as good as zero
    largest = {h: round(max(r["breakdown"][header_of[h]] for r in rows), 3) for h in slots}
    zero = [h for h in slots if largest[h] == 0]
    rest = [h for h in TOP_DROP if h not in zero]
    ranked = iter(sorted((h for h in rest if h in header_of), key=lambda h: largest[h]))
    return zero + [next(ranked) if h in header_of else h for h in rest]


def _varying(rows: list[dict], keys: tuple[str, ...]) -> list[str]:
    """The keys whose value differs between rows (the columns worth showing)."""
    return [k for k in keys if len({r[k] for r in rows}) > 1]


def top_table(doc: dict, *, wide: bool = False):
    """The top strategies with their breakdown (seconds per step), one line each; the model,
    hardware and GPU count are columns only when the sweep varies them."""
    rows = doc["top"]
    varying = _varying(doc.get("sweep", rows), ("model", "hardware", "num_gpus"))
    headers = (
        [POINT_HEADERS[k] for k in varying]
        + ["#", "strategy", *(TERM_HEADERS[k] for k in BREAKDOWN_TERMS)]
        + ["step", "tokens/s", "MFU", "GiB", "$/Mtok"]
    )
    cells = []
    for i, r in enumerate(rows, 1):
        cells.append(
            [str(r[k]) for k in varying]
            + [str(i), strategy_label(r)]
            + _term_cells(r["breakdown"])
            + [
                _sec(r["step_time_s"]),
                f"{r['tokens_per_s']:.4g}",
                f"{100 * r['mfu']:.1f}%",
                f"{r['memory']['total_bytes'] / units.GIB:.1f}",
                _cost(r["cost_per_million_tokens_usd"]),
            ]
        )
    title = (
        f"top {len(rows)} of {doc['feasible']} feasible strategies ({doc['evaluated']} evaluated "
        f"in {doc['seconds']:.2f} s, cost model {rows[0]['cost_model']}); times in seconds per "
        "step, the largest term of each in bold"
    )
    return fitted_table(
        headers,
        cells,
        drop=_drop_order(rows),
        left=("model", "hardware", "strategy"),
        wide=wide,
        title=title,
        **COMPACT,
    )


def points_table(doc: dict, *, wide: bool = False):
    """The best strategy of each sweep point; the point's coordinates that vary are columns."""
    points = doc["sweep"]
    varying = _varying(points, tuple(POINT_HEADERS))
    headers = [POINT_HEADERS[k] for k in varying] + ["strategy", "tokens/s", "MFU", "$/Mtok"]
    cells = [
        [str(r[k]) for k in varying]
        + [
            strategy_label(r),
            f"{r['tokens_per_s']:.4g}",
            f"{100 * r['mfu']:.1f}%",
            _cost(r["cost_per_million_tokens_usd"]),
        ]
        for r in points
    ]
    return fitted_table(
        headers,
        cells,
        drop=POINTS_DROP,
        left=("model", "hardware", "strategy"),
        wide=wide,
        title="best strategy of each sweep point",
        **COMPACT,
    )


def _pareto_line(doc: dict) -> str:
    front = doc["pareto"]
    lo, hi = front[0], front[-1]
    return (
        f"Pareto front (memory per device vs tokens/s): {len(front)} strategies, from "
        f"{lo['memory']['total_bytes'] / units.GIB:.1f} GiB at {lo['tokens_per_s']:.4g} tokens/s "
        f"to {hi['memory']['total_bytes'] / units.GIB:.1f} GiB at {hi['tokens_per_s']:.4g} tokens/s"
    )


def print_sweep(doc: dict, *, wide: bool = False) -> None:
    """The sweep for people: the top strategies, the Pareto front, the best strategy of each
    sweep point, the cheapest hardware and why strategies were not feasible."""
    print_table(top_table(doc, wide=wide), wide=wide)
    if doc["best"].get("step_time_s_lo") is not None:
        console.print("best strategy: " + interval_line(doc["best"]), highlight=False)
    if doc["best"].get("train_days") is not None:
        console.print("best strategy " + plan_line(doc["best"]), highlight=False)
    if doc["best"].get("bound_by_text") is not None:
        console.print("best strategy: " + doc["best"]["bound_by_text"], highlight=False)
    console.print(_pareto_line(doc))
    if "sweep" in doc:
        print_table(points_table(doc, wide=wide), wide=wide)
    if "cheapest_hardware" in doc:
        c = doc["cheapest_hardware"]
        console.print(
            f"cheapest per million tokens: {c['hardware']} at "
            f"${c['cost_per_million_tokens_usd']:.3g} ({c['num_gpus']} GPUs, "
            f"{c['tokens_per_s']:.4g} tokens/s)"
        )
    if doc["infeasible_reasons"]:
        reasons = doc["infeasible_reasons"].items()
        console.print("not feasible: " + "; ".join(f"{k} ({v})" for k, v in reasons))


def _check_plot(plot: Path | None) -> None:
    if plot is not None and plot.suffix.lower() != ".png":
        raise bad_value(None, "plot", str(plot), "a file name ending in .png")


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
            help="A fused attention kernel (FlashAttention) that keeps no s x s scores: on, off or both (default: the model preset's, on for Llama, Mixtral, Qwen3, DeepSeek-V3 and GPT-OSS, off for GPT-2/GPT-3).",
        ),
    ] = None,
    cp: GridCpOpt = None,
    ep: GridEpOpt = None,
    etp: GridEtpOpt = None,
    shard_size: GridShardSizeOpt = None,
    recompute_layers: GridRecomputeLayersOpt = None,
    tp_overlap: GridTpOverlapOpt = None,
    grad_reduce_dtype: GridGradReduceOpt = None,
    moe_imbalance: GridMoeImbalanceOpt = None,
    moe_dispatch: GridMoeDispatchOpt = None,
    moe_overlap: GridMoeOverlapOpt = None,
    cp_comm: GridCpCommOpt = None,
    reshard_after_forward: GridReshardOpt = None,
    eager: GridEagerOpt = None,
    attention_kernel: GridAttentionKernelOpt = None,
    allow_cross_node_tp: Annotated[
        bool, typer.Option("--allow-cross-node-tp", help="Let tp span nodes.")
    ] = False,
    top: Annotated[int, typer.Option(help="How many of the best strategies to show.")] = 10,
    rank_by: Annotated[
        str,
        typer.Option(
            "--rank-by",
            help="throughput (tokens/s), cost ($ per million tokens), mfu, time (to train) or energy (per token).",
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
    wide: Annotated[
        bool,
        typer.Option("--wide", help="Show every column, even wider than the terminal."),
    ] = False,
    tokens: TokensOpt = None,
    price_per_gpu_hour: PriceOpt = None,
    utilisation: UtilisationOpt = None,
    pue: PueOpt = None,
    sensitivity: SensitivityOpt = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """Every valid strategy, evaluated in one vectorised pass, ranked (default: GPT-3 175B on
    1024 x A100-80GB, global batch 1536)."""
    with guard(FLAGS | PLAN_FLAGS):
        planned = PlanOptions(tokens, price_per_gpu_hour, utilisation, pue, profile)
        check_out_suffix(out)
        _check_plot(plot)
        knobs = grid_knobs(
            tp=tp,
            pp=pp,
            micro_batch=micro_batch,
            schedule=schedule,
            interleave=interleave,
            zero=zero,
            recompute=recompute,
            sequence_parallel=sequence_parallel,
            dtype=dtype,
            dp_overlap=dp_overlap,
            fused_attention=fused_attention,
        ) | modern_grid_knobs(
            cp=cp,
            ep=ep,
            etp=etp,
            shard_size=shard_size,
            recompute_layers=recompute_layers,
            tp_overlap=tp_overlap,
            grad_reduce_dtype=grad_reduce_dtype,
            moe_imbalance=moe_imbalance,
            moe_dispatch=moe_dispatch,
            moe_overlap=moe_overlap,
            cp_comm=cp_comm,
            reshard_after_forward=reshard_after_forward,
            eager=eager,
            attention_kernel=attention_kernel,
        )
        models = [
            resolve_model(
                name,
                model_file=model_file,
                params=params,
                num_layers=layers,
                hidden_size=hidden,
                num_heads=heads,
                seq_len=seq_len,
                vocab_size=vocab,
            )
            for name in split_list(model) or [None]
        ]
        if hardware_file is not None:
            devices = [resolve_hardware(None, hardware_file)]
        else:
            devices = [resolve_hardware(h) for h in split_list(hardware) or [None]]
        with SweepProgress(enabled=not json_out) as progress:
            result = plan_sweep(
                models,
                devices,
                tokens=planned.token_count,
                price_per_gpu_hour_usd=price_per_gpu_hour,
                utilisation_factor=utilisation,
                pue=pue,
                num_gpus=_ints(gpus, "num_gpus"),
                global_batch=_ints(global_batch, "global_batch"),
                gpus_per_node=gpus_per_node,
                constants=None if profile is None else (lambda hw: resolve_constants(hw, profile)),
                cost_model=cost_model,
                top=top,
                rank_by=rank_by,
                keep_all=out is not None,
                allow_cross_node_tp=allow_cross_node_tp,
                progress=progress,
                **knobs,
            )
        annotate_sweep(planned, result, cost_model)
        if sensitivity:
            add_best_sensitivity(result, profile)
        _report(result, out=out, plot=plot, json_out=json_out, wide=wide)


def _report(
    result: SweepResult, *, out: Path | None, plot: Path | None, json_out: bool, wide: bool
):
    """Writes ``--out`` and ``--plot``, then prints the JSON document or the tables."""
    doc = result.to_dict()
    doc["infeasible_reasons"] = {
        _reason(k, result.lifted_by): v for k, v in doc["infeasible_reasons"].items()
    }
    if out is not None and result.all_feasible is not None:
        write_table(result.all_feasible, out)
    if plot is not None:
        plot_sweep(doc, plot)
    if json_out:
        print_json(doc)
        return
    print_sweep(doc, wide=wide)
    if out is not None:
        console.print(f"wrote {doc['feasible']} feasible strategies to {out}")
    if plot is not None:
        console.print(f"wrote {plot}")


def _reason(reason: str, lifted_by: dict[str, str]) -> str:
    """A rule that pruned strategies, with the option that lifts it when there is one."""
    field = lifted_by.get(reason)
    return reason if field is None else f"{reason} (pass {FLAGS.get(field) or _flag(field)})"


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


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
) -> tuple[dict, object, list]:
    """Deprecated: the former entry point, kept so that existing scripts run; use
    :func:`perfmodel.sweep`. Returns ``(json_doc, all_feasible, [(model, hardware, search)])``."""
    dims = dict(num_layers=layers, hidden_size=hidden, num_heads=heads, seq_len=seq_len)
    names = models or [None]
    result = run_sweep(
        [
            resolve_model(n, model_file=model_file, params=params, vocab_size=vocab, **dims)
            for n in names
        ],
        [resolve_hardware(h, hardware_file) for h in (hardware or [None])],
        num_gpus=gpus,
        global_batch=global_batch,
        gpus_per_node=gpus_per_node,
        constants=None if profile is None else (lambda hw: resolve_constants(hw, profile)),
        cost_model=cost_model,
        top=top,
        rank_by=rank_by,
        keep_all=want_all,
        allow_cross_node_tp=allow_cross_node_tp,
        **(knobs or {}),
    )
    pairs = [(s.model, s.hardware, s.result) for s in result.searches]
    return result.to_dict(), result.all_feasible, pairs


def plot_grid(doc: dict, path: Path) -> None:
    """Deprecated: use :func:`perfmodel.plot_sweep`."""
    plot_sweep(doc, path)
