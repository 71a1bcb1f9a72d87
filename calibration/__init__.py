"""calibration: fit aisim's constants to measured runs, and predict configurations.

Public API: load and normalise measurements, parameterise the free constants, fit, predict.
"""

from calibration.collab_fit import CollabFit, fit_collab, load_collab_table
from calibration.fit import FitResult, fit
from calibration.measurements import load_measurements, normalise_measurements
from calibration.objective import objective, predicted_step_time_s
from calibration.parameterization import Parameterization, parse_free
from calibration.predict import predict_rows, predict_table
from calibration.profile import PROFILE_SCHEMA, load_profile_constants, read_profile
from calibration.rows import build_batch, resolve_rows

__all__ = [
    "CollabFit",
    "FitResult",
    "PROFILE_SCHEMA",
    "Parameterization",
    "build_batch",
    "fit",
    "fit_collab",
    "load_collab_table",
    "load_measurements",
    "load_profile_constants",
    "normalise_measurements",
    "objective",
    "parse_free",
    "predict_rows",
    "predict_table",
    "predicted_step_time_s",
    "read_profile",
    "resolve_rows",
]
