"""Prints the published-runs validation of docs/validation.md.

Run: ``python docs/make_published_validation.py``. Every run of
``calibration/data/published_runs.csv`` is described by its stack name and the facts its source
prints (:mod:`calibration.public_runs`) and predicted four ways (:mod:`calibration.stacks`):
uncalibrated (the hardware preset's constants), with the shipped stack constants, leaving its
row out of the fit, and leaving its whole source out. Then: the intervals' coverage per source,
the runs called infeasible, the predicted peak memory against the published one, the FP8
speed-ups, the context-parallel ratios, the largest leave-one-source-out errors, and the holdout
file (never fitted to) with the shipped constants.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from calibration.public_runs import (
    HOLDOUT_CSV,
    MAIN_CSV,
    cp_ratios,
    evaluate_runs,
    fp8_ratios,
    load_published_runs,
)
from calibration.stacks import coverage, fit_stacks, summary


def _md(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        cells = []
        for c in cols:
            v = r[c]
            if isinstance(v, float | np.floating):
                cells.append(
                    "" if not np.isfinite(v) else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"
                )
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _memory(df: pd.DataFrame) -> pd.DataFrame:
    m = df[np.isfinite(df.measured_memory_gib)].copy()
    m["err"] = 100.0 * (m.memory_gib / m.measured_memory_gib - 1.0)
    return (
        m.assign(abs_err=m.err.abs())
        .groupby(["stack", "hardware"])
        .agg(
            runs=("label", "size"),
            mean_abs_error_pct=("abs_err", "mean"),
            mean_error_pct=("err", "mean"),
            within_20_pct=("abs_err", lambda s: int((s <= 20.0).sum())),
        )
        .reset_index()
    )


def main() -> None:
    runs, skipped = load_published_runs(MAIN_CSV)
    sf = fit_stacks(runs)
    shipped = evaluate_runs(runs)
    print("### Mean absolute error of the step time, by stack and hardware\n")
    print(_md(summary(sf.table)))
    print("\n### By stack and model kind\n")
    print(_md(summary(sf.table, by=("stack", "group"))))
    print("\n### 90% intervals of runs whose source was left out: share inside, per source\n")
    print(_md(coverage(sf)))
    infeasible = shipped[~shipped.feasible]
    print(f"\n### Runs called infeasible: {len(infeasible)} of {len(shipped)}\n")
    if len(infeasible):
        print(_md(infeasible[["label", "stack", "auto", "memory_gib"]]))
    print("\n### Peak memory where it is published (with the preset's reserve)\n")
    print(_md(_memory(shipped)))
    pred = shipped.predicted_s.to_numpy()
    print("\n### FP8-over-BF16 speed-up (BF16 step time / FP8 step time)\n")
    print(_md(fp8_ratios(runs, pred)))
    print("\n### Context parallelism: tokens/s per GPU relative to the series' shortest sequence\n")
    print(_md(cp_ratios(runs, pred)))
    worst = sf.table.assign(a=sf.table.loso_err_pct.abs()).sort_values("a", ascending=False)
    print("\n### The ten largest leave-one-source-out errors\n")
    print(_md(worst.head(10)[["label", "source", "loso_from", "fit_err_pct", "loso_err_pct"]]))
    if skipped:
        print("\n### Rows skipped\n")
        for label, why in skipped:
            print(f"- {label}: {why}")
    h_runs, h_skipped = load_published_runs(HOLDOUT_CSV)
    h = evaluate_runs(h_runs)
    print("\n### Holdout (published_runs_holdout.csv, never fitted to)\n")
    print(_md(h[["label", "stack", "measured_s", "predicted_s", "error_pct", "feasible"]]))
    print(f"\nholdout mean absolute error: {h.error_pct.abs().mean():.1f}% over {len(h)} runs")
    for label, why in h_skipped:
        print(f"- skipped {label}: {why}")


if __name__ == "__main__":
    main()
