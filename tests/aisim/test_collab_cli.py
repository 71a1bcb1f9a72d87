"""`aisim collab` through the CLI: sweep's JSON keys and both utilisations, --out/--plot, rounds as
an input, measure-serde's profile read by sweep, fit's JSON and profile; with --model, a site's
inner step is `aisim perf estimate`'s with the same flags, every knob of the registry is an
option, and the H x bandwidth table; --help's panels fit 80 columns; bad input is one line and
exit 2 (usage) or 1, before any computation."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from aisim.app import app
from perfmodel.specs.knobs import KNOBS

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "calibration" / "data" / "seed_collab_mlp_2clients.csv"
SHARES = (
    "compute_utilization_pct",
    "communication_share_pct",
    "serialization_share_pct",
    "other_share_pct",
)
SITE = ["--model", "gpt3-1.3b", "--seq-len", "2048", "--tp", "2", "--pp", "1", "--zero", "1"]
SITE += ["--recompute", "selective", "--micro-batch", "2", "--dtype", "bf16"]
SMALL = ["collab", "sweep", "--model", "gpt3-125m", "--devices", "8", "--compression", "bf16"]
# the registry's knobs that a site takes under collab's own per-site options
SITE_OPTIONS = {"num_gpus": "--devices"}


def run(*args):
    return runner.invoke(app, list(args))


def _json(*args):
    r = run(*args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


# ------------------------------------------------------------------ model sizes


def test_sweep_json_has_the_source_columns_and_both_utilisations():
    doc = _json("collab", "sweep", "--sizes", "10M,20M,40M,60M,80M,100M", "--clients", "2")
    assert list(doc) == ["setting", "rows"]
    assert [r["model_params"] for r in doc["rows"]] == ["10M", "20M", "40M", "60M", "80M", "100M"]
    for r in doc["rows"]:
        assert {"model_params", "total_task_time_s", "round_time_s", "rounds"} <= set(r)
        for i in (1, 2):
            assert sum(r[f"client{i}_{s}"] for s in SHARES) == pytest.approx(100.0, abs=1e-3)
            # nobody waits for an identical client: compute / busy = compute / wall
            assert r[f"client{i}_compute_share_of_busy_pct"] == pytest.approx(
                r[f"client{i}_compute_utilization_pct"], abs=1e-3
            )
    comm = [r["client1_communication_share_pct"] for r in doc["rows"]]
    assert comm == sorted(comm)
    # the guide's first table (docs/guides/collab.md) is what the command computes; its
    # compute/busy % column is left out where it equals compute % (nobody waits)
    guide = (ROOT / "docs" / "guides" / "collab.md").read_text().split("```console", 2)[1]
    head = [h.strip() for h in re.search(r"┃ size ┃(.*)┃\n", guide).group(1).split("┃")]
    cells = re.findall(r"│\s*(\d+M) │([\d. │]+)│", guide)
    assert len(cells) == 12 and "compute/busy %" not in head
    rows = {r["model_params"]: r for r in doc["rows"]}
    names = {"total s": "total_task_time_s", "compute %": "compute_utilization_pct",
             "comm %": "communication_share_pct", "serde %": "serialization_share_pct",
             "other %": "other_share_pct"}  # fmt: skip
    for size, numbers in cells:
        pasted = dict(zip(head, (float(x) for x in numbers.split("│")), strict=True))
        client = int(pasted.pop("client"))
        for h, v in pasted.items():
            key = names[h] if h == "total s" else f"client{client}_{names[h]}"
            assert rows[size][key] == pytest.approx(v, abs=0.005), (size, h)


def test_a_waiting_client_computes_more_of_its_busy_time_than_of_the_wall_time():
    args = ["collab", "sweep", "--sizes", "10M", "--client-hardware", "a100-80gb,h100-sxm"]
    (row,) = _json(*args, "--devices", "8")["rows"]
    wait, total = row["client2_wait_s"], row["round_time_s"]
    assert wait > 0
    busy = 100 * row["client2_compute_s"] / (total - wait)
    assert row["client2_compute_share_of_busy_pct"] == pytest.approx(busy, rel=1e-5)
    assert row["client2_compute_share_of_busy_pct"] > row["client2_compute_utilization_pct"]


def test_pipeline_microbatches_under_both_spellings():
    args = ["collab", "sweep", "--sizes", "1B", "--mode", "pipeline", "--devices", "8"]
    a = _json(*args, "--num-microbatches", "32")["rows"][0]
    b = _json(*args, "--microbatches", "32")["rows"][0]
    c = _json(*args)["rows"][0]  # 8 by default
    assert a["round_time_s"] == b["round_time_s"] != c["round_time_s"]


def test_rounds_multiply_the_round_time():
    one = _json("collab", "sweep", "--sizes", "10M")["rows"][0]
    many = _json("collab", "sweep", "--sizes", "10M", "--rounds", "60")["rows"][0]
    assert many["total_task_time_s"] == pytest.approx(60 * one["round_time_s"], rel=1e-6)


@pytest.mark.slow  # a several-second compile (pyproject's markers)
def test_sweep_table_out_and_plot(tmp_path):
    out, png = tmp_path / "shares.csv", tmp_path / "shares.png"
    r = run(
        "collab", "sweep", "--sizes", "10M,100M", "--client-hardware", "a100-80gb,h100-sxm",
        "--wan-up", "100Mbps", "--wan-down", "1Gbps", "--out", str(out), "--plot", str(png),
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "compute/busy %" in r.stdout and f"wrote {out}" in r.stdout
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
    doc = _json("collab", "measure-serde", "--params", "1M", "--repeats", "1", "--out", str(prof))
    assert set(doc["serde"]) == {"numpy", "msgpack", "protobuf", "pickle"}
    written = json.loads(prof.read_text())
    assert written["schema"] == "aisim.profile/1" and written["collab"]["serde"] == doc["serde"]
    thr = doc["serde"]["pickle"]
    args = ["collab", "sweep", "--sizes", "10M", "--profile", str(prof), "--serde-format", "pickle"]
    row = _json(*args)["rows"][0]
    nbytes = 4.0 * row["params"]
    expected = nbytes / thr["serialize_bytes_per_s"] + nbytes / thr["deserialize_bytes_per_s"]
    assert row["client1_serialize_s"] + row["client1_deserialize_s"] == pytest.approx(
        expected, rel=1e-4
    )


@pytest.mark.slow
def test_fit_json_profile_and_sweep_with_it(tmp_path):
    # the source's whole table, as tests/collab/test_fit.py and the guide fit it: one compiled
    # fit for the three (the session's compilation cache, tests/conftest.py); its 40M row is empty
    prof = tmp_path / "collab.json"
    doc = _json("collab", "fit", str(SEED), "--out", str(prof))
    assert {"rms_error_pp", "fitted_percentages", "values", "table", "rows"} <= set(doc)
    # five fitted sizes, six shares each (utilisation, communication, serialisation x 2 sites)
    assert doc["rms_error_pp"] <= 1.5 and doc["fitted_percentages"] == 30
    predicted = {r["model_params"]: r for r in doc["rows"]}
    args = ["collab", "sweep", "--sizes", "10M,40M,100M", "--profile", str(prof)]
    sweep = {r["model_params"]: r for r in _json(*args)["rows"]}
    for i in (1, 2):
        for s in SHARES:
            assert sweep["40M"][f"client{i}_{s}"] == pytest.approx(
                predicted["40M"][f"client{i}_{s}"], abs=1e-3
            )
    fast = {r["model_params"]: r for r in _json(*args, "--wan-bandwidth", "10Gbps")["rows"]}
    assert all(
        fast[k]["client2_communication_share_pct"] < sweep[k]["client2_communication_share_pct"]
        for k in fast
    )


# ------------------------------------------------------------------ real models across sites


def test_inner_step_is_perf_estimates_step_time_with_the_same_flags():
    common = ["--hardware", "h100-sxm", "--gpus", "8", "--global-batch", "64"]
    perf = _json("perf", "estimate", *SITE, *common, "--fused-attention")
    args = ["collab", "sweep", *SITE, "--clients", "2", "--client-hardware", "h100-sxm"]
    args += ["--devices", "8", "--batch-size", "64", "--local-steps", "50", "--compression", "bf16"]
    doc = _json(*args)
    assert doc["inner_step_s"] == pytest.approx(perf["step_time_s"], rel=1e-6)
    (row,) = doc["rows"]
    for site in row["sites"]:
        assert site["inner_step_s"] == pytest.approx(perf["step_time_s"], rel=1e-6)
        assert site["mfu"] <= perf["mfu"] + 1e-6
        assert site["memory_gib"] == pytest.approx(perf["memory"]["total_bytes"] / 2**30)
    # blocking ring all-reduce of bf16 over 2 identical sites: nothing idles, and both
    # utilisations are 50 inner steps over the round
    compute = 50 * perf["step_time_s"]
    assert doc["compute_utilization"] == pytest.approx(compute / row["round_s"], rel=1e-5)
    assert doc["compute_share_of_busy"] == pytest.approx(compute / row["round_s"], rel=1e-5)
    assert row["payload_bytes"] == pytest.approx(2 * doc["setting"]["params"], rel=1e-6)
    # the registry's --global-batch is the site's batch too
    alias = [a if a != "--batch-size" else "--global-batch" for a in args]
    assert _json(*alias)["rows"][0]["round_s"] == pytest.approx(row["round_s"], rel=1e-6)


def test_every_knob_of_the_registry_is_an_option_of_collab_sweep():
    r = runner.invoke(app, ["collab", "sweep", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    offered = set(re.findall(r"--[a-z0-9-]+", r.stdout))
    for knob in KNOBS:
        option = SITE_OPTIONS.get(knob.name, knob.option)
        assert option in offered, knob.name
    assert {"--gpus", "--stack", "--set"} <= offered


def test_help_groups_options_in_panels_and_fits_80_columns():
    r = runner.invoke(app, ["collab", "sweep", "--help"], env={"COLUMNS": "80"})
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert max(len(ln) for ln in lines) <= 80
    panels = re.findall(r"╭─ ([A-Za-z ]+?) ─", r.stdout)
    for panel in ("Model", "Sites", "WAN", "Round", "Layout", "Batching", "Memory plan", "Output"):
        assert panel in panels, panels
    # no option name is cut
    assert "…" not in r.stdout


def test_a_site_takes_perf_estimates_memory_knobs_and_a_stack():
    site = ["--model", "llama3-8b", "--layers", "8", "--seq-len", "4096", "--zero", "3"]
    site += ["--recompute", "selective", "--recompute-modules", "per_op", "--logit-bytes", "12"]
    site += ["--fsdp-fp32-params", "--eager", "--attention-kernel", "fa2", "--dtype", "bf16"]
    perf = _json(
        "perf", "estimate", *site, "--tp", "1", "--pp", "1", "--micro-batch", "1", "--hardware",
        "h100-sxm", "--gpus", "8", "--global-batch", "16", "--fused-attention",
    )  # fmt: skip
    args = ["collab", "sweep", *site, "--clients", "2", "--client-hardware", "h100-sxm"]
    args += ["--devices", "8", "--batch-size", "16", "--local-steps", "10"]
    (row,) = _json(*args)["rows"]
    for s in row["sites"]:
        assert s["inner_step_s"] == pytest.approx(perf["step_time_s"], rel=1e-6)
        assert s["memory_gib"] == pytest.approx(perf["memory"]["total_bytes"] / 2**30)
    # --set reaches the sites as the option does
    setting = [a for a in args if a != "--eager"] + ["--set", "eager=on"]
    assert _json(*setting)["rows"][0]["round_s"] == pytest.approx(row["round_s"], rel=1e-6)


@pytest.mark.slow
def test_a_stacks_constants_and_serialisation_reach_the_sites():
    common = ["--hardware", "h100-sxm", "--gpus", "8", "--global-batch", "64"]
    perf = _json(
        "perf", "estimate", *SITE, *common, "--fused-attention", "--stack", "megatron-core"
    )
    args = ["collab", "sweep", *SITE, "--clients", "2", "--client-hardware", "h100-sxm"]
    args += ["--devices", "8", "--batch-size", "64", "--stack", "megatron-core"]
    doc = _json(*args)
    assert doc["inner_step_s"] == pytest.approx(perf["step_time_s"], rel=1e-6)
    ser = _json(*args, "--serde-format", "msgpack")["rows"][0]
    assert ser["serialization_share_pct"] > 0 and ser["round_s"] > doc["rows"][0]["round_s"]


def test_the_h_by_bandwidth_table_csv_and_figure(tmp_path):
    out, fig = tmp_path / "t.csv", tmp_path / "t.png"
    r = run(
        *SMALL, "--clients", "3", "--client-hardware", "h100-sxm", "--batch-size", "64",
        "--local-steps", "10,100", "--wan-bandwidth", "100Mbps,1Gbps", "--compression", "int8",
        "--tokens", "10B", "--out", str(out), "--plot", str(fig),
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    # identical sites, nobody idles: compute/busy % equals compute % and is left out
    header = next(ln for ln in r.stdout.splitlines() if "┃" in ln and "days to train" in ln)
    assert "compute %" in header and "compute/busy %" not in header
    df = pd.read_csv(out)
    assert len(df) == 4 and fig.stat().st_size > 1000
    by = df.set_index(["local_steps", "wan_bandwidth_bps"])["compute_utilization_pct"]
    assert by[(10, 1e8)] < by[(100, 1e8)] and by[(10, 1e8)] < by[(10, 1e9)]
    hand = 10e9 / df["tokens_per_round"] * df["round_s"]
    assert (abs(df["time_to_train_s"] / hand - 1) < 1e-6).all()


def test_the_tcp_window_caps_the_link_at_window_over_round_trip():
    args = [*SMALL, "--clients", "3", "--local-steps", "10", "--wan-bandwidth", "10Gbps"]
    args += ["--wan-latency-ms", "50", "--wan-efficiency", "1"]
    free = _json(*args)["rows"][0]
    capped_doc = _json(*args, "--tcp-window", "4MB")
    capped = capped_doc["rows"][0]
    assert capped_doc["setting"]["tcp_window_bytes"] == 4e6
    payload = free["payload_bytes"]
    assert capped["sync_s"] == pytest.approx(4 * 0.05 + 4 / 3 * payload / 40e6, rel=1e-4)
    assert free["sync_s"] == pytest.approx(4 * 0.05 + 4 / 3 * payload / 1.25e9, rel=1e-4)


def test_a_round_window_fixes_the_round_and_the_utilisations_part():
    args = [*SMALL, "--clients", "3", "--local-steps", "10", "--wan-bandwidth", "1Gbps"]
    free_doc = _json(*args)
    free, step = free_doc["rows"][0], free_doc["inner_step_s"]
    roomy = _json(*args, "--round-window", str(free["round_s"] + 10))
    row = roomy["rows"][0]
    assert row["round_s"] == pytest.approx(free["round_s"] + 10, rel=1e-6)
    # 10 s of idle at the window's end: in the wall time, not in the busy time
    assert row["compute_utilization_pct"] == pytest.approx(100 * 10 * step / row["round_s"])
    assert row["compute_share_of_busy_pct"] == pytest.approx(
        free["compute_share_of_busy_pct"], rel=1e-5
    )
    short = _json(*args, "--round-window", str(free["sync_s"] + 5 * step))["rows"][0]
    assert short["tokens_per_round"] == pytest.approx(free["tokens_per_round"] / 2, rel=1e-4)


def test_a_measured_inner_step_replaces_the_step_models_and_scales_the_mfu():
    args = [*SMALL, "--clients", "2", "--local-steps", "10", "--wan-bandwidth", "1Gbps"]
    model_doc = _json(*args)
    model, step = model_doc["rows"][0], model_doc["inner_step_s"]
    row = _json(*args, "--inner-step-time", "2,3")["rows"][0]
    assert [s["inner_step_s"] for s in row["sites"]] == [2.0, 3.0]
    assert row["round_s"] == pytest.approx(30.0 + model["sync_s"], rel=1e-5)
    mfu_model = model["sites"][0]["mfu"] * model["round_s"] / (10 * step)
    assert row["sites"][0]["mfu"] * row["round_s"] / 20.0 == pytest.approx(
        mfu_model * step / 2.0, rel=1e-4
    )


def test_sites_shard_and_recompute_as_far_as_they_need_and_say_so():
    # llama3-8b does not fit 8 A100s as plain replicas (172.5 GiB a device): by default each
    # site takes the least ZeRO stage and recomputation that fit, and the output names them
    r = run("collab", "sweep", "--model", "llama3-8b", "--local-steps", "10", "--json")
    assert r.exit_code == 0, r.output
    site = json.loads(r.output)["rows"][0]["sites"][0]
    assert site["fits_memory"] and site["auto"] == "zero_stage 1, recompute full"
    alone = _json("perf", "estimate", "--model", "llama3-8b", "--gpus", "8", "--global-batch",
                  "128", "--tp", "1", "--pp", "1", "--zero", "1", "--recompute", "full",
                  "--micro-batch", "1", "--fused-attention")  # fmt: skip
    assert site["inner_step_s"] == pytest.approx(alone["step_time_s"], rel=1e-6)
    # what still does not fit is a warning: llama3-70b needs more than ZeRO-3 and full
    # recomputation leave on 8 x 80 GiB
    r = run("collab", "sweep", "--model", "llama3-70b", "--local-steps", "10")
    assert r.exit_code == 0, r.output
    assert "site 1-2 (a100-80gb) auto: zero_stage 3, recompute full" in r.stdout
    assert re.search(r"warning: site 1-2 \(a100-80gb\) needs [\d.]+ GiB per device", r.stdout)


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "args, needle",
    [
        (["sweep", "--client-hardware", "a100"], "unknown hardware preset 'a100'"),
        (["sweep", "--wan-bandwidth", "0Gbps"], "'--wan-bandwidth' = '0Gbps'"),
        (["sweep", "--wan-bandwidth", "-1Gbps"], "'--wan-bandwidth' = '-1Gbps'"),
        (["sweep", "--wan-bandwidth", "1e30Gbps"], "'--wan-bandwidth' = '1e30Gbps'"),
        (["sweep", "--wan-up", "0"], "'--wan-up' = '0'"),
        (["sweep", "--sizes", "10Q"], "'--sizes' = '10Q'"),
        (["sweep", "--sizes", "1e30"], "'--sizes' = '1e30'"),
        (["sweep", "--devices", "1e30"], "'--devices' = '1e30'"),
        (["sweep", "--devices", "-8"], "'--devices' = '-8'"),
        (["sweep", "--local-steps", "inf"], "'--local-steps' = 'inf'"),
        (["sweep", "--rounds", "inf"], "'--rounds' = inf"),
        (["sweep", "--wan-latency-ms", "inf"], "'--wan-latency-ms' = inf"),
        (["sweep", "--wan-latency-ms", "1e30"], "'--wan-latency-ms' = 1e+30"),
        (["sweep", "--rounds", "1e30"], "'--rounds' = 1e+30: expected a positive number"),
        (["sweep", "--topk-fraction", "1e30"], "'--topk-fraction' = 1e+30"),
        (["sweep", "--clients", "100000"], "'--clients' = 100000"),
        (["sweep", "--mode", "gossip"], "'--mode' = 'gossip'"),
        (["sweep", "--tp", "2"], "'--tp' = '2'"),
        (["sweep", "--churn", "0.1"], "'--churn' = 0.1"),
        (
            ["sweep", "--clients", "3", "--devices", "1,2"],
            "'--devices' = '1,2': expected 1 value or one per client (3)",
        ),
        (["sweep", "--out", "x.txt"], "'--out' = 'x.txt'"),
        (["sweep", "--plot", "x.svg"], "'--plot' = 'x.svg'"),
        (["measure-serde", "--params", "10Q"], "'--params' = '10Q'"),
        (["measure-serde", "--formats", "json"], "'--formats' = 'json'"),
        (["measure-serde", "--repeats", "-1"], "'--repeats' = -1"),
        (["fit", "missing.csv"], "missing.csv: file not found"),
        (["validate", "missing.csv"], "missing.csv: cross-site runs table not found"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, needle):
    r = run("collab", *args)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.output, r.stderr


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--mode", "gossip"], "--mode"),
        (["--devices", "6", "--tp", "4"], "--tp"),
        (["--compression", "int4"], "--compression"),
        (["--churn", "1.5"], "--churn"),
        (["--churn", "inf"], "--churn"),
        (["--deadline", "-1"], "--deadline"),
        (["--tcp-window", "0MiB"], "--tcp-window"),
        (["--tcp-window", "lots"], "--tcp-window"),
        (["--round-window", "-60"], "--round-window"),
        (["--inner-step-time", "0"], "--inner-step-time"),
        (["--inner-step-time", "inf"], "--inner-step-time"),
        (["--clients", "3", "--inner-step-time", "1,2"], "--inner-step-time"),
        (["--local-steps", "1e30"], "--local-steps"),
        (["--tokens", "inf"], "--tokens"),
        (["--rounds", "3"], "--rounds"),
        (["--batch-size", "64", "--global-batch", "64"], "--global-batch"),
        (["--set", "warp=9"], "--set"),
    ],
)
def test_bad_model_input_is_one_line_naming_the_flag(args, flag):
    r = run("collab", "sweep", "--model", "gpt3-125m", "--devices", "8", *args)
    assert r.exit_code in (1, 2) and "Traceback" not in r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and flag in lines[0], r.output


@pytest.mark.parametrize(
    "args",
    [
        ["sweep", "--out", "t.csv"],
        ["sweep", "--plot", "x.png"],
        ["sweep", "--model", "gpt3-125m", "--out", "t.csv"],
        ["fit", str(SEED), "--out", "t.json"],
        ["fit", str(SEED), "--table-out", "t.csv"],
        ["validate", "--out", "t.csv"],
        ["measure-serde", "--out", "t.json"],
    ],
)
def test_an_output_path_that_is_a_directory_is_refused_before_any_work(tmp_path, args):
    for name in ("t.csv", "t.json", "x.png"):
        (tmp_path / name).mkdir()
    flag = next(a for a in args if a in ("--out", "--plot", "--table-out"))
    path = tmp_path / args[args.index(flag) + 1]
    r = run("collab", *[str(path) if a == path.name else a for a in args])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"'{flag}'" in lines[0] and "not a directory" in lines[0], r.stderr


@pytest.mark.parametrize("command", ["fit", "validate"])
def test_an_empty_table_is_one_line(tmp_path, command):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    r = run("collab", command, str(empty))
    assert r.exit_code in (1, 2) and "Traceback" not in r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "empty.csv" in lines[0], r.stderr


def test_fit_bad_size_in_the_table_names_file_and_row(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(SEED.read_text().replace("\n2,20M,", "\n2,20Q,"))
    r = run("collab", "fit", str(bad))
    assert r.exit_code == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "bad.csv: row 2: field 'model_params' = '20Q'" in lines[0]


@pytest.mark.parametrize(
    "args",
    [
        ["validate", "{f}"],
        ["fit", "{f}"],
        ["sweep", "--profile", "{f}"],
        ["sweep", "--model", "gpt3-125m", "--profile", "{f}"],
        ["sweep", "--model", "{f}.json"],
    ],
)
def test_a_folder_or_fifo_given_as_input_is_one_line(tmp_path, args):
    import os

    (tmp_path / "dir").mkdir()
    (tmp_path / "dir.json").mkdir()
    os.mkfifo(tmp_path / "fifo")
    for name in ("dir", "fifo"):
        r = run("collab", *[a.replace("{f}", str(tmp_path / name)) for a in args])
        assert r.exit_code in (1, 2) and "Traceback" not in r.output, r.output
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), r.output
