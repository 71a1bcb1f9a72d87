"""The whole-table calls: fit_measurements and predict_measurements equal the pieces they chain,
and their errors are data (source, field, value, hint) that name no command-line flag."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import calibration
from calibration import (
    build_batch,
    data_path,
    fit,
    fit_measurements,
    load_measurements,
    normalise_measurements,
    parse_free,
    predict_measurements,
    predict_table,
    resolve_rows,
)
from simbase.errors import AisimError

KORT = data_path("korthikanti2022_table5_iteration_time.csv")


@pytest.mark.slow
def test_fit_measurements_is_the_fit_of_its_rows():
    df = load_measurements(KORT, purpose="fit")
    run = fit_measurements(df, seed=0, cross_validate=False)
    rows = resolve_rows(df)
    t = df["measured_step_time_s"].to_numpy(float)
    ref = fit(parse_free(None, rows[0].hardware.constants), build_batch(rows), t, seed=0,
              cross_validate=False)  # fmt: skip
    np.testing.assert_allclose(run.result.predicted_s, ref.predicted_s, rtol=1e-6)
    assert run.hardware == "a100-80gb" and len(run.data_sha256) == 64
    assert run.row_table()["source_row"].tolist() == list(range(1, 9))
    prof = run.profile()
    assert prof["schema"] == calibration.PROFILE_SCHEMA and prof["rows"] == 8
    assert run.profile_text() == run.profile_text()  # deterministic text
    assert run.document()["fitted"] == list(run.result.free)


def test_predict_measurements_is_predict_table_under_the_presets():
    df = load_measurements(KORT, purpose="predict")
    rows = resolve_rows(df)
    ref = predict_table(df, rows, {rows[0].hardware.name: rows[0].hardware.constants})
    got = predict_measurements(df)
    pd.testing.assert_frame_equal(got, ref)


def _table(text: str) -> pd.DataFrame:
    from io import StringIO

    return normalise_measurements(pd.read_csv(StringIO(text)), source="m.csv", purpose="fit")


def test_rows_on_several_hardware_are_one_error_naming_the_argument():
    df = _table(
        "model,hardware,num_gpus,global_batch_size,step_time_s\n"
        "gpt2,h200,8,64,1.0\ngpt2,a100-80gb,8,64,2.0\n"
    )
    with pytest.raises(AisimError) as e:
        fit_measurements(df)
    assert e.value.source == "m.csv" and e.value.field == "hardware"
    assert e.value.hint == "split the file, or pass {hardware} for blank cells"
    assert "--" not in str(e.value)


def test_no_measured_row_and_unknown_free_name_are_data():
    df = _table("model,hardware,num_gpus,global_batch_size,step_time_s\ngpt2,h200,8,64,\n")
    with pytest.raises(AisimError) as e:
        fit_measurements(df)
    assert e.value.source == "m.csv" and e.value.field == "measured_step_time_s"
    df = _table("model,hardware,num_gpus,global_batch_size,step_time_s\ngpt2,h200,8,64,1.0\n")
    with pytest.raises(AisimError) as e:
        fit_measurements(df, free="efficency")
    assert e.value.source is None and e.value.field == "free" and e.value.value == "efficency"
    assert "did you mean efficiency" in e.value.expected


def test_row_strategy_errors_name_the_row_and_the_column():
    df = _table(
        "model,hardware,num_gpus,tp,global_batch_size,micro_batch_size,step_time_s\n"
        "gpt2,h200,8,1,60,4,1.0\n"
    )
    with pytest.raises(AisimError) as e:
        fit_measurements(df)
    assert e.value.source == "m.csv:1" and e.value.field == "global_batch_size"
    assert str(e.value).startswith("m.csv:1: field 'global_batch_size' = 60: expected a multiple")


def test_the_measuring_loop_is_public_but_loaded_on_first_use():
    assert "measure_many" in calibration.__all__
    assert calibration.Config(dp=1, tp=1, global_batch_size=2).dp == 1
    with pytest.raises(AttributeError):
        calibration.no_such_name  # noqa: B018
