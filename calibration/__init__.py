"""calibration: fit aisim's constants to measured runs, and predict configurations.

Public API:

- **Measurement tables** (the CSV schema of DESIGN.md, aliases accepted):
  :func:`load_measurements`, :func:`normalise_measurements`, :func:`read_csv_cells`,
  :func:`data_path` (the CSVs shipped in ``calibration/data``), :class:`InvalidRows` (the error
  listing every bad cell).
- **Fit and predict a table**: :func:`fit_measurements` -> :class:`MeasurementFit` (the
  :class:`FitResult`, its per-row table, report and profile documents),
  :func:`predict_measurements`; :func:`parity_plot` draws predicted against measured.
- **The pieces**: :class:`Parameterization`, :func:`parse_free` and :data:`DEFAULT_FREE` (the
  constants to free); :func:`resolve_rows`, :func:`row_strategy`, :func:`build_batch`,
  :func:`measured_step_times` (rows as stacked pytrees); :func:`objective`,
  :func:`predicted_step_time_s`; :func:`fit` -> :class:`FitResult`; :func:`predict_table`,
  :func:`predict_rows`.
- **Profiles**: :func:`read_profile`, :func:`load_profile_constants`, :data:`PROFILE_SCHEMA`;
  :func:`load_profile_covariance` (the fitted constants' covariance, for prediction intervals);
  :func:`run_constants` (a run's constants: a profile's, else its stack's on the hardware).
- **Checking the intervals**: :func:`loo_coverage` -> :class:`Coverage` (fit without each row,
  predict it with its interval), :func:`shipped_coverage` (on the shipped measurement sets).
- **Sources of measurements**: :func:`import_logs` and :func:`parse_log` (Colossal-AI benchmark
  logs); :func:`import_training_logs` (Megatron-LM, torchtitan, DeepSpeed and every Colossal-AI
  generation, with provenance: :func:`calibration.logs.import_logs`); :func:`measure_many`,
  :func:`measure_one`, :class:`Shape`, :class:`Config`, :func:`check_config`,
  :func:`hardware_for_devices`, :func:`shape_columns` and :func:`measured_shape` (a preset's
  shape to time, with overrides): time real flax training steps here; imported on first use,
  as they load flax.
"""

from calibration.colossal import import_logs, parse_log
from calibration.fit import FitResult, fit
from calibration.logs import import_logs as import_training_logs
from calibration.measurements import (
    InvalidRows,
    data_path,
    load_measurements,
    normalise_measurements,
    read_csv_cells,
)
from calibration.objective import objective, predicted_step_time_s
from calibration.parameterization import DEFAULT_FREE, Parameterization, parse_free
from calibration.pipeline import (
    MeasurementFit,
    fit_measurements,
    predict_measurements,
)
from calibration.predict import predict_rows, predict_table
from calibration.profile import (
    PROFILE_SCHEMA,
    load_profile_constants,
    load_profile_covariance,
    read_profile,
    run_constants,
)
from calibration.report import parity_plot
from calibration.rows import (
    RowBatch,
    RowConfig,
    build_batch,
    measured_step_times,
    resolve_rows,
    row_strategy,
)

# the measuring loop imports flax: loaded on first use (PEP 562), so `import calibration` stays light
# (and the coverage check too, so that `python -m calibration.intervals` runs it cleanly)
_LAZY = {name: "calibration.intervals" for name in ("Coverage", "loo_coverage", "shipped_coverage")}
_LAZY["measured_shape"] = "calibration.shapes"
_LAZY |= {
    name: "calibration.measure"
    for name in (
        "COMPUTE_DTYPES",
        "STATISTICS",
        "Config",
        "Shape",
        "check_config",
        "hardware_for_devices",
        "measure_many",
        "measure_one",
        "shape_columns",
    )
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'calibration' has no attribute {name!r}")


__all__ = [
    "COMPUTE_DTYPES",
    "DEFAULT_FREE",
    "PROFILE_SCHEMA",
    "STATISTICS",
    "Coverage",
    "Config",
    "FitResult",
    "InvalidRows",
    "MeasurementFit",
    "Parameterization",
    "RowBatch",
    "RowConfig",
    "Shape",
    "build_batch",
    "check_config",
    "data_path",
    "fit",
    "fit_measurements",
    "hardware_for_devices",
    "import_logs",
    "import_training_logs",
    "load_measurements",
    "load_profile_constants",
    "load_profile_covariance",
    "loo_coverage",
    "measure_many",
    "measure_one",
    "measured_shape",
    "measured_step_times",
    "normalise_measurements",
    "objective",
    "parity_plot",
    "parse_free",
    "parse_log",
    "predict_measurements",
    "predict_rows",
    "predict_table",
    "predicted_step_time_s",
    "read_csv_cells",
    "read_profile",
    "resolve_rows",
    "row_strategy",
    "run_constants",
    "shape_columns",
    "shipped_coverage",
]
