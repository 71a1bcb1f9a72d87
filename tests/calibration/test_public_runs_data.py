"""The published-runs tables are internally consistent: every row's parallel degrees multiply to its
GPU count, and every derived step time is the formula its ``derivation`` cell names."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from calibration import data_path
from calibration.public_runs import HOLDOUT_CSV, MAIN_CSV

FILES = [MAIN_CSV.name, HOLDOUT_CSV.name]


@pytest.mark.parametrize("name", FILES)
def test_degrees_multiply_to_the_gpu_count(name):
    df = pd.read_csv(data_path(name))
    product = df.dp * df.tp * df.pp * df.cp
    assert (product == df.num_gpus).all(), df[product != df.num_gpus][["num_gpus", "dp", "tp"]]


@pytest.mark.parametrize("name", FILES)
def test_derived_step_times_follow_their_formula(name):
    df = pd.read_csv(data_path(name))
    derived = df[df.derivation.fillna("").str.startswith("step_time_s = global_batch_size")]
    assert len(derived) > 0
    expect = (
        derived.global_batch_size
        * derived.seq_len
        / (derived.tokens_per_s_per_gpu * derived.num_gpus)
    )
    np.testing.assert_allclose(derived.step_time_s, expect, rtol=1e-3)


@pytest.mark.parametrize("name", FILES)
def test_every_row_cites_its_source(name):
    df = pd.read_csv(data_path(name))
    assert df.source.notna().all() and (df.source.str.len() > 10).all()
