"""`aisim calibrate`: fit constants to measurements, predict configurations, import Colossal-AI logs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import pandas as pd
import typer

from aisim.console import check_out_suffix, console, err_console, guard, print_json, rich_table
from simbase.errors import AisimError
from simbase.io import atomic_write_text, write_table

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


def _defaults(hardware: str | None, model: str | None, dtype: str | None) -> dict[str, str]:
    return {k: v for k, v in (("hardware", hardware), ("model", model), ("dtype", dtype)) if v}


def _warn_skipped(df: pd.DataFrame, json_: bool) -> list[str]:
    skipped = list(df.attrs.get("skipped", []))
    for msg in skipped:
        err_console.print(f"[yellow]skipped[/yellow] {msg}", highlight=False, soft_wrap=True)
    return skipped


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
    with guard():
        from calibration import report
        from calibration.fit import fit as run_fit
        from calibration.measurements import load_measurements
        from calibration.parameterization import parse_free
        from calibration.rows import build_batch, resolve_rows
        from calibration.rows import measured_step_times as measured_or_fail
        from perfmodel.hardware import load_hardware

        check_out_suffix(out, (".json",))
        if plot is not None and plot.suffix.lower() != ".png":
            raise AisimError(f"command line: field '--plot' = '{plot}': expected a .png file name")
        hw = load_hardware(hardware) if hardware else None
        df = load_measurements(
            measurements,
            skip_bad_rows=skip_bad_rows,
            purpose="fit",
            defaults=_defaults(hw.name if hw else None, model, dtype),
        )
        skipped = _warn_skipped(df, json_)
        measured_all = df["has_measurement"].to_numpy(bool)
        df = df[measured_all].reset_index(drop=True)
        measured = measured_or_fail(df)
        rows = resolve_rows(df, hw.name if hw else None)
        names = sorted({rc.hardware.name for rc in rows})
        if len(names) > 1:
            raise AisimError(
                f"{measurements}: rows name several hardware ({', '.join(names)}): a profile "
                "is for one hardware; split the file or pass --hardware for blank cells"
            )
        hw = rows[0].hardware
        if hardware and hw.name != load_hardware(hardware).name:
            raise AisimError(
                f"{measurements}: field 'hardware' = {hw.name!r}, but --hardware is {hardware!r}"
            )
        param = parse_free(fit, hw.constants)
        batch = build_batch(rows)
        result = run_fit(param, batch, measured, seed=seed)
        sha = report.data_sha256(rows, batch.strategies, measured)
        doc = report.fit_document(
            df, result, hardware=hw.name, data_sha=sha, seed=seed, skipped=skipped
        )
        if out is not None:
            atomic_write_text(
                out,
                report.dumps(
                    report.profile_document(result, hardware=hw.name, data_sha=sha, seed=seed)
                ),
            )
        if plot is not None:
            report.parity_plot(
                result.measured_s,
                result.predicted_s,
                plot,
                cv_predicted_s=result.cv_predicted_s,
                title=f"{measurements.name} on {hw.name}: in-sample "
                f"{result.in_sample_mape_pct:.2f}% MAPE",
            )
        if json_:
            typer.echo(report.dumps(doc), nl=False)
            return
        _print_fit(df, result, hw.name)


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "n/a" if x is None or not np.isfinite(x) else format(x, spec)


def _print_fit(df: pd.DataFrame, result, hardware: str) -> None:
    from calibration import report

    table = report.row_table(df, result)
    console.print(rich_table(table, title=f"calibration on {hardware}: {len(table)} rows"))
    console.print(
        f"held-out ({result.cv_method}) MAPE {_fmt(result.cv_mape_pct)}%, "
        f"max {_fmt(result.cv_max_error_pct)}%"
    )
    console.print(
        f"in-sample MAPE {_fmt(result.in_sample_mape_pct)}%, max {_fmt(result.in_sample_max_error_pct)}%"
    )
    rows = [
        {
            "constant": k,
            "value": v["value"],
            "stddev": v["stddev"] if v["stddev"] is not None else np.nan,
        }
        for k, v in report.constants_with_uncertainty(result).items()
    ]
    console.print(
        rich_table(pd.DataFrame(rows), title="fitted constants (SI units, 1σ from the Hessian)")
    )


@app.command("predict")
def predict_command(
    configs: Annotated[
        Path, typer.Argument(help="Configuration CSV; blank knob cells are searched.")
    ],
    profile: Annotated[
        Path | None,
        typer.Option("--profile", help="Calibrated profile JSON from `aisim calibrate fit --out`."),
    ] = None,
    hardware: HardwareOpt = None,
    model: ModelOpt = None,
    dtype: DtypeOpt = None,
    skip_bad_rows: SkipOpt = False,
    json_: JsonOpt = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the predictions (.csv, .parquet or .json).")
    ] = None,
) -> None:
    """Predict step time, throughput and TFLOPS per GPU of each row (blank knobs searched)."""
    with guard():
        from calibration.measurements import load_measurements
        from calibration.predict import predict_table
        from calibration.profile import load_profile_constants
        from calibration.rows import resolve_rows

        check_out_suffix(out)
        df = load_measurements(
            configs,
            skip_bad_rows=skip_bad_rows,
            purpose="predict",
            defaults=_defaults(hardware, model, dtype),
        )
        _warn_skipped(df, json_)
        rows = resolve_rows(df, hardware)
        consts = {}
        for rc in rows:
            if rc.hardware.name not in consts:
                consts[rc.hardware.name] = (
                    rc.hardware.constants
                    if profile is None
                    else load_profile_constants(profile, rc.hardware.name, rc.hardware.constants)
                )
        raw = pd.read_csv(configs, dtype=str, keep_default_na=False, skipinitialspace=True)
        table = predict_table(df, rows, consts, raw=raw)
        if out is not None:
            write_table(table, out)
        if json_:
            print_json({"rows": len(table), "predictions": table.to_dict(orient="records")})
            return
        show = [
            c
            for c in table.columns
            if c.startswith(("predicted_", "chosen_"))
            or c
            in ("model", "global_batch_size", "batch_size", "num_gpus", "world_size", "error_pct")
        ]
        console.print(rich_table(table[show], title=f"predictions for {configs.name}"))


try:
    from aisim.calibrate_import import import_colossal_command
except ImportError:  # the importer ships in its own module; the rest of the CLI works without it
    import_colossal_command = None
if import_colossal_command is not None:
    app.command("import-colossal")(import_colossal_command)
