"""The collaboration fit on the source's 2-client MLP table: the 30 given percentages within
1.5 pp RMS, the missing 40M row predicted between its neighbours, the source's total times
inconsistent with one round count, and known constants recovered from synthetic shares."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import collab
from collab.fit import fit_collab, load_collab_table
from perfmodel import load_hardware
from simbase.errors import AisimError

pytestmark = pytest.mark.slow  # module fixtures fit calibrations

SEED = Path(__file__).resolve().parents[2] / "calibration" / "data" / "seed_collab_mlp_2clients.csv"
A100 = load_hardware("a100-80gb")
CPU = load_hardware("cpu-host")
SCENARIO = collab.Scenario(hardware=(A100, A100), aggregator=CPU)
COLS = [
    f"client{i}_{c}"
    for c in ("compute_utilization_pct", "communication_share_pct", "serialization_share_pct")
    for i in (1, 2)
]


@pytest.fixture(scope="module")
def seed_fit():
    table = load_collab_table(SEED)
    return table, fit_collab(table, SCENARIO)


def test_seed_table_is_the_source_with_an_empty_40m_row(seed_fit):
    table, _ = seed_fit
    assert table.sizes == ["10M", "20M", "40M", "60M", "80M", "100M"]
    assert table.fitted.tolist() == [True, True, False, True, True, True]
    assert np.isfinite(table.shares).sum() == 30


def test_fit_reproduces_the_30_percentages_within_1_5_pp(seed_fit):
    table, fit = seed_fit
    assert fit.num_fitted_values == 30
    given = pd.read_csv(SEED).dropna(subset=["client1_compute_utilization_pct"])
    t = fit.table.dropna(subset=["given"])
    assert len(t) == 30
    for _, g in given.iterrows():
        for c in COLS:
            row = t[(t.model_params == g.model_params) & (t.column == c)]
            assert float(row.given.iloc[0]) == g[c]
    rms = float(np.sqrt(np.mean(t.error_pp**2)))
    assert rms == pytest.approx(fit.rms_error_pp, rel=1e-6)
    assert fit.rms_error_pp <= 1.5
    assert np.max(np.abs(t.error_pp)) < 4.0


def test_predicted_40m_row_lies_between_20m_and_60m(seed_fit):
    _, fit = seed_fit
    rows = fit.rows.set_index("model_params")
    given = pd.read_csv(SEED).set_index("model_params")
    for c in COLS:
        lo, hi = sorted((given.loc["20M", c], given.loc["60M", c]))
        assert lo < rows.loc["40M", c] < hi, (c, rows.loc["40M", c], lo, hi)


def test_total_times_are_inconsistent_with_one_round_count(seed_fit):
    _, fit = seed_fit
    implied = fit.rows.set_index("model_params")["implied_rounds"]
    steady = implied[["10M", "20M", "100M"]]
    assert steady.max() / steady.min() < 1.3  # these three agree on a round count ...
    assert (
        implied["60M"] > 5 * steady.max() and implied["80M"] > 25 * steady.max()
    )  # ... these do not


def test_fit_recovers_shares_of_known_constants():
    truth = collab.Scenario(
        hardware=(A100, A100),
        aggregator=CPU,
        overhead_s=(12.0, 6.0),
        aggregation_time_factor=8.0,
        up_bytes_per_s=(6e7,),
        local_samples=(60000, 30000),
    )
    sizes = ["10M", "20M", "60M", "80M", "100M"]
    df = collab.sweep_frame(truth, sizes)
    path = Path(__import__("tempfile").mkdtemp()) / "synthetic.csv"
    df[["model_params", *COLS]].to_csv(path, index=False)
    start = collab.Scenario(
        hardware=(A100, A100), aggregator=CPU, up_bytes_per_s=(6e7,), local_samples=(60000, 30000)
    )
    fit = fit_collab(load_collab_table(path), start)
    assert fit.rms_error_pp < 0.3


def test_bad_tables_fail_with_one_clear_message(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("model_params,client1_compute_utilization_pct\n10Q,50\n")
    with pytest.raises(AisimError, match=r"row 1: field 'model_params' = '10Q'"):
        load_collab_table(bad)
    bad.write_text("model_params,client1_compute_utilization_pct\n10M,150\n")
    with pytest.raises(AisimError, match=r"client1_compute_utilization_pct"):
        load_collab_table(bad)
    with pytest.raises(AisimError, match="the scenario has 3") as e:
        fit_collab(load_collab_table(SEED), collab.Scenario(hardware=(A100,) * 3, aggregator=CPU))
    assert (e.value.field, e.value.value) == ("clients", 3)
    assert e.value.render({"clients": "--clients"}).endswith("; pass --clients 2")
    with pytest.raises(AisimError) as e:
        load_collab_table(SEED, rounds=0)
    assert (e.value.source, e.value.field, e.value.value) == (None, "rounds", 0)
