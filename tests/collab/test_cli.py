"""`aisim collab` through the CLI: sweep's JSON keys, --out/--plot, rounds as an input,
measure-serde's profile read by sweep, fit's JSON and profile, and bad input (one line, exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from aisim.app import app

runner = CliRunner()
SEED = Path(__file__).resolve().parents[2] / "calibration" / "data" / "seed_collab_mlp_2clients.csv"
SHARES = (
    "compute_utilization_pct",
    "communication_share_pct",
    "serialization_share_pct",
    "other_share_pct",
)


def run(*args):
    return runner.invoke(app, ["collab", *args])


def _json(*args):
    r = run(*args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_sweep_json_has_the_source_columns_plus_other():
    doc = _json("sweep", "--sizes", "10M,20M,40M,60M,80M,100M", "--clients", "2")
    assert list(doc) == ["setting", "rows"]
    assert [r["model_params"] for r in doc["rows"]] == ["10M", "20M", "40M", "60M", "80M", "100M"]
    for r in doc["rows"]:
        assert {"model_params", "total_task_time_s", "round_time_s", "rounds"} <= set(r)
        for i in (1, 2):
            assert sum(r[f"client{i}_{s}"] for s in SHARES) == pytest.approx(100.0, abs=1e-3)
    # bigger models spend a larger share on communication
    comm = [r["client1_communication_share_pct"] for r in doc["rows"]]
    assert comm == sorted(comm)


def test_rounds_multiply_the_round_time():
    one = _json("sweep", "--sizes", "10M")["rows"][0]
    many = _json("sweep", "--sizes", "10M", "--rounds", "60")["rows"][0]
    assert many["total_task_time_s"] == pytest.approx(60 * one["round_time_s"], rel=1e-6)


def test_sweep_out_and_plot(tmp_path):
    out, png = tmp_path / "shares.csv", tmp_path / "shares.png"
    r = run(
        "sweep",
        "--sizes",
        "10M,100M",
        "--client-hardware",
        "a100-80gb,h100-sxm",
        "--wan-up",
        "100Mbps",
        "--wan-down",
        "1Gbps",
        "--out",
        str(out),
        "--plot",
        str(png),
    )
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out)
    assert len(df) == 2 and {"client2_wait_s", "client1_upload_s", "client1_download_s"} <= set(
        df.columns
    )
    # asymmetric link: 100 Mbit/s up takes 10x the 1 Gbit/s download (less the latency)
    assert df.client1_upload_s.iloc[1] - 0.02 == pytest.approx(
        10 * (df.client1_download_s.iloc[1] - 0.02), rel=1e-3
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*.tmp"))


def test_measure_serde_writes_a_profile_that_sweep_reads(tmp_path):
    prof = tmp_path / "serde.json"
    doc = _json("measure-serde", "--params", "1M", "--repeats", "1", "--out", str(prof))
    assert set(doc["serde"]) == {"numpy", "msgpack", "protobuf", "pickle"}
    written = json.loads(prof.read_text())
    assert written["schema"] == "aisim.profile/1" and written["collab"]["serde"] == doc["serde"]
    thr = doc["serde"]["pickle"]
    row = _json("sweep", "--sizes", "10M", "--profile", str(prof), "--serde-format", "pickle")[
        "rows"
    ][0]
    nbytes = 4.0 * row["params"]
    expected = nbytes / thr["serialize_bytes_per_s"] + nbytes / thr["deserialize_bytes_per_s"]
    assert row["client1_serialize_s"] + row["client1_deserialize_s"] == pytest.approx(
        expected, rel=1e-4
    )


@pytest.mark.slow
def test_fit_json_profile_and_sweep_with_it(tmp_path):
    prof = tmp_path / "collab.json"
    doc = _json("fit", str(SEED), "--out", str(prof))
    assert {"rms_error_pp", "fitted_percentages", "values", "table", "rows"} <= set(doc)
    assert doc["rms_error_pp"] <= 1.5 and doc["fitted_percentages"] == 30
    predicted = {r["model_params"]: r for r in doc["rows"]}
    sweep = {r["model_params"]: r for r in _json("sweep", "--profile", str(prof))["rows"]}
    for i in (1, 2):
        for s in SHARES:
            assert sweep["40M"][f"client{i}_{s}"] == pytest.approx(
                predicted["40M"][f"client{i}_{s}"], abs=1e-3
            )
    # a 10x faster WAN under the fitted constants lowers every communication share
    fast = {
        r["model_params"]: r
        for r in _json("sweep", "--profile", str(prof), "--wan-bandwidth", "10Gbps")["rows"]
    }
    assert all(
        fast[k]["client2_communication_share_pct"] < sweep[k]["client2_communication_share_pct"]
        for k in fast
    )


@pytest.mark.parametrize(
    "args, needle",
    [
        (["sweep", "--client-hardware", "a100"], "unknown hardware preset 'a100'"),
        (["sweep", "--wan-bandwidth", "0Gbps"], "'--wan-bandwidth' = '0Gbps'"),
        (["sweep", "--wan-bandwidth", "-1Gbps"], "'--wan-bandwidth' = '-1Gbps'"),
        (["sweep", "--wan-up", "0"], "'--wan-up' = '0'"),
        (["sweep", "--sizes", "10Q"], "'--sizes' = '10Q'"),
        (["sweep", "--mode", "gossip"], "'--mode' = 'gossip'"),
        (
            ["sweep", "--clients", "3", "--devices", "1,2"],
            "'--devices' = '1,2': expected 1 value or one per client (3)",
        ),
        (["sweep", "--out", "x.txt"], "'--out' = 'x.txt'"),
        (["measure-serde", "--params", "10Q"], "'--params' = '10Q'"),
        (["measure-serde", "--formats", "json"], "'--formats' = 'json'"),
        (["fit", "missing.csv"], "missing.csv: file not found"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, needle):
    r = run(*args)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.output, r.stderr


def test_fit_bad_size_in_the_table_names_file_and_row(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(SEED.read_text().replace("\n2,20M,", "\n2,20Q,"))
    r = run("fit", str(bad))
    assert r.exit_code == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "bad.csv: row 2: field 'model_params' = '20Q'" in lines[0]
