"""`aisim calibrate import LOG...` and `aisim calibrate import-colossal LOG...`: training logs ->
measurement rows.

Register with ``app.command("import")(import_command)`` and
``app.command("import-colossal")(import_colossal_command)``. ``import`` reads Megatron-LM,
torchtitan, DeepSpeed and every Colossal-AI generation (:func:`calibration.logs.import_logs`);
``import-colossal`` keeps its own options (``-b`` per data-parallel rank, ``--plugin``,
``--nnodes``, ``--skip-bad-rows``) over :func:`calibration.import_logs`. The parsing lives in the
library; this module only maps options to overrides and prints or writes. A value a log lacks
(its world size, its model) is named with the option that supplies it in the error.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer
from rich import box
from rich.markup import escape

from aisim.console import (
    console,
    fitted_table,
    guard,
    print_json,
    print_table,
    rich_table,
)
from aisim.options import SetOpt, StackOpt, knob_options, with_settings
from perfmodel.specs.knobs import BY_NAME
from simbase.io import check_table_suffix, write_table

# measurement column -> header of the printed table, in order
SHOWN_LOGS = {"source": "log", "format": "format", "model": "model", "hardware": "hardware",
              "num_gpus": "gpus", "dp": "dp", "tp": "tp", "pp": "pp",
              "global_batch_size": "batch", "seq_len": "seq", "step_time_s": "step_s",
              "step_time_std_s": "std_s", "iterations_averaged": "steps",
              "tflops_per_gpu": "tflops"}  # fmt: skip
# headers dropped first when the table is wider than the console
DROP_LOGS = ("tflops", "hardware", "std_s", "seq", "format")
TEXT_LOGS = ("log", "format", "model", "hardware")

SHOWN = ("source_file", "source_row", "model", "hardware", "plugin", "num_gpus", "dp", "tp", "pp",
         "zero_stage", "global_batch_size", "seq_len", "throughput_samples_per_s",
         "measured_step_time_s", "tflops_per_gpu")  # fmt: skip
# the Colossal-AI table's minor columns, dropped first on a narrow console (--out keeps them)
COLOSSAL_MINOR = ("hardware", "tflops_per_gpu", "throughput_samples_per_s", "seq_len", "plugin")


def import_colossal_command(
    logs: Annotated[list[Path], typer.Argument(help="Colossal-AI benchmark log files.")],
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the rows to .csv, .parquet or .json.")
    ] = None,
    plugin: Annotated[
        str | None, typer.Option(help="Booster plugin (gemini, 3d, fsdp, ...), if not in the log.")
    ] = None,
    tp: Annotated[int | None, typer.Option(help="Tensor-parallel degree.")] = None,
    pp: Annotated[int | None, typer.Option(help="Pipeline-parallel degree.")] = None,
    zero: Annotated[int | None, typer.Option(help="ZeRO stage (0-3).")] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="Samples per data-parallel rank per step (Colossal-AI -b).")
    ] = None,
    global_batch_size: Annotated[
        int | None, typer.Option(help="Samples per optimiser step, all ranks together.")
    ] = None,
    num_gpus: Annotated[int | None, typer.Option(help="World size (devices in all).")] = None,
    nnodes: Annotated[int | None, typer.Option(help="Nodes, when the log used --hostfile.")] = None,
    model: Annotated[str | None, typer.Option(help="Model preset name.")] = None,
    hardware: Annotated[str | None, typer.Option(help="Hardware preset name.")] = None,
    seq_len: Annotated[int | None, typer.Option(help="Sequence length in tokens.")] = None,
    dtype: Annotated[str | None, typer.Option(help="fp32, tf32, bf16, fp16 or fp8.")] = None,
    mbs: Annotated[int | None, typer.Option(help="Pipeline micro-batch size in samples.")] = None,
    grad_checkpoint: Annotated[
        bool | None,
        typer.Option("--grad-checkpoint/--no-grad-checkpoint", help="Full recomputation or none."),
    ] = None,
    skip_bad_rows: Annotated[
        bool, typer.Option("--skip-bad-rows", help="Drop runs that fail validation; keep the rest.")
    ] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """Turns Colossal-AI benchmark logs into measurement rows (the calibration CSV schema)."""
    from calibration import import_logs

    with guard():
        check_table_suffix(out)
        overrides = dict(
            plugin=plugin, tp=tp, pp=pp, zero=zero, batch_size=batch_size,
            global_batch_size=global_batch_size, num_gpus=num_gpus, nnodes=nnodes, model=model,
            hardware=hardware, seq_len=seq_len, dtype=dtype, mbs=mbs,
            grad_checkpoint=grad_checkpoint,
        )  # fmt: skip
        df = import_logs(logs, overrides, skip_bad_rows=skip_bad_rows)
        skipped = df.attrs.get("skipped", [])
        if out is not None:
            write_table(df, out)
        if json_:
            print_json({"rows": df.to_dict(orient="records"), "skipped": skipped,
                        "out": str(out) if out else None})  # fmt: skip
            return
        shown = df[[c for c in SHOWN if c in df.columns]].copy()
        shown["source_file"] = [Path(f).name for f in shown["source_file"]]
        shown = shown.rename(columns={"source_file": "log", "source_row": "run"})
        drop = [c for c in COLOSSAL_MINOR if c in shown.columns]
        console.print(rich_table(shown, title=f"{len(df)} Colossal-AI runs", drop=drop,
                                 wide_flag=None))  # fmt: skip
        for message in skipped:
            console.print(f"[yellow]skipped:[/yellow] {message}", highlight=False)
        if out is not None:
            console.print(f"wrote {len(df)} rows to {out}")


# the knobs a log import can override (the columns of its rows)
IMPORT_KNOBS = (
    "num_gpus", "tp", "pp", "dp", "cp", "ep", "global_batch_size", "micro_batch_size", "dtype",
    "recompute", "zero_stage",
)  # fmt: skip


@knob_options(include=IMPORT_KNOBS)
def import_command(
    knobs: dict,
    logs: Annotated[
        list[Path],
        typer.Argument(
            help="Training logs (Megatron-LM, torchtitan, DeepSpeed, Colossal-AI). A .toml file "
            "is a torchtitan job config for the torchtitan logs given with it."
        ),
    ],
    format: Annotated[
        str,
        typer.Option(
            "--format",
            help="auto (detect per file), megatron, colossal, torchtitan or deepspeed.",
        ),
    ] = "auto",
    skip_iterations: Annotated[
        int | None,
        typer.Option(
            "--skip-iterations",
            min=0,
            help="Warm-up steps left out after each start of a run. Default: the first 10% of "
            "its timing lines, at least one (Colossal-AI: the script's ignore_steps).",
        ),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Model preset name (wins over the log).")
    ] = None,
    hardware: Annotated[str | None, typer.Option(help="Hardware preset name.")] = None,
    stack: StackOpt = None,
    settings: SetOpt = None,
    seq_len: Annotated[int | None, typer.Option(help="Sequence length in tokens.")] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the rows to .csv, .parquet or .json.")
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    wide: Annotated[
        bool, typer.Option("--wide", help="Show every column, wider than the terminal if need be.")
    ] = False,
) -> None:
    """Turns training logs into measurement rows (the calibration CSV schema), with where each
    value came from (a log line or an option) in a provenance column. The format is detected per
    file unless --format names it; --format colossal reads every Colossal-AI generation."""
    from calibration.logs import import_logs

    with guard():
        check_table_suffix(out)
        overrides = dict(model=model, hardware=hardware, stack=stack, seq_len=seq_len)
        for name, value in with_settings(knobs, settings).items():  # as the log rows hold them
            knob = BY_NAME[name]
            overrides[name] = knob.label(knob.code(knob.parse(value)))
        df = import_logs(logs, format=format, overrides=overrides, skip_iterations=skip_iterations)
        if out is not None:
            write_table(df, out)
        if json_:
            print_json({"rows": df.to_dict(orient="records"), "out": str(out) if out else None})
            return
        print_table(
            _logs_table(
                df, title=f"{_count(len(df), 'run')} from {_count(len(logs), 'log')}", wide=wide
            ),
            wide=wide,
        )
        if out is not None:
            console.print(f"wrote {_count(len(df), 'row')} to {out}")


def _logs_table(df: pd.DataFrame, *, title: str, wide: bool):
    """The imported rows for people: a few columns, short headers, fitted to the console."""
    cols = [c for c in SHOWN_LOGS if c in df.columns]
    rows = []
    for rec in df[cols].to_dict(orient="records"):
        cells = []
        for c in cols:
            v = rec[c]
            if c == "source":
                cells.append(escape(_short_source(v)))
            elif v is None or (isinstance(v, float) and math.isnan(v)):
                cells.append("")
            elif isinstance(v, float):
                cells.append(f"{v:.4g}" if not v.is_integer() or c.startswith("step") else f"{v:g}")
            else:
                cells.append(escape(str(v)))
        rows.append(cells)
    headers = [SHOWN_LOGS[c] for c in cols]
    return fitted_table(
        headers,
        rows,
        drop=[h for h in DROP_LOGS if h in headers],
        left=[h for h in TEXT_LOGS if h in headers],
        wide=wide,
        title=title,
        box=box.SIMPLE_HEAD,
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _short_source(source: str) -> str:
    """``dir/run.log:L3-L90`` -> ``run.log:L3-L90``."""
    path, sep, lines = str(source).rpartition(":")
    return f"{Path(path).name}:{lines}" if sep else Path(source).name
