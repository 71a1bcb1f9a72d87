"""`aisim perf sensitivity`: what limits a run (elasticities of the step time, and capacity).

A thin shell over :mod:`perfmodel.sensitivity`: one strategy (the knobs of ``aisim perf
estimate``), or with ``--best`` the best strategy of the grid at that GPU count and batch; it
prints the elasticities (``--json``: an ``elasticities`` object keyed by the hardware file's
field paths and the constants' names), the one-line answer "this run is bound by X", and what
device memory changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import typer
from rich.table import Table

from aisim.common import resolve_constants
from aisim.console import check_out_suffix, console, flag_names, guard, print_json
from aisim.perf_knobs import FLAGS as KNOB_FLAGS
from aisim.perf_knobs import (
    CpCommOpt,
    CpOpt,
    EpOpt,
    EtpOpt,
    GradReduceOpt,
    MoeDispatchOpt,
    MoeImbalanceOpt,
    MoeOverlapOpt,
    RecomputeLayersOpt,
    ReshardOpt,
    ShardSizeOpt,
    TpOverlapOpt,
    estimate_knobs,
)
from perfmodel import (
    Constants,
    Estimate,
    Hardware,
    Model,
    estimate,
    resolve_hardware,
    resolve_model,
    strategy_label,
    sweep,
)
from perfmodel.sensitivity import capacity_answer, elasticities, plain_name
from perfmodel.sweep import SweepResult
from simbase.io import write_table

SensitivityOpt = Annotated[
    bool,
    typer.Option(
        "--sensitivity",
        help="Add the elasticities of the step time and the bound-by line (as `aisim perf "
        "sensitivity`; for the grid, of its best strategy).",
    ),
]
# the hardware file's field paths (the other elasticities are the constants')
HARDWARE_PREFIXES = ("peak_tflops.", "memory_bandwidth", "memory_capacity", "links.")
FLAGS = (
    flag_names(num_gpus="--gpus", micro_batch_size="--micro-batch", zero_stage="--zero")
    | KNOB_FLAGS
)
# a grid row's knob -> perfmodel.estimate's parameter
ROW_KNOBS = {
    "num_gpus": "num_gpus",
    "tp": "tp",
    "pp": "pp",
    "global_batch_size": "global_batch",
    "micro_batch_size": "micro_batch_size",
    "schedule": "schedule",
    "interleave": "interleave",
    "zero_stage": "zero_stage",
    "recompute": "recompute",
    "sequence_parallel": "sequence_parallel",
    "dtype": "dtype",
    "dp_overlap": "dp_overlap",
    "fused_attention": "fused_attention",
    "cp": "cp",
    "ep": "ep",
    "etp": "etp",
    "shard_size": "shard_size",
    "recompute_layers": "recompute_layers",
    "tp_overlap": "tp_overlap",
    "grad_reduce_fp32": "grad_reduce_fp32",
    "moe_imbalance": "moe_imbalance",
    "moe_dispatch": "moe_dispatch",
    "moe_overlap": "moe_overlap",
    "cp_comm": "cp_comm",
    "fsdp_reshard": "fsdp_reshard",
}


def sensitivity_fields(est: Estimate, constants: Constants) -> dict[str, Any]:
    """The sensitivity block of one strategy's document: ``elasticities`` (keyed by the
    hardware file's field paths and the constants' names), ``bound_by`` and ``bound_by_text``
    (what ``--sensitivity`` adds to ``aisim perf estimate --json`` and the grid's best)."""
    return elasticities(est.model, est.hardware, constants, est.strategy, est.cost_model).to_dict()


def row_estimate(row: dict[str, Any], m: Model, hw: Hardware, constants: Constants) -> Estimate:
    """A grid row (a strategy dict of :func:`perfmodel.sweep`) evaluated again as one
    :class:`Estimate` (its knobs, GPUs per node and cost model)."""
    return estimate(
        m,
        hw,
        constants=constants,
        cost_model=row["cost_model"],
        gpus_per_node=row.get("gpus_per_node"),
        **{ROW_KNOBS[k]: row[k] for k in ROW_KNOBS if k in row},
    )


def add_best_sensitivity(result: SweepResult, profile: Path | None) -> None:
    """Adds :func:`sensitivity_fields` to a sweep's best strategy (``aisim perf grid
    --sensitivity``), evaluated with the constants the sweep used (``profile``'s, if any)."""
    best = result.best
    pair = next(
        p
        for p in result.searches
        if (p.model.name, p.hardware.name) == (best["model"], best["hardware"])
    )
    consts = resolve_constants(pair.hardware, profile)
    best.update(sensitivity_fields(row_estimate(best, pair.model, pair.hardware, consts), consts))


def sensitivity_document(
    *,
    model: str | None = None,
    model_file: Path | None = None,
    hardware: str = "a100-80gb",
    hardware_file: Path | None = None,
    gpus: int = 1024,
    gpus_per_node: int | None = None,
    global_batch: int = 1536,
    knobs: dict[str, Any] | None = None,
    best: bool = False,
    capacity: bool = True,
    profile: Path | None = None,
    cost_model: str = "aisim",
) -> dict[str, Any]:
    """The ``aisim perf sensitivity --json`` document: the strategy, its step time,
    ``elasticities``, ``bound_by``, ``bound_by_text`` and (``capacity``) the ``capacity``
    answer."""
    m = resolve_model(model, model_file=model_file)
    hw = resolve_hardware(hardware, hardware_file)
    consts = resolve_constants(hw, profile)
    common = dict(gpus_per_node=gpus_per_node, cost_model=cost_model)
    if best:
        row = sweep(
            [m],
            [hw],
            num_gpus=[gpus],
            global_batch=[global_batch],
            constants=lambda _: consts,
            top=1,
            **common,
        ).best
        est = row_estimate(row, m, hw, consts)
    else:
        chosen = {"num_gpus": gpus, "global_batch": global_batch, **(knobs or {})}
        est = estimate(m, hw, constants=consts, **common, **chosen)
    doc = est.to_dict()
    doc["strategy"] = strategy_label(doc, short=False)
    doc["searched"] = best
    doc.update(sensitivity_fields(est, consts))
    if capacity:
        answer = capacity_answer(
            est,
            consts,
            num_gpus=[gpus],
            global_batch=[global_batch],
            gpus_per_node=gpus_per_node,
        )
        doc["capacity"] = answer.to_dict()
    return doc


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


def sensitivity_command(
    model: Annotated[str | None, typer.Option("--model", help="Model preset.")] = None,
    model_file: Annotated[
        Path | None, typer.Option("--model-file", help="Your own model JSON.")
    ] = None,
    hardware: Annotated[str, typer.Option("--hardware", help="Hardware preset.")] = "a100-80gb",
    hardware_file: Annotated[
        Path | None, typer.Option("--hardware-file", help="Your own hardware JSON.")
    ] = None,
    gpus: Annotated[int, typer.Option(help="Total devices.")] = 1024,
    gpus_per_node: Annotated[
        int | None,
        typer.Option("--gpus-per-node", help="Devices per node (default: the preset's)."),
    ] = None,
    global_batch: Annotated[
        int, typer.Option("--global-batch", help="Samples per optimiser step.")
    ] = 1536,
    tp: Annotated[int, typer.Option(help="Tensor-parallel degree.")] = 8,
    pp: Annotated[int, typer.Option(help="Pipeline-parallel degree.")] = 8,
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Samples per microbatch.")] = 1,
    schedule: Annotated[
        str | None, typer.Option(help="gpipe, 1f1b or interleaved (default 1f1b).")
    ] = None,
    interleave: Annotated[int, typer.Option(help="Model chunks per device (v).")] = 1,
    recompute: Annotated[str, typer.Option(help="none, selective or full.")] = "full",
    sequence_parallel: Annotated[
        bool, typer.Option("--sequence-parallel/--no-sequence-parallel", help="Megatron SP.")
    ] = False,
    zero: Annotated[int, typer.Option(help="ZeRO stage 0-3.")] = 0,
    dtype: Annotated[str, typer.Option(help="fp32, tf32, bf16, fp16 or fp8.")] = "bf16",
    cp: CpOpt = 1,
    ep: EpOpt = 1,
    etp: EtpOpt = 1,
    shard_size: ShardSizeOpt = 0,
    recompute_layers: RecomputeLayersOpt = 0,
    tp_overlap: TpOverlapOpt = False,
    grad_reduce_dtype: GradReduceOpt = "auto",
    moe_imbalance: MoeImbalanceOpt = 1.0,
    moe_dispatch: MoeDispatchOpt = "alltoall",
    moe_overlap: MoeOverlapOpt = False,
    cp_comm: CpCommOpt = "p2p",
    reshard_after_forward: ReshardOpt = True,
    best: Annotated[
        bool,
        typer.Option(
            "--best", help="Search the grid at this GPU count and batch; study its best strategy."
        ),
    ] = False,
    capacity: Annotated[
        bool,
        typer.Option(
            "--capacity/--no-capacity",
            help="Also the smallest feasible memory and the best strategy at ±1 capacity tier.",
        ),
    ] = True,
    profile: Annotated[
        Path | None, typer.Option("--profile", help="Calibrated profile JSON.")
    ] = None,
    cost_model: Annotated[str, typer.Option("--cost-model", help="aisim or distir.")] = "aisim",
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write the elasticities (quantity, elasticity) to a table."),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """What limits a run: the elasticity of the step time to each hardware quantity and
    calibrated constant (jax.grad through the model), and what device memory changes."""
    with guard(FLAGS):
        check_out_suffix(out)
        doc = sensitivity_document(
            model=model,
            model_file=model_file,
            hardware=hardware,
            hardware_file=hardware_file,
            gpus=gpus,
            gpus_per_node=gpus_per_node,
            global_batch=global_batch,
            knobs=dict(
                tp=tp,
                pp=pp,
                micro_batch_size=micro_batch,
                schedule=schedule,
                interleave=interleave,
                recompute=recompute,
                sequence_parallel=sequence_parallel,
                zero_stage=zero,
                dtype=dtype,
            )
            | estimate_knobs(
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
            ),
            best=best,
            capacity=capacity,
            profile=profile,
            cost_model=cost_model,
        )
        if out is not None:
            items = doc["elasticities"].items()
            write_table(pd.DataFrame(items, columns=["quantity", "elasticity"]), out)
        if json_out:
            print_json(doc)
            return
        print_sensitivity(doc)
        if out is not None:
            console.print(f"wrote {out}")
