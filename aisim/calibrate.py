"""`aisim calibrate`: fit constants to measurements, predict configurations, import training logs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import pandas as pd
import typer

from aisim.calibrate_import import import_colossal_command, import_command
from aisim.console import (
    console,
    err_console,
    flag_names,
    guard,
    print_json,
    rich_table,
)
from aisim.options import StackOpt
from simbase.errors import bad_value
from simbase.io import atomic_write_text, check_table_suffix, write_table

app = typer.Typer(
    no_args_is_help=True, help="Fit the model's constants to measured runs; predict new ones."
)

HardwareOpt = Annotated[
    str | None,
    typer.Option("--hardware", help="Hardware preset; also the value of blank 'hardware' cells."),
]
ModelOpt = Annotated[
    str | None,
    typer.Option("--model", help="Model preset for rows with no 'model' column or a blank cell."),
]
DtypeOpt = Annotated[
    str | None,
    typer.Option(
        "--dtype", help="Precision for rows with no 'dtype' (fp32, tf32, bf16, fp16, fp8)."
    ),
]
SkipOpt = Annotated[
    bool,
    typer.Option(
        "--skip-bad-rows", help="Use the valid rows and list the rest, instead of failing."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


# the prediction columns people see: these, and those that start with these prefixes
SHOWN = ("model", "global_batch_size", "batch_size", "num_gpus", "world_size", "error_pct")
SHOWN_PREFIXES = ("predicted_", "chosen_", "step_time_s_")
PREDICT_MINOR = ("predicted_tflops_per_gpu", "predicted_mfu", "predicted_feasible",
                 "predicted_throughput_samples_per_s")  # fmt: skip
# library argument names -> this area's flags, where they differ from --name-with-dashes
FLAGS = flag_names(free="--fit")


def _load(path: Path, purpose: str, skip_bad_rows: bool, **defaults) -> pd.DataFrame:
    """The measurement table (blank cells take the options' ``defaults``); each row skipped
    (``--skip-bad-rows``) is one yellow line on stderr."""
    from calibration import load_measurements

    given = {k: v for k, v in defaults.items() if v}
    df = load_measurements(path, skip_bad_rows=skip_bad_rows, purpose=purpose, defaults=given)
    for msg in df.attrs.get("skipped", []):
        err_console.print(f"[yellow]skipped[/yellow] {msg}", highlight=False, soft_wrap=True)
    return df


@app.command("fit")
def fit_command(
    measurements: Annotated[
        Path, typer.Argument(help="Measurement CSV (columns and aliases of DESIGN.md).")
    ],
    hardware: HardwareOpt = None,
    fit: Annotated[
        str | None,
        typer.Option(
            "--fit",
            help="Comma-separated constants to free (default: matmul and memory efficiency, matmul half-size, kernel and microbatch overheads); 'efficiency' = one overall efficiency; a per-tier name like link_bandwidth_efficiency.inter_node frees one tier.",
        ),
    ] = None,
    model: ModelOpt = None,
    dtype: DtypeOpt = None,
    stack: StackOpt = None,
    skip_bad_rows: SkipOpt = False,
    seed: Annotated[
        int, typer.Option("--seed", help="Seed of the k-fold split (leave-one-out needs none).")
    ] = 0,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="Write a parity plot (predicted vs measured, log-log) PNG."),
    ] = None,
    json_: JsonOpt = False,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write the calibrated profile JSON (schema aisim.profile/1)."),
    ] = None,
) -> None:
    """Fit the constants to measured step times; report in-sample and held-out error."""
    with guard(FLAGS):
        from calibration import fit_measurements, parity_plot
        from perfmodel import load_hardware

        check_table_suffix(out, (".json",))
        if plot is not None and plot.suffix.lower() != ".png":
            raise bad_value(None, "plot", str(plot), "a .png file name")
        hw_name = load_hardware(hardware).name if hardware else None
        df = _load(measurements, "fit", skip_bad_rows, hardware=hw_name, model=model, dtype=dtype,
                   stack=stack)  # fmt: skip
        run = fit_measurements(df, hardware=hw_name, free=fit, seed=seed, source=str(measurements))
        result = run.result
        if out is not None:
            atomic_write_text(out, run.profile_text())
        if plot is not None:
            parity_plot(
                result.measured_s,
                result.predicted_s,
                plot,
                cv_predicted_s=result.cv_predicted_s,
                title=f"{measurements.name} on {run.hardware}: in-sample "
                f"{result.in_sample_mape_pct:.2f}% MAPE",
            )
        if json_:
            typer.echo(run.document_text(), nl=False)
            return
        _print_fit(run)


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "n/a" if x is None or not np.isfinite(x) else format(x, spec)


def _print_fit(run) -> None:
    result = run.result
    table = run.row_table()
    console.print(rich_table(table, title=f"calibration on {run.hardware}: {len(table)} rows"))
    console.print(
        f"held-out ({result.cv_method}) MAPE {_fmt(result.cv_mape_pct)}%, "
        f"max {_fmt(result.cv_max_error_pct)}%"
    )
    console.print(
        f"in-sample MAPE {_fmt(result.in_sample_mape_pct)}%, max {_fmt(result.in_sample_max_error_pct)}%"
    )
    title = "fitted constants (SI units, 1σ from the Hessian)"
    console.print(rich_table(run.constants_table(), title=title))


@app.command("predict")
def predict_command(
    configs: Annotated[
        Path, typer.Argument(help="Configuration CSV; blank knob cells are searched.")
    ],
    profile: Annotated[
        Path | None,
        typer.Option(
            "--profile",
            help="Calibrated profile JSON from `aisim calibrate fit --out` (with its "
            "covariance, rows get step_time_s_lo/_hi: the 90% prediction interval).",
        ),
    ] = None,
    hardware: HardwareOpt = None,
    model: ModelOpt = None,
    dtype: DtypeOpt = None,
    stack: StackOpt = None,
    skip_bad_rows: SkipOpt = False,
    json_: JsonOpt = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the predictions (.csv, .parquet or .json).")
    ] = None,
) -> None:
    """Predict step time, throughput and TFLOPS per GPU of each row (blank knobs searched)."""
    with guard(FLAGS):
        from calibration import predict_measurements, read_csv_cells

        check_table_suffix(out)
        df = _load(configs, "predict", skip_bad_rows, hardware=hardware, model=model, dtype=dtype,
                   stack=stack)  # fmt: skip
        table = predict_measurements(
            df, hardware=hardware, profile=profile, raw=read_csv_cells(configs)
        )
        if out is not None:
            write_table(table, out)
        if json_:
            print_json({"rows": len(table), "predictions": table.to_dict(orient="records")})
            return
        show = [c for c in table.columns if c.startswith(SHOWN_PREFIXES) or c in SHOWN]
        # the minor columns go first where the console is narrow (--out keeps them all)
        minor = [c for c in PREDICT_MINOR if c in show] + [
            c for c in show if c.startswith(("chosen_", "step_time_s_"))
        ]
        console.print(
            rich_table(table[show], title=f"predictions for {configs.name}", drop=minor,
                       wide_flag=None)
        )  # fmt: skip


app.command("import")(import_command)
app.command("import-colossal")(import_colossal_command)
