"""Whole calibrations: a measurement table in, a fit with its reports (or predictions) out.

Contract: :func:`fit_measurements` fits the constants of one hardware to the measured rows of a
normalised table (``calibration.measurements``) and returns a :class:`MeasurementFit`, which
holds the :class:`~calibration.fit.FitResult`, the rows it saw and the hash of what it saw, and
builds the report documents (``document()``, ``profile()``; deterministic JSON text with
``*_text()``). :func:`predict_measurements` predicts every row of a configuration table under a
hardware preset's constants or a calibrated profile's. Nothing here prints or writes files.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import pandas as pd

from calibration import report
from calibration.fit import FitResult, fit
from calibration.parameterization import parse_free
from calibration.predict import predict_table
from calibration.profile import load_profile_constants, load_profile_covariance
from calibration.rows import RowConfig, build_batch, measured_step_times, resolve_rows
from perfmodel.specs.constants import Constants
from perfmodel.specs.hardware import load_hardware
from simbase.errors import bad_value
from simbase.parse import check_seed


@dataclasses.dataclass(frozen=True)
class MeasurementFit:
    """A fit of one hardware's constants to a measurement table, and what its reports need.

    Attributes:
      result: the fit (values, uncertainties, per-row and held-out errors).
      table: the fitted rows of the normalised table (those with a measured value).
      rows: the resolved rows, in the order of ``table``.
      hardware: the hardware preset's name.
      data_sha256: the hash of what the fit saw (:func:`calibration.report.data_sha256`).
      seed: the seed of the k-fold split.
      skipped: the messages of the rows the loader skipped (``table.attrs['skipped']``).
    """

    result: FitResult
    table: pd.DataFrame
    rows: tuple[RowConfig, ...]
    hardware: str
    data_sha256: str
    seed: int
    skipped: tuple[str, ...] = ()

    def row_table(self) -> pd.DataFrame:
        """Per fitted row: source row, model, measured, predicted, error %, held-out values."""
        return report.row_table(self.table, self.result)

    def constants_table(self) -> pd.DataFrame:
        """The fitted constants, one row each: ``constant``, ``value`` and ``stddev`` (SI units,
        1σ from the Hessian; NaN where there is none)."""
        fitted = report.constants_with_uncertainty(self.result)
        sd = {k: np.nan if v["stddev"] is None else v["stddev"] for k, v in fitted.items()}
        rows = [{"constant": k, "value": v["value"], "stddev": sd[k]} for k, v in fitted.items()]
        return pd.DataFrame(rows)

    def document(self) -> dict[str, Any]:
        """The fit's report (held-out error first; see :func:`calibration.report.fit_document`)."""
        return report.fit_document(
            self.table,
            self.result,
            hardware=self.hardware,
            data_sha=self.data_sha256,
            seed=self.seed,
            skipped=list(self.skipped),
        )

    def profile(self) -> dict[str, Any]:
        """The calibrated profile (schema ``aisim.profile/1``) of the fitted constants."""
        return report.profile_document(
            self.result, hardware=self.hardware, data_sha=self.data_sha256, seed=self.seed
        )

    def document_text(self) -> str:
        """:meth:`document` as deterministic JSON text (the same data and seed, the same bytes)."""
        return report.dumps(self.document())

    def profile_text(self) -> str:
        """:meth:`profile` as deterministic JSON text."""
        return report.dumps(self.profile())


def _source_of(df: pd.DataFrame, source: str | None) -> str:
    if source is not None:
        return source
    if "source_file" in df.columns and len(df):
        return str(df["source_file"].iloc[0])
    return "<table>"


def _one_hardware(rows: list[RowConfig], hardware: str | None, source: str) -> str:
    """The single hardware the rows ran on (a profile is for one hardware)."""
    names = sorted({rc.hardware.name for rc in rows})
    if len(names) > 1:
        raise bad_value(
            source,
            "hardware",
            ", ".join(names),
            "one hardware: a profile is for one hardware",
            hint="split the file, or pass {hardware} for blank cells",
        )
    name = rows[0].hardware.name
    if hardware is not None and name != load_hardware(hardware).name:
        raise bad_value(
            source,
            "hardware",
            name,
            f"{hardware!r}, the hardware asked for",
            hint="leave {hardware} out to fit the file's",
        )
    return name


def fit_measurements(
    df: pd.DataFrame,
    *,
    hardware: str | None = None,
    free: str | list[str] | None = None,
    seed: int = 0,
    cross_validate: bool = True,
    source: str | None = None,
) -> MeasurementFit:
    """Fits the constants of one hardware to the measured rows of a normalised table.

    Args:
      df: a table from :func:`calibration.load_measurements` (rows without a measured value
        are left out).
      hardware: the hardware preset of rows that name none; rows naming another are an error.
      free: the constants to free (:func:`calibration.parse_free`; ``None``: the defaults).
      seed: draws the k-fold split of the cross-validation (leave-one-out does not use it).
      cross_validate: skip the held-out fits when False.
      source: the table's name in messages (default: its ``source_file``).

    Returns:
      A :class:`MeasurementFit`.

    Raises:
      AisimError: no measured row, rows on several hardware (or not on ``hardware``), an
        unknown constant name (``field`` ``free``), or a row whose strategy is invalid.
    """
    check_seed(seed)
    source = _source_of(df, source)
    measured = df[df["has_measurement"].to_numpy(bool)] if "has_measurement" in df else df
    measured = measured.reset_index(drop=True)
    measured.attrs = dict(df.attrs)
    t = measured_step_times(measured, source)
    rows = resolve_rows(measured, hardware)
    hw_name = _one_hardware(rows, hardware, source)
    param = parse_free(free, rows[0].hardware.constants)
    batch = build_batch(rows)
    result = fit(param, batch, t, seed=seed, cross_validate=cross_validate)
    return MeasurementFit(
        result=result,
        table=measured,
        rows=tuple(rows),
        hardware=hw_name,
        data_sha256=report.data_sha256(rows, batch.strategies, t),
        seed=seed,
        skipped=tuple(df.attrs.get("skipped", ())),
    )


def row_constants(
    rows: list[RowConfig], profile: str | os.PathLike | None = None
) -> dict[str, Constants]:
    """Hardware name -> constants for each hardware of ``rows``: the preset's, or a calibrated
    profile's over them (a profile fitted for other hardware is an error)."""
    consts: dict[str, Constants] = {}
    for rc in rows:
        name = rc.hardware.name
        if name not in consts:
            base = rc.hardware.constants
            consts[name] = base if profile is None else load_profile_constants(profile, name, base)
    return consts


def predict_measurements(
    df: pd.DataFrame,
    *,
    hardware: str | None = None,
    profile: str | os.PathLike | None = None,
    raw: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Predicts every row of a normalised configuration table; blank knobs are searched.

    Args:
      df: a table from :func:`calibration.load_measurements`.
      hardware: the hardware preset of rows that name none.
      profile: a calibrated profile JSON (``None``: the presets' constants).
      raw: the file as read (:func:`calibration.read_csv_cells`), whose columns lead the output.

    Returns:
      The table of :func:`calibration.predict.predict_table`; with a profile that carries a
      covariance, rows also have the step time's 90% interval (``step_time_s_lo``,
      ``step_time_s_hi``).

    Raises:
      AisimError: an unknown preset, a profile for other hardware, or a row with no valid
        strategy.
    """
    rows = resolve_rows(df, hardware)
    cov = None if profile is None else load_profile_covariance(profile)
    return predict_table(df, rows, row_constants(rows, profile), raw=raw, cov=cov)
