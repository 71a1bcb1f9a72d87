"""Reports of a fit: the per-row table, the JSON document, the profile and the parity plot.

Contract: everything here is a function of a :class:`~calibration.fit.FitResult` and the rows;
:func:`dumps` writes JSON with sorted keys and floats rounded to :data:`SIGNIFICANT` digits, so
the same data and seed give the same bytes. :func:`data_sha256` hashes what the fit saw (each
row's model dimensions, strategy leaves and measured time, as float32 text), not the CSV's
spelling, so renaming a column alias does not change it.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibration.fit import FitResult
from calibration.profile import PROFILE_SCHEMA
from calibration.rows import RowConfig
from perfmodel.specs.constants import constants_to_dict
from perfmodel.specs.strategy import Strategy, leaves_of

SIGNIFICANT = 7


def _round(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_round(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float):
        if not math.isfinite(x):
            return None
        return float(f"{x:.{SIGNIFICANT}g}")
    return x


def dumps(doc: dict[str, Any]) -> str:
    """Deterministic JSON text (sorted keys, rounded floats, NaN as null, trailing newline)."""
    return json.dumps(_round(doc), sort_keys=True, indent=2) + "\n"


def data_sha256(
    rows: list[RowConfig], strategies: tuple[Strategy, ...], measured_s: np.ndarray
) -> str:
    """sha256 of the normalised rows: model leaves, strategy leaves, measured seconds."""
    h = hashlib.sha256()
    for rc, s, t in zip(rows, strategies, measured_s, strict=True):
        spec = rc.model.spec
        static = ("kind", "moe", "mla")
        leaves = [
            float(np.float32(getattr(spec, f)))
            for f in spec.__dataclass_fields__
            if f not in static
        ]
        leaves += [float(np.float32(v)) for v in leaves_of(s).values()]
        stack = s.stack.to_dict()
        h.update(
            f"{rc.hardware.name}|{spec.kind}|{leaves!r}|{stack!r}|{float(np.float32(t))!r}\n".encode()
        )
    return h.hexdigest()


def row_table(df: pd.DataFrame, result: FitResult) -> pd.DataFrame:
    """Per fitted row: where it came from, measured, predicted, error %, held-out prediction."""
    out = pd.DataFrame(
        {
            "source_row": df["source_row"].to_numpy()
            if "source_row" in df
            else np.arange(1, len(df) + 1),
            "model": df["model"].to_numpy() if "model" in df else "",
            "measured_step_time_s": result.measured_s,
            "predicted_step_time_s": result.predicted_s,
            "error_pct": result.error_pct,
            "cv_predicted_step_time_s": result.cv_predicted_s,
            "cv_error_pct": result.cv_error_pct,
        }
    )
    return out


def constants_with_uncertainty(result: FitResult) -> dict[str, dict[str, float | None]]:
    """``{entry: {"value": x, "stddev": σ}}`` for each free entry (SI units)."""
    return {k: {"value": result.values[k], "stddev": result.stddev[k]} for k in result.free}


def fit_document(
    df: pd.DataFrame,
    result: FitResult,
    *,
    hardware: str,
    data_sha: str,
    seed: int,
    skipped: list[str],
) -> dict[str, Any]:
    """The ``aisim calibrate fit --json`` document (held-out error first in the summary)."""
    table = row_table(df, result)
    return {
        "cv_method": result.cv_method,
        "cv_mape_pct": result.cv_mape_pct,
        "cv_max_error_pct": result.cv_max_error_pct,
        "in_sample_mape_pct": result.in_sample_mape_pct,
        "in_sample_max_error_pct": result.in_sample_max_error_pct,
        "hardware": hardware,
        "fitted": list(result.free),
        "constants": constants_with_uncertainty(result),
        "all_constants": constants_to_dict(result.constants),
        "rows": len(table),
        "per_row": [
            {k: (v.item() if isinstance(v, np.generic) else v) for k, v in r.items()}
            for r in table.to_dict(orient="records")
        ],
        "skipped_rows": list(skipped),
        "data_sha256": data_sha,
        "seed": seed,
        "loss": result.loss,
    }


def profile_document(
    result: FitResult, *, hardware: str, data_sha: str, seed: int
) -> dict[str, Any]:
    """A calibrated profile (schema ``aisim.profile/1``) of the fitted constants."""
    from simbase import version

    return {
        "schema": PROFILE_SCHEMA,
        "hardware": hardware,
        "constants": constants_to_dict(result.constants),
        "fitted": list(result.free),
        "uncertainty": {k: result.stddev[k] for k in result.free},
        **({} if result.covariance is None else {"covariance": result.covariance.to_dict()}),
        "data_sha256": data_sha,
        "rows": len(result.measured_s),
        "seed": seed,
        "fit": {
            "cv_method": result.cv_method,
            "cv_mape_pct": result.cv_mape_pct,
            "in_sample_mape_pct": result.in_sample_mape_pct,
            "in_sample_max_error_pct": result.in_sample_max_error_pct,
        },
        "created_by": f"aisim {version()}",
    }


def parity_plot(
    measured_s: np.ndarray,
    predicted_s: np.ndarray,
    path: str | Path,
    *,
    title: str = "",
    cv_predicted_s: np.ndarray | None = None,
) -> None:
    """Predicted against measured step time, log-log, with the y = x line and ±10% bands (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.8, 4.4), dpi=120)
    m = np.asarray(measured_s, float)
    lo, hi = float(np.min(m)) / 1.6, float(np.max(m)) * 1.6
    xs = np.geomspace(lo, hi, 50)
    ax.plot(xs, xs, color="0.3", lw=1, label="y = x")
    ax.fill_between(xs, xs / 1.1, xs * 1.1, color="0.85", label="±10%")
    if cv_predicted_s is not None and np.isfinite(cv_predicted_s).any():
        ax.scatter(
            m, cv_predicted_s, marker="x", color="tab:orange", label="held out (CV)", zorder=3
        )
    ax.scatter(m, predicted_s, color="tab:blue", label="fitted", zorder=4, s=18)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    tmp = Path(str(path) + ".tmp.png")
    fig.savefig(tmp, metadata={"Software": None})
    plt.close(fig)
    tmp.replace(path)
