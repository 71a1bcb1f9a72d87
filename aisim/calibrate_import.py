"""`aisim calibrate import-colossal LOG...`: Colossal-AI benchmark logs -> measurement rows.

Register with ``app.command("import-colossal")(import_colossal_command)``. The parsing lives in
:func:`calibration.import_logs`; this module only maps options to overrides and prints or writes.
An override a log needs (its world size, its batch size) is named by its flag in the error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aisim.console import check_out_suffix, console, guard, print_json, rich_table
from simbase.io import write_table

SHOWN = ("source_file", "source_row", "model", "hardware", "plugin", "num_gpus", "dp", "tp", "pp",
         "zero_stage", "global_batch_size", "seq_len", "throughput_samples_per_s",
         "measured_step_time_s", "tflops_per_gpu")  # fmt: skip


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
        check_out_suffix(out)
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
        console.print(rich_table(shown, title=f"{len(df)} Colossal-AI runs"))
        for message in skipped:
            console.print(f"[yellow]skipped:[/yellow] {message}", highlight=False)
        if out is not None:
            console.print(f"wrote {len(df)} rows to {out}")
