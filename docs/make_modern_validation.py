"""Prints the modern-runs validation of docs/validation.md (H100, B200, MoE, long context, FP8).

Run: ``python docs/make_modern_validation.py [--holdout]``. For every row of
``calibration/data/modern_runs.csv`` with a model: measured and predicted seconds per step on the
shipped hardware preset (uncalibrated), the error, whether the model calls the run feasible,
and the leave-one-out error of the row's stack profile (``perfmodel/profiles/stacks``, fitted by
:func:`calibration.modern.fit_stack_profile`); then mean absolute errors by stack and group, the
FP8-over-BF16 speed-ups, the context-parallel throughput ratios and the predicted peak memory
against the published one. ``--holdout`` also evaluates
``modern_runs_holdout.csv`` (never fitted to). MFU is always against the BF16 peak.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calibration.modern import (
    HOLDOUT_CSV,
    MAIN_CSV,
    cp_ratios,
    evaluate_runs,
    fp8_ratios,
    load_modern_runs,
)

STACKS_DIR = Path(__file__).resolve().parents[1] / "perfmodel" / "profiles" / "stacks"


def _loo_by_run() -> dict[str, float]:
    out: dict[str, float] = {}
    for p in sorted(STACKS_DIR.glob("*.json")):
        doc = json.loads(p.read_text())
        for r in doc.get("fitted_to", []):
            out[r["csv"]] = r["held_out_error_pct"]
    return out


def _md(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        cells = []
        for c in cols:
            v = r[c]
            if isinstance(v, float | np.floating):
                cells.append(
                    "" if not np.isfinite(v) else f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}"
                )
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _memory_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per stack and hardware: rows with a published peak, the mean absolute and signed error
    of the predicted memory, and how many are within 20% (issue 15's target)."""
    m = df[np.isfinite(df.measured_memory_gib)].copy()
    m["mem_err_pct"] = 100.0 * (m.memory_gib / m.measured_memory_gib - 1.0)
    return (
        m.assign(abs_mem=m.mem_err_pct.abs())
        .groupby(["stack", "hardware"])
        .agg(
            rows=("label", "size"),
            mem_mae_pct=("abs_mem", "mean"),
            mem_bias_pct=("mem_err_pct", "mean"),
            within_20_pct=("abs_mem", lambda s: int((s <= 20.0).sum())),
        )
        .reset_index()
    )


def main(holdout: bool = False) -> None:
    runs, skipped = load_modern_runs(MAIN_CSV)
    df = evaluate_runs(runs)
    loo = _loo_by_run()
    df["loo_pct"] = [loo.get(f"calibration/data/{r.file}:{r.row}", np.nan) for r in runs]
    table = df[
        [
            "row",
            "label",
            "measured_s",
            "predicted_s",
            "error_pct",
            "feasible",
            "memory_gib",
            "measured_memory_gib",
            "loo_pct",
        ]
    ].rename(
        columns={
            "error_pct": "uncal. err %",
            "loo_pct": "stack LOO err %",
            "memory_gib": "pred. mem GiB",
            "measured_memory_gib": "meas. mem GiB",
        }
    )
    print("### Every row (uncalibrated = the shipped preset's constants)\n")
    print(_md(table))
    print("\n### Mean absolute error by stack, hardware and group\n")
    summ = (
        df.assign(abs_err=df.error_pct.abs(), abs_loo=df.loo_pct.abs())
        .groupby(["stack", "hardware", "group"])
        .agg(
            rows=("label", "size"),
            uncal_mae_pct=("abs_err", "mean"),
            uncal_bias_pct=("error_pct", "mean"),
            loo_mae_pct=("abs_loo", "mean"),
            infeasible=("feasible", lambda s: int((~s).sum())),
        )
        .reset_index()
    )
    print(_md(summ))
    print("\n### Peak memory where it is published (predicted with the preset's reserve)\n")
    print(_md(_memory_summary(df)))
    pred = df.predicted_s.to_numpy()
    print("\n### FP8-over-BF16 speed-up (BF16 step time / FP8 step time), uncalibrated\n")
    print(_md(fp8_ratios(runs, pred)))
    print("\n### Context parallelism: tokens/s per GPU relative to the series' shortest sequence\n")
    print(_md(cp_ratios(runs, pred)))
    if skipped:
        print("\n### Rows skipped\n")
        for label, why in skipped:
            print(f"- {label}: {why}")
    if holdout:
        h_runs, h_skipped = load_modern_runs(HOLDOUT_CSV)
        h = evaluate_runs(h_runs)
        print("\n### Holdout (modern_runs_holdout.csv, evaluated once, never fitted)\n")
        print(_md(h[["row", "label", "measured_s", "predicted_s", "error_pct", "feasible"]]))
        print(f"\nholdout mean abs error: {h.error_pct.abs().mean():.1f}% over {len(h)} rows")
        for label, why in h_skipped:
            print(f"- skipped {label}: {why}")


if __name__ == "__main__":
    main(holdout="--holdout" in sys.argv)
