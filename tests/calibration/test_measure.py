"""The measuring loop (:mod:`calibration.measure`): real timed flax steps, parameter counts,
rounds and statistics (the command line's `aisim measure`: tests/aisim/test_measure.py)."""

from __future__ import annotations

import numpy as np

from calibration.measure import Config, Shape, measure_many, measure_one


def test_measure_one_mlp_trains_and_counts_params():
    shape = Shape(kind="mlp", num_layers=2, hidden_size=16, bias=False)
    row = measure_one(shape, Config(dp=1, tp=1, global_batch_size=4), steps=2, warmup=1)
    assert row["num_params"] == 2 * 16 * 16  # bias-free square layers
    assert row["step_time_min_s"] <= row["step_time_s"] <= row["step_time_max_s"]
    assert np.isfinite(row["final_loss"])


def test_rounds_interleave_and_min_statistic():
    shape = Shape(kind="mlp", num_layers=2, hidden_size=16, bias=False)
    jobs = [(shape, Config(dp=1, tp=1, global_batch_size=b)) for b in (4, 8)]
    done = []
    rows = measure_many(jobs, steps=2, warmup=1, rounds=3, statistic="min", on_done=done.append)
    assert done == [0, 1] and [r["global_batch_size"] for r in rows] == [4, 8]
    for r in rows:
        assert r["rounds"] == 3 and r["statistic"] == "min"
        assert (
            r["step_time_s"]
            == r["step_time_min_s"]
            <= r["step_time_median_s"]
            <= r["step_time_max_s"]
        )
        assert r["host_devices"] >= 1 and r["host_cores"] >= 1 and r["platform"] == "cpu"
