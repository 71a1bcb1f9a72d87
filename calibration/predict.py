"""Predict each configuration row; search the knobs a row leaves blank with the grid engine.

Contract: :func:`predict_table` takes a normalised configuration table and constants (a preset's
or a calibrated profile's), and returns one row per input row with ``predicted_step_time_s``
(and, given a profile's covariance, its 90% interval ``step_time_s_lo``/``step_time_s_hi``),
``predicted_throughput_samples_per_s`` and ``predicted_tflops_per_gpu`` (model FLOPs,
6·N·tokens, per GPU: Colossal-AI's convention), ``predicted_feasible`` (fits memory and divides
evenly), and, where the row measured a value, ``error_pct`` = 100·(predicted/measured − 1) of the
step time. A knob of :data:`~calibration.rows.SEARCHABLE` whose column is present but whose
cell is blank is searched (``micro_batch_size`` also when neither it nor the microbatch count is
given): every combination of candidates that validates is evaluated in one
:func:`perfmodel.search.evaluate.evaluate_grid` call per row, the fastest feasible one wins, and its
value is written to ``chosen_<knob>``.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pandas as pd

from calibration.rows import SEARCHABLE, RowConfig, row_strategy
from perfmodel.plan.uncertainty import ConstantsCovariance, prediction_intervals
from perfmodel.search.evaluate import evaluate_grid, padded_to_power_of_two, stack_rows
from perfmodel.specs.choices import Recompute, ZeroStage
from perfmodel.specs.constants import Constants
from perfmodel.specs.strategy import Strategy
from simbase.errors import AisimError

MAX_MICRO_BATCH = 64


def _divisors(n: int, limit: int | None = None) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0 and (limit is None or d <= limit)]


def blank_knobs(rc: RowConfig) -> tuple[str, ...]:
    """The knobs this row leaves for the search."""
    blanks = list(rc.blank)
    k = rc.knobs
    if (
        "micro_batch_size" not in blanks
        and k["micro_batch_size"] is None
        and k["num_microbatches"] is None
    ):
        blanks.insert(0, "micro_batch_size")
    return tuple(blanks)


def _candidates(rc: RowConfig, knob: str) -> list[Any]:
    k = rc.knobs
    gpn = int(k["gpus_per_node"] or rc.hardware.spec.gpus_per_node)
    gpus = int(k["num_gpus"] or 1)
    if knob == "micro_batch_size":
        gbs = int(k["global_batch_size"] or 1)
        return _divisors(gbs, MAX_MICRO_BATCH)
    if knob == "recompute":
        return list(Recompute.labels())
    if knob == "zero_stage":
        return [int(z) for z in ZeroStage]
    if knob == "sequence_parallel":
        return [False, True]
    if knob == "tp":
        return _divisors(gpus, gpn)
    if knob == "pp":
        return _divisors(gpus)
    raise AisimError(
        source=rc.where,
        field=knob,
        expected="a knob that can be searched: " + ", ".join(SEARCHABLE),
    )


def row_grid(rc: RowConfig) -> tuple[list[dict[str, Any]], list[Strategy]]:
    """Every valid assignment of the blank knobs (one empty assignment when none is blank)."""
    blanks = blank_knobs(rc)
    combos, strategies = [], []
    first_error: AisimError | None = None
    for values in itertools.product(*(_candidates(rc, b) for b in blanks)):
        fill = dict(zip(blanks, values, strict=True))
        try:
            strategies.append(row_strategy(rc, **fill))
        except AisimError as e:
            first_error = first_error or e
            continue
        combos.append(fill)
    if not strategies:
        if first_error is not None and not blanks:
            raise first_error
        raise AisimError(
            f"{rc.where}: no value of the blank knobs {', '.join(blanks)} gives a valid strategy"
            + (f" (for example: {first_error})" if first_error else ""),
            source=rc.where,
            field=blanks[0] if len(blanks) == 1 else None,
            expected="a valid strategy for some value of the blank knobs " + ", ".join(blanks),
        )
    return combos, strategies


def _pad(strategies: list[Strategy]) -> tuple[Strategy, int]:
    # the grid length in size classes, so that a sweep compiles a few shapes
    return stack_rows(padded_to_power_of_two(strategies)), len(strategies)


def predict_rows(
    rows: list[RowConfig],
    consts: dict[str, Constants],
    cov: ConstantsCovariance | None = None,
) -> pd.DataFrame:
    """Predictions of each row under ``consts[hardware name]`` (see the module docstring); with
    ``cov`` (a profile's covariance), also the 90% prediction interval of the step time,
    ``step_time_s_lo`` and ``step_time_s_hi``
    (:func:`perfmodel.plan.uncertainty.prediction_intervals` of the chosen strategy)."""
    records = []
    for rc in rows:
        combos, strategies = row_grid(rc)
        grid, n = _pad(strategies)
        out = evaluate_grid(rc.model.spec, rc.hardware.spec, consts[rc.hardware.name], grid)
        t = np.asarray(out.step_time_s, np.float64)[:n]
        feasible = np.asarray(out.feasible, bool)[:n]
        score = np.where(feasible, t, np.inf)
        best = int(np.argmin(score)) if feasible.any() else int(np.argmin(t))
        rec: dict[str, Any] = {
            "predicted_step_time_s": t[best],
            "predicted_throughput_samples_per_s": float(
                np.asarray(out.throughput_samples_per_s)[best]
            ),
            "predicted_tflops_per_gpu": float(np.asarray(out.model_tflops_per_gpu)[best]),
            "predicted_mfu": float(np.asarray(out.mfu)[best]),
            "predicted_feasible": bool(feasible[best]),
            "candidates_searched": n if combos[0] else 0,
        }
        if cov is not None:
            m, hw, c = rc.model.spec, rc.hardware.spec, consts[rc.hardware.name]
            iv = prediction_intervals(m, hw, c, strategies[best], cov).get("step_time_s")
            if iv is not None:
                rec["step_time_s_lo"], rec["step_time_s_hi"] = iv.lo, iv.hi
        for knob, value in combos[best].items():
            rec[f"chosen_{knob}"] = value
        records.append(rec)
    return pd.DataFrame.from_records(records)


def predict_table(
    df: pd.DataFrame,
    rows: list[RowConfig],
    consts: dict[str, Constants],
    raw: pd.DataFrame | None = None,
    cov: ConstantsCovariance | None = None,
) -> pd.DataFrame:
    """Input columns (``raw``, the file as read, or ``df``) followed by the prediction columns
    (with ``cov``, the step time's interval: :func:`predict_rows`)."""
    pred = predict_rows(rows, consts, cov)
    if raw is not None and "source_row" in df:
        base = raw.iloc[df["source_row"].astype(int).to_numpy() - 1].reset_index(drop=True)
    else:
        base = df.drop(
            columns=[c for c in ("source_file", "has_measurement") if c in df]
        ).reset_index(drop=True)
    out = pd.concat([base, pred], axis=1)
    if "measured_step_time_s" in df:
        m = df["measured_step_time_s"].to_numpy(float)
        out["measured_step_time_s"] = m
        out["error_pct"] = 100.0 * (out["predicted_step_time_s"].to_numpy(float) / m - 1.0)
    return out
