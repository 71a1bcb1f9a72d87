"""The measure -> fit -> predict loop on CPU: time 12 real configurations, fit on half, predict the rest.

``aisim measure`` runs in a subprocess with ``XLA_FLAGS=--xla_force_host_platform_device_count=4``
(four XLA devices time-sliced on this host's cores, which the ``cpu-host`` preset declares), over
4-layer square MLPs of width 512 and 768, global batches 64 and 256, and dp 1, 2 and 4. The rows
are split like a checkerboard over (width, batch, dp), so that each half holds every width, batch
and dp, and every held-out row has fitted neighbours along each axis. ``aisim calibrate fit`` frees
the matmul efficiency curve, the per-kernel overhead, the intra-node link and the optimizer's time
factor on the fitted half only; ``aisim calibrate predict`` then predicts the held-out half from the profile, and the test
prints and bounds the held-out mean absolute percentage error.

Width 256 is left out on purpose: its per-device state (4 MiB with Adam) stays in the caches, where
XLA:CPU's memory-bound kernels and all-reduce run at a bandwidth per byte that one α-β bandwidth
and one memory roofline cannot follow (with widths 256 and 512, five quiet runs gave held-out
MAPEs of 9-29%, and 5-19% with the optimizer factor freed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from aisim.app import app

ROOT = Path(__file__).resolve().parents[2]
HIDDEN, BATCH, DP = (512, 768), (64, 256), (1, 2, 4)
FREE = (
    "matmul_efficiency_max,matmul_half_flops,kernel_overhead_s,"
    "link_bandwidth_efficiency.intra_node,link_latency_s.intra_node,optimizer_time_factor"
)
HELD_OUT_MAPE_LIMIT_PCT = 20.0


def _checkerboard(df: pd.DataFrame) -> np.ndarray:
    """True for the fitted half: an even sum of the (width, batch, dp) indices."""
    parity = (df["hidden_size"].map({h: i for i, h in enumerate(HIDDEN)})
              + df["global_batch_size"].map({b: i for i, b in enumerate(BATCH)})
              + df["dp"].map({d: i for i, d in enumerate(DP)}))  # fmt: skip
    return (parity % 2 == 0).to_numpy()


@pytest.mark.slow
def test_measure_fit_predict_held_out_half_on_four_host_devices(tmp_path):
    meas = tmp_path / "meas.csv"
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    cmd = [sys.executable, "-m", "aisim", "measure", "--model", "mlp-small", "--layers", "4",
           "--hidden", ",".join(map(str, HIDDEN)), "--global-batch", ",".join(map(str, BATCH)),
           "--dp", ",".join(map(str, DP)), "--steps", "2", "--rounds", "10", "--warmup", "2",
           "--statistic", "min", "--out", str(meas), "--json"]  # fmt: skip
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr
    df = pd.read_csv(meas)
    assert len(df) == 12
    assert set(df["hardware"]) == {"cpu-host"} and set(df["host_devices"]) == {4}
    assert set(df["platform"]) == {"cpu"} and (df["step_time_s"] == df["step_time_min_s"]).all()

    fitted = _checkerboard(df)
    assert fitted.sum() == 6
    fit_csv, held_csv, profile = tmp_path / "fit.csv", tmp_path / "held.csv", tmp_path / "p.json"
    df[fitted].to_csv(fit_csv, index=False)
    df[~fitted].to_csv(held_csv, index=False)

    runner = CliRunner()
    res = runner.invoke(app, ["calibrate", "fit", str(fit_csv), "--fit", FREE, "--out", str(profile),
                              "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["rows"] == 6 if isinstance(doc["rows"], int) else len(doc["rows"]) == 6

    pred_csv = tmp_path / "pred.csv"
    res = runner.invoke(app, ["calibrate", "predict", str(held_csv), "--profile", str(profile),
                              "--out", str(pred_csv), "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    pred = pd.read_csv(pred_csv)
    held = df[~fitted].reset_index(drop=True)
    # the error is recomputed from the raw columns, not taken from predict's own error_pct;
    # the predictions are float32, written with the digits they carry
    predicted = pred["predicted_step_time_s"].to_numpy(np.float32).astype(np.float64)
    err_pct = 100.0 * (predicted / held["step_time_s"].to_numpy() - 1.0)
    mape = float(np.mean(np.abs(err_pct)))
    table = held[["hidden_size", "global_batch_size", "dp", "step_time_s"]].assign(
        predicted_step_time_s=pred["predicted_step_time_s"], error_pct=err_pct.round(1)
    )
    print(
        f"\nfitted on 6 rows: in-sample MAPE {doc['in_sample_mape_pct']:.1f}%, "
        f"leave-one-out MAPE {doc['cv_mape_pct']:.1f}%"
    )
    print(table.to_string(index=False))
    print(f"held-out half (6 configurations): MAPE {mape:.1f}%, max {np.max(np.abs(err_pct)):.1f}%")
    np.testing.assert_allclose(pred["error_pct"].to_numpy(), err_pct, rtol=1e-6, atol=1e-6)
    assert mape < HELD_OUT_MAPE_LIMIT_PCT, table.to_string()
