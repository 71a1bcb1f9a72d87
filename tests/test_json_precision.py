"""Numbers in ``--json`` documents and written CSV tables carry the digits their computation holds: a float32 result is
written as the shortest decimal that reads back as that float32 (``0.33278394``), not as the
float64 expansion of it (``0.33278393745422363``); float64 values and whole numbers are left
as they are."""

from __future__ import annotations

import json
import re

import numpy as np
from typer.testing import CliRunner

from aisim.app import app
from simbase.io import carried_float, significant, to_json

NUMBER = re.compile(r"-?\d+\.\d+(?:e[-+]?\d+)?")


def _long_numbers(text: str) -> list[str]:
    """Fractions written with ten or more significant digits: more than a float32 carries (whole
    numbers, such as byte counts, are written as they are)."""
    digits = lambda n: len(n.split("e")[0].replace("-", "").replace(".", "").lstrip("0"))  # noqa: E731
    return [n for n in NUMBER.findall(text) if digits(n) >= 10 and float(n) != int(float(n))]


def test_a_float32_reads_back_as_itself_in_its_shortest_form():
    rng = np.random.default_rng(0)
    for v in rng.lognormal(0.0, 6.0, 500).astype(np.float32):
        s = json.dumps(carried_float(float(v)))
        assert np.float32(float(s)) == v and len(s.replace("-", "")) <= 15, s
    assert carried_float(float(np.float32(0.33278394))) == 0.33278394
    # float64 values, whole numbers (counts, even past 2**24) and non-floats are untouched
    for x in (0.1, 1 / 3, 2.0**31, 1536.0, 1e-7):
        assert carried_float(x) == x
    doc = json.loads(to_json({"a": np.float32(0.1), "b": [np.float32(2.5)], "c": float("nan")}))
    assert doc == {"a": 0.1, "b": [2.5], "c": None}


def test_estimate_json_has_no_float64_tails():
    r = CliRunner().invoke(
        app,
        [
            "perf",
            "estimate",
            "--model",
            "gpt3-13b",
            "--gpus",
            "64",
            "--tp",
            "4",
            "--pp",
            "2",
            "--global-batch",
            "256",
            "--json",
        ],  # fmt: skip
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert not _long_numbers(r.output), _long_numbers(r.output)[:5]
    assert _long_numbers('"x": 0.33278393745422363') and not _long_numbers('"x": 0.0088613555')
    assert 0.0 < doc["mfu"] < 1.0 and doc["step_time_s"] > 0


def test_the_plan_to_train_is_written_to_seven_significant_digits():
    # days, cost, energy and the failure process are float64 arithmetic on the float32 step
    # time and on failure rates published to a few digits: 32.85338, not 32.853381818013084
    assert significant(32.853381818013084) == 32.85338 and significant(0.80059379712) == 0.8005938
    assert significant({"a": [1445254.402891441, 2.0**40], "b": (0.1, None)}) == {
        "a": [1445254.0, 2.0**40],
        "b": (0.1, None),
    }
    r = CliRunner().invoke(app, ["perf", "estimate", "--tokens", "300B", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert not _long_numbers(r.output), _long_numbers(r.output)[:5]
    assert doc["train_days_lo"] < doc["train_days"] < doc["train_days_hi"]
    assert doc["failures"]["interruptions_per_day"] > 0


def test_a_csv_writes_float32_columns_with_their_digits(tmp_path):
    import pandas as pd

    from simbase.io import write_table

    acc = np.float32([0.31983986, 0.8403025, 1.7])
    df = pd.DataFrame(
        {
            "round": [1, 2, 3],
            "test_accuracy": [float(v) for v in acc],  # float32 results held as float64
            "wall_s": [0.1, 1 / 3, 2.5],  # a float64 column stays as it is
            "bytes_up": [14640.0, float("nan"), 2.0**31 + 1],  # not all float32: as it is
        }
    )
    path = tmp_path / "m.csv"
    write_table(df, path)
    text = path.read_text()
    assert "0.31983986," in text and "0.8403025," in text and "1.7," in text
    assert not _long_numbers(text.replace(repr(1 / 3), ""))  # only the float64 third is long
    back = pd.read_csv(path)
    assert (back.test_accuracy.to_numpy(np.float32) == acc).all()  # the same float32s
    assert back.wall_s.tolist() == df.wall_s.tolist()
    assert back.bytes_up.iloc[2] == 2.0**31 + 1
