"""Predict: known rows equal the step model; blank knobs are searched and the best is named."""

import numpy as np
import pandas as pd
import pytest

from calibration.measurements import normalise_measurements
from calibration.predict import predict_table
from calibration.rows import resolve_rows, row_strategy
from perfmodel.step.step_time import step_time


def _rows(recs):
    df = normalise_measurements(pd.DataFrame(recs), purpose="predict")
    return df, resolve_rows(df)


@pytest.mark.slow
def test_full_rows_equal_step_time_and_blank_micro_batch_is_searched():
    recs = [
        dict(
            model="gpt3-1.3b",
            hardware="a100-80gb",
            num_gpus=8,
            tp=2,
            pp=1,
            micro_batch_size=4,
            global_batch_size=64,
            dtype="bf16",
        ),
        dict(
            model="gpt3-1.3b",
            hardware="a100-80gb",
            num_gpus=8,
            tp=2,
            pp=1,
            micro_batch_size=None,
            global_batch_size=64,
            dtype="bf16",
        ),
    ]
    df, rows = _rows(recs)
    out = predict_table(df, rows, {"a100-80gb": rows[0].hardware.constants})
    c = rows[0].hardware.constants
    direct = float(
        step_time(rows[0].model.spec, rows[0].hardware.spec, c, row_strategy(rows[0])).step_time_s
    )
    assert np.isclose(out["predicted_step_time_s"][0], direct, rtol=1e-5)
    assert np.isclose(out["predicted_throughput_samples_per_s"][0], 64 / direct, rtol=1e-5)
    chosen = int(out["chosen_micro_batch_size"][1])
    assert 64 // 4 % chosen == 0  # a divisor of the per-replica batch
    # the search's winner is no slower than any candidate, including the row above (mbs 4)
    for mbs in (1, 2, 4, 8, 16):
        s = row_strategy(rows[1], micro_batch_size=mbs)
        b = step_time(rows[1].model.spec, rows[1].hardware.spec, c, s)
        if bool(b.feasible):
            assert out["predicted_step_time_s"][1] <= float(b.step_time_s) * (1 + 1e-6)
    assert out["predicted_tflops_per_gpu"].gt(0).all()


def test_blank_recompute_prefers_what_fits_memory():
    recs = [
        dict(
            model="gpt3-13b",
            hardware="a100-40gb",
            num_gpus=8,
            tp=8,
            pp=1,
            micro_batch_size=8,
            global_batch_size=64,
            recompute=None,
            dtype="bf16",
        )
    ]
    df, rows = _rows(recs)
    out = predict_table(df, rows, {"a100-40gb": rows[0].hardware.constants})
    assert out["chosen_recompute"][0] in ("none", "selective", "full")
    assert bool(out["predicted_feasible"][0])
