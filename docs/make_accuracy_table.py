"""Prints the README's accuracy table of the step model against Korthikanti et al. 2022 Table 5.

Run: ``python docs/make_accuracy_table.py``. Uncalibrated: the shipped A100-80GB preset only.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pandas as pd

from calibration import load_measurements
from perfmodel import load_hardware, load_model, make_strategy, step_time

ROOT = Path(__file__).resolve().parents[1]


def korthikanti_rows() -> pd.DataFrame:
    """One row per Table 5 measurement with aisim's uncalibrated prediction and error."""
    df = load_measurements(
        ROOT / "calibration" / "data" / "korthikanti2022_table5_iteration_time.csv"
    )
    hw = load_hardware("a100-80gb")
    fn = jax.jit(step_time)
    out = []
    for r in df.itertuples():
        m = load_model(r.model).spec
        s = make_strategy(
            dp=int(r.dp),
            tp=int(r.tp),
            pp=int(r.pp),
            micro_batch_size=int(r.micro_batch_size),
            num_microbatches=int(r.global_batch_size) // (int(r.micro_batch_size) * int(r.dp)),
            interleave=int(r.interleave),
            schedule="interleaved" if int(r.interleave) > 1 else "1f1b",
            recompute=r.recompute,
            sequence_parallel=bool(r.sequence_parallel),
        )
        pred = float(fn(m, hw.spec, hw.constants, s).step_time_s)
        out.append(
            {
                "model": r.model,
                "gpus": int(r.num_gpus),
                "tp": int(r.tp),
                "pp": int(r.pp),
                "recompute": r.recompute,
                "sequence_parallel": bool(r.sequence_parallel),
                "measured_s": r.measured_step_time_s,
                "aisim_s": pred,
                "error_pct": 100 * (pred / r.measured_step_time_s - 1),
            }
        )
    return pd.DataFrame(out)


def main() -> None:
    df = korthikanti_rows()
    print("| model | GPUs | tp | pp | recompute | SP | measured (s) | aisim (s) | error |")
    print("| --- | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: |")
    for r in df.itertuples():
        print(
            f"| {r.model} | {r.gpus} | {r.tp} | {r.pp} | {r.recompute} | {'yes' if r.sequence_parallel else 'no'} "
            f"| {r.measured_s:.2f} | {r.aisim_s:.2f} | {r.error_pct:+.1f}% |"
        )
    e = np.abs(df.error_pct)
    print(f"\nmean absolute error {e.mean():.2f}%, max {e.max():.2f}% (8 rows, uncalibrated)")


if __name__ == "__main__":
    main()
