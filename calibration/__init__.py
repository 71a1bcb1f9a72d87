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

# `fit` and `objective` are both a function and a submodule of this package: imported here, so
# that the name is the function whichever is imported first
from calibration.fit import FitResult, fit
from calibration.objective import objective, predicted_step_time_s

# everything else is loaded on first use (PEP 562): `import calibration.profile` (as `aisim perf`
# does) then loads neither pandas nor the log readers, the fits' tables or the measuring loop
# (flax); nor does `python -m calibration.intervals` load its own module twice
_LAZY = {
    name: "calibration." + module
    for module, names in {
        "colossal": ("import_logs", "parse_log"),
        "measurements": (
            "InvalidRows",
            "data_path",
            "load_measurements",
            "normalise_measurements",
            "read_csv_cells",
        ),
        "parameterization": ("DEFAULT_FREE", "Parameterization", "parse_free"),
        "pipeline": ("MeasurementFit", "fit_measurements", "predict_measurements"),
        "predict": ("predict_rows", "predict_table"),
        "profile": (
            "PROFILE_SCHEMA",
            "load_profile_constants",
            "load_profile_covariance",
            "read_profile",
            "run_constants",
        ),
        "report": ("parity_plot",),
        "rows": (
            "RowBatch",
            "RowConfig",
            "build_batch",
            "measured_step_times",
            "resolve_rows",
            "row_strategy",
        ),
        "intervals": ("Coverage", "loo_coverage", "shipped_coverage"),
        "shapes": ("measured_shape",),
        "measure": (
            "COMPUTE_DTYPES",
            "STATISTICS",
            "Config",
            "Shape",
            "check_config",
            "hardware_for_devices",
            "measure_many",
            "measure_one",
            "shape_columns",
        ),
    }.items()
    for name in names
}
_LAZY["import_training_logs"] = "calibration.logs"  # there named import_logs
_RENAMED = {"import_training_logs": "import_logs"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), _RENAMED.get(name, name))
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
