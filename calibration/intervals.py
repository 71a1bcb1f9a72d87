"""The covariance a fit leaves in its profile, and an honest check of the intervals it gives.

Contract: the fit (:func:`calibration.fit.constants_covariance`) maps its raw-space covariance
``Cov(θ) ≈ σ²/N · H⁻¹`` to the constants the model reads, by the delta
method ``Cov(x) = J Cov(θ) Jᵀ`` with ``J = ∂x/∂θ``; a shorthand such as ``efficiency`` (one logit
shift of several fields) is expanded into the fields it moves, so that the covariance is over
plain :class:`~perfmodel.specs.constants.Constants` entries and :mod:`perfmodel.plan.uncertainty` can use it
without knowing the parameterization. :func:`loo_coverage` fits without each row in turn,
predicts the row with its interval, and counts how often the measurement falls inside.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from calibration.fit import fit_covariance, solve
from calibration.objective import predicted_step_time_s
from calibration.parameterization import Parameterization
from calibration.rows import RowBatch
from perfmodel.plan.uncertainty import (
    DEFAULT_LEVEL,
    entry_values,
    log_interval,
    with_entries,
)


def log_time_jacobian(batch: RowBatch, c, entries: tuple[str, ...]) -> np.ndarray:
    """``∂ log t_i / ∂ x`` of every row's predicted step time, shape ``(n, p)`` (forward mode
    through the same vmapped step function the fit uses)."""
    x0 = entry_values(c, entries)
    jac = jax.jacfwd(lambda x: jnp.log(predicted_step_time_s(batch, with_entries(c, entries, x))))
    return np.asarray(jac(x0), np.float64)


@dataclasses.dataclass(frozen=True)
class Coverage:
    """Leave-one-out coverage of the prediction intervals.

    Attributes:
      level: the nominal probability of each interval.
      inside: per row, whether the measurement fell inside the interval of the fit without it.
      lo_s, hi_s, predicted_s, measured_s: per row, seconds.
    """

    level: float
    inside: np.ndarray
    lo_s: np.ndarray
    hi_s: np.ndarray
    predicted_s: np.ndarray
    measured_s: np.ndarray

    @property
    def rate(self) -> float:
        """The fraction of rows inside their interval."""
        return float(np.mean(self.inside)) if self.inside.size else float("nan")


def loo_coverage(
    param: Parameterization, batch: RowBatch, measured_s: np.ndarray, level: float = DEFAULT_LEVEL
) -> Coverage:
    """Fits without each row, predicts it with its ``level`` interval, and records whether the
    measurement is inside (rows whose held-out fit has no residual degree of freedom left are
    skipped: no interval exists there).

    Args:
      param: the constants to free.
      batch: the rows (:func:`calibration.rows.build_batch`).
      measured_s: measured seconds per step, shape ``(n,)``.
      level: the intervals' probability.
    """
    measured_s = np.asarray(measured_s, np.float64)
    n = len(measured_s)
    inside, lo, hi, pred, meas = [], [], [], [], []
    for i in range(n):
        w = np.ones(n, np.float32)
        w[i] = 0.0
        raw, _ = solve(param, batch, measured_s, w)
        cov = fit_covariance(param, batch, measured_s, raw, w)
        if cov is None:
            continue
        c = param.constants(raw)
        t = float(np.asarray(predicted_step_time_s(batch, c))[i])
        g = log_time_jacobian(batch, c, cov.entries)[i]
        iv = log_interval(t, g, cov, level)
        inside.append(iv.lo <= measured_s[i] <= iv.hi)
        lo.append(iv.lo)
        hi.append(iv.hi)
        pred.append(t)
        meas.append(measured_s[i])
    return Coverage(
        level=level,
        inside=np.asarray(inside, bool),
        lo_s=np.asarray(lo),
        hi_s=np.asarray(hi),
        predicted_s=np.asarray(pred),
        measured_s=np.asarray(meas),
    )


SHIPPED_SETS = (
    "korthikanti2022_table5_iteration_time.csv",
    "narayanan2021_table1_weak_scaling.csv",
)


def shipped_coverage(level: float = DEFAULT_LEVEL) -> dict[str, Coverage]:
    """:func:`loo_coverage` of the default free constants on each shipped measurement set."""
    from calibration.measurements import data_path, load_measurements
    from calibration.parameterization import parse_free
    from calibration.rows import build_batch, measured_step_times, resolve_rows

    out = {}
    for name in SHIPPED_SETS:
        df = load_measurements(data_path(name))
        if "has_measurement" in df:
            df = df[df["has_measurement"].to_numpy(bool)].reset_index(drop=True)
        t = measured_step_times(df, name)
        rows = resolve_rows(df, None)
        param = parse_free(None, rows[0].hardware.constants)
        out[name] = loo_coverage(param, build_batch(rows), t, level)
    return out


def main() -> None:
    """``python -m calibration.intervals``: prints the leave-one-out coverage of the 90%
    prediction intervals on the shipped measurement sets."""
    results = shipped_coverage()
    inside = total = 0
    for name, cov in results.items():
        k, n = int(cov.inside.sum()), int(cov.inside.size)
        inside, total = inside + k, total + n
        width = float(np.median(cov.hi_s / cov.lo_s)) if n else float("nan")
        print(
            f"{name}: {k}/{n} held-out rows inside their {cov.level:.0%} interval "
            f"(median hi/lo {width:.2f})"
        )
    print(f"all: {inside}/{total} = {inside / max(total, 1):.0%} (nominal {DEFAULT_LEVEL:.0%})")


if __name__ == "__main__":
    main()
