"""`aisim collab sweep --model`: a site's inner step is `aisim perf estimate`'s step time with the
same flags, the JSON carries inner_step_s and compute_utilization overall and per site, the
H x bandwidth table and its figure, and bad input is one line."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from aisim.app import app

runner = CliRunner()
SITE = ["--model", "gpt3-1.3b", "--seq-len", "2048", "--tp", "2", "--pp", "1", "--zero", "1"]
SITE += ["--recompute", "selective", "--micro-batch", "2", "--dtype", "bf16"]


def _json(*args):
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_inner_step_is_perf_estimates_step_time_with_the_same_flags():
    perf = _json(
        "perf",
        "estimate",
        *SITE,
        "--hardware",
        "h100-sxm",
        "--gpus",
        "8",
        "--global-batch",
        "64",
        "--fused-attention",
    )
    doc = _json(
        "collab",
        "sweep",
        *SITE,
        "--clients",
        "2",
        "--client-hardware",
        "h100-sxm",
        "--devices",
        "8",
        "--batch-size",
        "64",
        "--local-steps",
        "50",
        "--compression",
        "bf16",
    )
    assert doc["inner_step_s"] == pytest.approx(perf["step_time_s"], rel=1e-6)
    (row,) = doc["rows"]
    for site in row["sites"]:
        assert site["inner_step_s"] == pytest.approx(perf["step_time_s"], rel=1e-6)
        assert site["mfu"] <= perf["mfu"] + 1e-6
        assert site["memory_gib"] == pytest.approx(perf["memory"]["total_bytes"] / 2**30)
    # blocking ring all-reduce of bf16 over 2 sites on the preset's WAN: hand value
    params = doc["setting"]["params"]
    compute = 50 * perf["step_time_s"]
    assert doc["compute_utilization"] == pytest.approx(compute / row["round_s"], rel=1e-5)
    assert row["payload_bytes"] == pytest.approx(2 * params, rel=1e-6)
    assert 0 < doc["compute_utilization"] < 1


def test_perf_estimates_memory_knobs_reach_the_sites():
    # a torchtitan-like site: FSDP2 over 8 GPUs with its fp32 shards, per-op checkpointing,
    # the unfused loss, eager kernels and FlashAttention-2: the same step and memory as perf's
    site = ["--model", "llama3-8b", "--layers", "8", "--seq-len", "4096", "--tp", "1"]
    site += ["--pp", "1", "--zero", "3", "--recompute", "selective", "--micro-batch", "1"]
    site += ["--recompute-modules", "per_op", "--logit-bytes", "12", "--fsdp-fp32-params"]
    site += ["--eager", "--attention-kernel", "fa2", "--dtype", "bf16"]
    perf = _json(
        "perf", "estimate", *site, "--hardware", "h100-sxm", "--gpus", "8",
        "--global-batch", "16", "--fused-attention",
    )  # fmt: skip
    doc = _json(
        "collab", "sweep", *site, "--clients", "2", "--client-hardware", "h100-sxm",
        "--devices", "8", "--batch-size", "16", "--local-steps", "10", "--compression", "bf16",
    )  # fmt: skip
    (row,) = doc["rows"]
    for s in row["sites"]:
        assert s["inner_step_s"] == pytest.approx(perf["step_time_s"], rel=1e-6)
        assert s["memory_gib"] == pytest.approx(perf["memory"]["total_bytes"] / 2**30)
    plain = _json(
        "perf", "estimate", *[a for a in site if a != "--fsdp-fp32-params"], "--hardware",
        "h100-sxm", "--gpus", "8", "--global-batch", "16", "--fused-attention",
    )  # fmt: skip
    # without FSDP's fp32 shards, a bf16 shard of the weights (2 bytes per parameter / 8)
    shard = 2.0 * perf["params"] / 8
    assert plain["memory"]["total_bytes"] - perf["memory"]["total_bytes"] == pytest.approx(shard)


def test_a_stack_profile_and_serialisation_reach_the_sites():
    common = ["--hardware", "h100-sxm", "--gpus", "8", "--global-batch", "64"]
    perf = _json(
        "perf", "estimate", *SITE, *common, "--fused-attention", "--profile", "megatron-core-h100"
    )
    args = ["collab", "sweep", *SITE, "--clients", "2", "--client-hardware", "h100-sxm"]
    args += ["--devices", "8", "--batch-size", "64", "--profile", "megatron-core-h100"]
    doc = _json(*args)
    assert doc["inner_step_s"] == pytest.approx(perf["step_time_s"], rel=1e-6)
    ser = _json(*args, "--serde-format", "msgpack")["rows"][0]
    assert ser["serialization_share_pct"] > 0 and ser["round_s"] > doc["rows"][0]["round_s"]


def test_the_h_by_bandwidth_table_csv_and_figure(tmp_path):
    out, fig = tmp_path / "t.csv", tmp_path / "t.png"
    r = runner.invoke(
        app,
        [
            "collab",
            "sweep",
            *SITE,
            "--clients",
            "3",
            "--client-hardware",
            "h100-sxm",
            "--devices",
            "8",
            "--batch-size",
            "64",
            "--local-steps",
            "10,100",
            "--wan-bandwidth",
            "100Mbps,1Gbps",
            "--compression",
            "int8",
            "--tokens",
            "10B",
            "--out",
            str(out),
            "--plot",
            str(fig),
        ],
    )
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out)
    assert len(df) == 4 and fig.stat().st_size > 1000
    by = df.set_index(["local_steps", "wan_bandwidth_bps"])["compute_utilization_pct"]
    assert by[(10, 1e8)] < by[(100, 1e8)] and by[(10, 1e8)] < by[(10, 1e9)]
    hand = 10e9 / df["tokens_per_round"] * df["round_s"]
    assert (abs(df["time_to_train_s"] / hand - 1) < 1e-6).all()


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--mode", "gossip"], "--mode"),
        (["--devices", "6", "--tp", "4"], "--tp"),
        (["--compression", "int4"], "--compression"),
        (["--churn", "1.5"], "--churn"),
        (["--tcp-window", "0MiB"], "--tcp-window"),
        (["--tcp-window", "lots"], "--tcp-window"),
        (["--round-window", "-60"], "--round-window"),
        (["--inner-step-time", "0"], "--inner-step-time"),
        (["--clients", "3", "--inner-step-time", "1,2"], "--inner-step-time"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(args, flag):
    r = runner.invoke(app, ["collab", "sweep", "--model", "gpt3-125m", "--devices", "8", *args])
    assert r.exit_code != 0
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and flag in lines[0], r.output


def test_the_tcp_window_caps_the_link_at_window_over_round_trip():
    args = ["collab", "sweep", "--model", "gpt3-125m", "--clients", "3", "--devices", "8"]
    args += ["--local-steps", "10", "--compression", "bf16", "--wan-bandwidth", "10Gbps"]
    args += ["--wan-latency-ms", "50", "--wan-efficiency", "1"]
    free = _json(*args)["rows"][0]
    capped_doc = _json(*args, "--tcp-window", "4MB")
    capped = capped_doc["rows"][0]
    assert capped_doc["setting"]["tcp_window_bytes"] == 4e6
    # ring of 3: 2(n-1) = 4 latencies, then 2(n-1)/n of the payload at 4e6 B / 0.1 s = 40 MB/s
    payload = free["payload_bytes"]
    assert capped["sync_s"] == pytest.approx(4 * 0.05 + 4 / 3 * payload / 40e6, rel=1e-4)
    assert free["sync_s"] == pytest.approx(4 * 0.05 + 4 / 3 * payload / 1.25e9, rel=1e-4)


def test_a_round_window_fixes_the_round_and_cuts_the_inner_steps_at_its_end():
    args = ["collab", "sweep", "--model", "gpt3-125m", "--clients", "3", "--devices", "8"]
    args += ["--local-steps", "10", "--compression", "bf16", "--wan-bandwidth", "1Gbps"]
    free_doc = _json(*args)
    free, step = free_doc["rows"][0], free_doc["inner_step_s"]
    # a window 10 s longer than the work: the round is the window, the steps all run
    roomy = _json(*args, "--round-window", str(free["round_s"] + 10))
    assert roomy["setting"]["round_window_s"] == pytest.approx(free["round_s"] + 10)
    row = roomy["rows"][0]
    assert row["round_s"] == pytest.approx(free["round_s"] + 10, rel=1e-6)
    assert row["compute_utilization_pct"] == pytest.approx(100 * 10 * step / row["round_s"])
    assert row["tokens_per_round"] == pytest.approx(free["tokens_per_round"], rel=1e-6)
    # a window of sync + 5 steps: the sites stop after 5 of their 10 steps
    short = _json(*args, "--round-window", str(free["sync_s"] + 5 * step))["rows"][0]
    assert short["tokens_per_round"] == pytest.approx(free["tokens_per_round"] / 2, rel=1e-4)


def test_a_measured_inner_step_replaces_the_step_models_and_scales_the_mfu():
    args = ["collab", "sweep", "--model", "gpt3-125m", "--clients", "2", "--devices", "8"]
    args += ["--local-steps", "10", "--compression", "bf16", "--wan-bandwidth", "1Gbps"]
    model_doc = _json(*args)
    model, step = model_doc["rows"][0], model_doc["inner_step_s"]
    doc = _json(*args, "--inner-step-time", "2,3")
    row = doc["rows"][0]
    assert [s["inner_step_s"] for s in row["sites"]] == [2.0, 3.0]
    # the round waits for the slower site's 10 steps of 3 s, then the same sync
    assert row["round_s"] == pytest.approx(30.0 + model["sync_s"], rel=1e-5)
    assert row["sync_s"] == pytest.approx(model["sync_s"], rel=1e-6)
    # the same model FLOPs over a longer step: MFU x (model step / measured step)
    mfu_model = model["sites"][0]["mfu"] * model["round_s"] / (10 * step)
    assert row["sites"][0]["mfu"] * row["round_s"] / 20.0 == pytest.approx(
        mfu_model * step / 2.0, rel=1e-4
    )


def test_pipeline_across_sites_sends_activations_over_the_wan():
    from perfmodel import load_hardware, resolve_model
    from perfmodel.collab_real import CrossSite, pipeline_frame

    hw = load_hardware("h100-sxm")
    cs = CrossSite(
        model=resolve_model("gpt3-1.3b", seq_len=2048),
        hardware=(hw,) * 4,
        devices=(8,),
        batch_size=(64,),
        knobs=dict(tp=1, pp=1, zero_stage=1, recompute="full", micro_batch_size=1, dtype="bf16"),
        up_bytes_per_s=(125e6,),
        down_bytes_per_s=(125e6,),
        latency_s=(0.03,),
        mode="pipeline",
        wan_efficiency=0.5,
    )
    df, (est,) = pipeline_frame(cs)
    (row,) = df.to_dict(orient="records")
    m = float(est.strategy.num_microbatches)
    act = 1 * 2048 * 2048 * 2.0  # micro-batch x tokens x hidden x bf16 bytes
    hand = 2 * (m + 4 - 1) * (0.03 + act / (125e6 * 0.5))
    assert row["sync_s"] == pytest.approx(hand, rel=1e-4)
    shares = row["compute_utilization_pct"] + row["communication_share_pct"]
    assert shares + row["idle_share_pct"] == pytest.approx(100.0)
    with pytest.raises(Exception, match="devices"):
        pipeline_frame(dataclasses.replace(cs, devices=(8, 8, 8, 16)))
