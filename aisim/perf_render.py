"""How `aisim perf` shows its results to people: tables that fit the terminal, and one-line
summaries. Nothing here computes a result; `--json` prints the documents these read.
"""

from __future__ import annotations

import time
from typing import Any

from rich.table import Table

from aisim.console import COMPACT, console, err_console, fitted_table, print_table
from aisim.options import FLAGS
from perfmodel import BREAKDOWN_TERMS, SweepResult, strategy_label
from perfmodel.plan.compare import several_stacks
from perfmodel.plan.sensitivity import plain_name
from perfmodel.specs.knobs import STACK_KNOBS
from simbase import units
from simbase.units import format_count

# the hardware file's field paths (the other elasticities are the constants')
HARDWARE_PREFIXES = ("peak_tflops.", "memory_bandwidth", "memory_capacity", "links.")


def sweep_document(result: SweepResult) -> dict:
    """The grid's JSON document, each rule that pruned strategies naming the option that lifts
    it when there is one."""
    doc = result.to_dict()
    lifted = result.lifted_by

    def reason(k: str) -> str:
        field = lifted.get(k)
        return (
            k
            if field is None
            else f"{k} (pass {FLAGS.get(field) or '--' + field.replace('_', '-')})"
        )

    doc["infeasible_reasons"] = {reason(k): v for k, v in doc["infeasible_reasons"].items()}
    return doc


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
    "step_overhead_s": "loop",
}
TOP_DROP = (
    "loop",
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
    "stack": "stack",
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
    hardware, stack and GPU count are columns only when the sweep varies them."""
    rows = doc["top"]
    varying = _varying(doc.get("sweep", rows), ("model", "hardware", "stack", "num_gpus"))
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
        left=("model", "hardware", "stack", "strategy"),
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
        left=("model", "hardware", "stack", "strategy"),
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
    print_plan(doc["best"], subject="best strategy")
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


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


def _auto_words(auto: dict | None) -> str:
    """What ``auto`` chose, in one parenthesis: `` (auto: recompute full, recompute_layers 3)``."""
    return f" (auto: {', '.join(f'{k} {v}' for k, v in auto.items())})" if auto else ""


def _stack_words(doc: dict) -> str:
    """The stack in a title: its name, or for a custom one the behaviours that differ from the
    registry's (``fused-attention``, ``attention-kernel=fa2``)."""
    if doc.get("stack", "custom") != "custom":
        return f" stack={doc['stack']}"
    words = []
    for k in STACK_KNOBS:
        v, default = doc.get(k.name), k.label(k.default)
        if k.name not in doc or isinstance(k.kind, dict) or v == default:
            continue
        name = k.option[2:]
        words.append(name if v is True else f"no-{name}" if v is False else f"{name}={v}")
    return "".join(f" {w}" for w in words)


def print_estimate(doc: dict) -> None:
    """A rich table of one estimate, for people."""
    title = (
        f"{doc['model']} on {doc['num_gpus']} x {doc['hardware']}: dp={doc['dp']} tp={doc['tp']} "
        f"pp={doc['pp']} mbs={doc['micro_batch_size']} m={doc['num_microbatches']} "
        f"{doc['schedule']} v={doc['interleave']} zero={doc['zero_stage']} recompute={doc['recompute']} "
        f"sp={'on' if doc['sequence_parallel'] else 'off'} {doc['dtype']}"
        + _stack_words(doc)
        + "".join(f" {k}={doc[k]}" for k in ("cp", "ep", "etp") if doc.get(k, 1) > 1)
        + (f" shard={doc['shard_size']}" if doc.get("shard_size") else "")
        + (f" recompute-layers={doc['recompute_layers']}" if doc.get("recompute_layers") else "")
        + _auto_words(doc.get("auto"))
    )
    console.print(title, highlight=False)
    t = Table()
    t.add_column("term")
    t.add_column("seconds", justify="right")
    t.add_column("share", justify="right")
    total = doc["step_time_s"]
    for k in BREAKDOWN_TERMS:
        v = doc["breakdown"][k]
        t.add_row(k.removesuffix("_s"), f"{v:.4g}", f"{100 * v / total:.1f}%")
    t.add_row("[bold]step time[/bold]", f"[bold]{total:.4g}[/bold]", "100%")
    console.print(t)
    mem = doc["memory"]
    console.print(
        f"throughput {doc['throughput_samples_per_s']:.4g} samples/s, {doc['tokens_per_s']:.4g} tokens/s; "
        f"MFU {_pct(doc['mfu'])}, HFU {_pct(doc['hfu'])}; "
        f"{doc['model_tflops_per_gpu']:.1f} model TFLOP/s per GPU"
    )
    console.print(
        f"memory per device {mem['total_bytes'] / units.GIB:.1f} GiB (weights {mem['weights_bytes'] / units.GIB:.1f}, "
        f"gradients {mem['gradients_bytes'] / units.GIB:.1f}, optimizer {mem['optimizer_bytes'] / units.GIB:.1f}, "
        f"activations {mem['activations_bytes'] / units.GIB:.1f}); "
        + (
            "[green]feasible[/green]"
            if doc["feasible"]
            else "[red]infeasible: " + "; ".join(doc.get("infeasible_because") or ["?"]) + "[/red]"
        )
    )
    print_plan(doc)
    if doc.get("bound_by_text"):
        console.print(doc["bound_by_text"], highlight=False)
    if doc.get("constants") and doc["constants"].get("status") != "preset":
        console.print(f"constants: {doc['constants']['reason']}", highlight=False)


def money(v: float | None) -> str:
    """Dollars in a few characters (``$65M``); unknown says why."""
    if v is None:
        return "unknown cost (no price: pass --price-per-gpu-hour)"
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"${v / scale:.3g}{suffix}"
    return f"${v:.3g}"


def _energy(v: float | None) -> str:
    if v is None:
        return "unknown energy (no board power for this hardware)"
    return f"{v / 1000:.3g} GWh" if v >= 1000 else f"{v:.3g} MWh"


def _num(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def _days(doc: dict, key: str = "train_days") -> str:
    d = doc[key]
    lo, hi = doc.get(f"{key}_lo"), doc.get(f"{key}_hi")
    text = f"{_num(d)} days" if d >= 1 else f"{24 * d:.3g} hours"
    if lo is not None and hi is not None:
        text += f" ({_num(lo)}-{_num(hi)} days, {doc.get('interval_level', 0.9):.0%})"
    return text


def plan_line(doc: dict) -> str:
    """One line: the time, GPU-hours, cost and energy to train of a result document."""
    return (
        f"to train {format_count(doc['tokens'])} tokens: {_days(doc)}, "
        f"{format_count(doc['gpu_hours'])} GPU-hours, "
        f"{money(doc['cost_usd'])}, {_energy(doc['energy_mwh'])} "
        f"(utilisation {doc['utilisation_factor']:g}, PUE {doc['pue']:g})"
    )


def interval_line(doc: dict) -> str:
    """``step time 18.2 s ± 0.6 s (90%: 17.6-18.8 s)``: ± is half the interval's width (the
    interval is symmetric in log space; ``--json`` has its exact bounds)."""
    t, lo, hi = doc["step_time_s"], doc["step_time_s_lo"], doc["step_time_s_hi"]
    level = f"{doc['interval_level']:.0%}"
    return (
        f"step time {t:.3g} s ± {(hi - lo) / 2:.2g} s ({level}: {lo:.3g}-{hi:.3g} s); "
        f"tokens/s {doc['tokens_per_s']:.4g} ({doc['tokens_per_s_lo']:.4g}-"
        f"{doc['tokens_per_s_hi']:.4g}); MFU {100 * doc['mfu']:.1f}% "
        f"({100 * doc['mfu_lo']:.1f}-{100 * doc['mfu_hi']:.1f}%)"
    )


def failures_line(f: dict) -> str:
    """One line of a plan's failures: interruptions, checkpoints, restarts, stragglers."""
    return (
        f"failures: {f['interruptions_per_day']:.3g} interruptions per day (MTBF "
        f"{f['mtbf_hours']:.3g} h, {f['interruptions']:.0f} in the run); checkpoints of "
        f"{f['checkpoint_bytes'] / units.GIGA:,.0f} GB every {f['checkpoint_interval_s']:.3g} s "
        f"({f['checkpoint_write_s']:.3g} s to write); restart {f['restart_s'] / 60:.3g} min; "
        f"stragglers x{f['straggler_slowdown']:.3f}; goodput {100 * f['goodput']:.1f}%"
    )


def print_plan(doc: dict, subject: str = "") -> None:
    """Prints the interval line, :func:`plan_line` and :func:`failures_line` when the document
    carries them, each after ``subject`` (``best strategy``) when one is given."""
    lead, colon = (f"{subject} ", f"{subject}: ") if subject else ("", "")
    if doc.get("step_time_s_lo") is not None:
        console.print(colon + interval_line(doc), highlight=False)
    if doc.get("train_days") is not None:
        console.print(lead + plan_line(doc), highlight=False)
    if doc.get("failures") is not None:
        console.print(lead + failures_line(doc["failures"]), highlight=False)


def print_sensitivity(doc: dict[str, Any]) -> None:
    """The elasticities as a table (largest first), the bound-by line and the capacity lines."""
    console.print(
        f"{doc['model']} on {doc['num_gpus']} x {doc['hardware']}: {doc['strategy']} "
        f"({'best of the grid' if doc['searched'] else 'as given'}), step {doc['step_time_s']:.4g} s",
        highlight=False,
    )
    t = Table(title="elasticity of the step time: d ln(step) / d ln(x)")
    t.add_column("quantity")
    t.add_column("what", style="dim")
    t.add_column("elasticity", justify="right")
    items = sorted(doc["elasticities"].items(), key=lambda kv: -abs(kv[1]))
    for key, e in items:
        if abs(e) < 5e-4:
            continue
        what = plain_name(key) if key.startswith(HARDWARE_PREFIXES) else "calibrated constant"
        t.add_row(key, what, f"{e:+.3f}")
    console.print(t)
    console.print(doc["bound_by_text"], highlight=False)
    cap = doc.get("capacity")
    if cap:
        console.print(
            f"memory: this strategy needs {cap['memory_per_device_gib']:.1f} GiB per device and "
            f"stays feasible down to {cap['smallest_feasible_gib']:.1f} GiB "
            f"(the hardware has {cap['capacity_gib']:.1f} GiB)",
            highlight=False,
        )
        for name, tier in cap["tiers"].items():
            if tier is None:
                console.print(f"no standard capacity tier {name} than this hardware's")
                continue
            b = tier["best"]
            what = (
                "nothing is feasible"
                if b is None
                else f"best {strategy_label(b, short=False)}: step {b['step_time_s']:.4g} s, "
                f"{b['tokens_per_s']:.4g} tokens/s"
            )
            console.print(f"at {tier['capacity_gib']:g} GiB ({name} tier): {what}", highlight=False)


def print_compare(doc: dict[str, Any]) -> None:
    """The side-by-side table."""
    t = Table(
        title=f"{doc['model']}, {format_count(doc['tokens'])} tokens on {doc['num_gpus']} GPUs "
        f"(global batch {doc['global_batch_size']}, best by {doc['rank_by']})"
    )
    several = several_stacks(doc)  # named only when it varies
    head = ("hardware", "stack: best strategy" if several else "best strategy")
    for h in (*head, "step s", "tokens/s", "MFU", "days", "GPU-h"):
        t.add_column(h, justify="left" if h in head else "right")
    t.add_column("cost", justify="right")
    t.add_column("MWh", justify="right")
    for r in doc["hardware"]:
        t.add_row(
            r["hardware"],
            f"{r['stack']}:\n{r['strategy']}" if several else r["strategy"],
            f"{r['step_time_s']:.4g}",
            f"{r['tokens_per_s']:.4g}",
            f"{100 * r['mfu']:.1f}%",
            f"{r['train_days']:,.1f}",
            format_count(r["gpu_hours"]),
            "unknown" if r["cost_usd"] is None else money(r["cost_usd"]),
            "unknown" if r["energy_mwh"] is None else f"{r['energy_mwh']:,.0f}",
        )
    console.print(t)
