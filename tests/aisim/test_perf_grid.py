"""`aisim perf grid` through the CLI: the JSON document, --out/--plot, sweeps, the DistIR cost
model, and bad input (one line, exit 2) or nothing feasible (why, exit 1)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from aisim.app import app
from perfmodel import BREAKDOWN_TERMS, load_hardware, load_model, make_strategy

runner = CliRunner()
KNOB_KEYS = (
    "dp",
    "tp",
    "pp",
    "micro_batch_size",
    "num_microbatches",
    "interleave",
    "schedule",
    "zero_stage",
    "recompute",
    "sequence_parallel",
)


def run(*args):
    return runner.invoke(app, ["perf", *args])


def _json(*args):
    r = run(*args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_default_grid_is_gpt3_175b_on_1024_a100_and_agrees_with_estimate():
    doc = _json("grid")
    assert list(doc)[:5] == ["best", "top", "evaluated", "feasible", "seconds"]
    assert doc["evaluated"] > doc["feasible"] > 1000 and len(doc["top"]) == 10
    best = doc["best"]
    assert best == doc["top"][0]
    assert (best["model"], best["hardware"], best["num_gpus"], best["global_batch_size"]) == (
        "gpt3-175b",
        "a100-80gb",
        1024,
        1536,
    )
    tokens = [t["tokens_per_s"] for t in doc["top"]]
    assert tokens == sorted(tokens, reverse=True)
    # the same strategy through `aisim perf estimate --json` gives the same document
    est = json.loads(
        run(
            "estimate",
            "--json",
            "--tp",
            str(best["tp"]),
            "--pp",
            str(best["pp"]),
            "--micro-batch",
            str(best["micro_batch_size"]),
            "--schedule",
            best["schedule"],
            "--interleave",
            str(best["interleave"]),
            "--zero",
            str(best["zero_stage"]),
            "--recompute",
            best["recompute"],
            "--sequence-parallel" if best["sequence_parallel"] else "--no-sequence-parallel",
        ).stdout
    )
    # what only one run's document says: the constants' provenance, the knobs chosen by
    # ``auto`` and why it is infeasible; the grid's best row is feasible and was given every
    # knob
    one_run = {"constants", "auto", "infeasible_because"}
    assert est["auto"] == {} and est["infeasible_because"] == []
    assert est["constants"]["status"] == "preset"
    assert set(est) - one_run <= set(best)
    for k in KNOB_KEYS:
        assert est[k] == best[k]
    assert best["step_time_s"] == pytest.approx(est["step_time_s"], rel=1e-6)
    assert best["breakdown"] == pytest.approx(est["breakdown"], rel=1e-6)
    assert sum(best["breakdown"][k] for k in BREAKDOWN_TERMS) == pytest.approx(
        best["step_time_s"], rel=1e-5
    )
    # the Pareto front: memory up, throughput up; the reasons count the infeasible ones
    front = doc["pareto"]
    assert all(
        a["memory"]["total_bytes"] <= b["memory"]["total_bytes"]
        and a["tokens_per_s"] < b["tokens_per_s"]
        for a, b in zip(front, front[1:], strict=False)
    )
    assert doc["infeasible_reasons"]["does not fit in 80 GiB per device"] > 0


@pytest.mark.slow
def test_restricted_axes_out_and_plot(tmp_path):
    out, png = tmp_path / "all.csv", tmp_path / "grid.png"
    r = run(
        "grid",
        "--model",
        "gpt3-13b",
        "--gpus",
        "64",
        "--global-batch",
        "512",
        "--tp",
        "2,4",
        "--pp",
        "1,2",
        "--zero",
        "1",
        "--recompute",
        "none,full",
        "--sequence-parallel",
        "on",
        "--top",
        "5",
        "--out",
        str(out),
        "--plot",
        str(png),
    )
    assert r.exit_code == 0, r.output
    assert "top 5 of" in r.stdout and "Pareto front" in r.stdout
    df = pd.read_csv(out)
    assert set(df["tp"]) <= {2, 4} and set(df["pp"]) <= {1, 2} and set(df["zero_stage"]) == {1}
    assert (
        set(df["recompute"]) <= {"none", "full"}
        and df["sequence_parallel"].all()
        and df["feasible"].all()
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*.tmp"))
    doc = _json(
        "grid",
        "--model",
        "gpt3-13b",
        "--gpus",
        "64",
        "--global-batch",
        "512",
        "--tp",
        "2,4",
        "--pp",
        "1,2",
        "--zero",
        "1",
        "--recompute",
        "none,full",
        "--sequence-parallel",
        "on",
    )
    assert doc["feasible"] == len(df)
    assert doc["best"]["tokens_per_s"] == pytest.approx(df["tokens_per_s"].max(), rel=1e-6)
    pq = tmp_path / "all.parquet"
    assert (
        run(
            "grid",
            "--model",
            "gpt3-13b",
            "--gpus",
            "64",
            "--global-batch",
            "512",
            "--tp",
            "2,4",
            "--pp",
            "1,2",
            "--zero",
            "1",
            "--recompute",
            "none,full",
            "--sequence-parallel",
            "on",
            "--out",
            str(pq),
        ).exit_code
        == 0
    )
    assert len(pd.read_parquet(pq)) == len(df)


def test_gpu_sweep_gives_a_scaling_curve():
    doc = _json(
        "grid",
        "--model",
        "gpt3-13b",
        "--gpus",
        "64,128,...,512",
        "--global-batch",
        "1024",
        "--recompute",
        "full",
        "--zero",
        "1",
    )
    assert [p["num_gpus"] for p in doc["sweep"]] == [64, 128, 256, 512]
    front = doc["pareto_gpus"]
    assert [p["num_gpus"] for p in front] == sorted(p["num_gpus"] for p in front)
    assert all(
        a["tokens_per_s"] < b["tokens_per_s"] for a, b in zip(front, front[1:], strict=False)
    )
    assert doc["best"]["num_gpus"] == 512


def test_hardware_sweep_names_the_cheapest_per_token():
    doc = _json(
        "grid",
        "--model",
        "gpt3-13b",
        "--gpus",
        "64",
        "--global-batch",
        "512",
        "--hardware",
        "a100-80gb,h100-sxm",
        "--recompute",
        "full",
        "--zero",
        "1",
    )
    costs = {d["hardware"]: d["cost_per_million_tokens_usd"] for d in doc["cost_by_hardware"]}
    assert set(costs) == {"a100-80gb", "h100-sxm"}
    assert doc["cheapest_hardware"]["hardware"] == min(costs, key=costs.get)
    # $/Mtok = price · GPUs · step time / tokens · 1e6
    c = doc["cheapest_hardware"]
    price = float(load_hardware(c["hardware"]).spec.price_per_device_hour_usd)
    tokens = c["global_batch_size"] * 2048
    assert c["cost_per_million_tokens_usd"] == pytest.approx(
        price * 64 * c["step_time_s"] / 3600 / tokens * 1e6, rel=1e-5
    )


def test_distir_cost_model_uses_its_grid_and_formulas():
    from perfmodel.step.distir import distir_grid_columns, distir_step_time

    doc = _json(
        "grid",
        "--cost-model",
        "distir",
        "--model",
        "mlp-small",
        "--gpus",
        "8",
        "--global-batch",
        "128",
    )
    cols = distir_grid_columns(8, 128)
    assert doc["evaluated"] == len(cols["dp"])
    assert {t["cost_model"] for t in doc["top"]} == {"distir"}
    # every (dp, tp, pp) is a power of two
    for t in doc["top"]:
        assert all(v & (v - 1) == 0 for v in (t["dp"], t["tp"], t["pp"]))
        assert (t["num_microbatches"] == 1) == (t["pp"] == 1)
    best = doc["best"]
    i = next(
        j
        for j in range(len(cols["dp"]))
        if all(cols[k][j] == best[k] for k in ("dp", "tp", "pp", "num_microbatches"))
    )
    s = make_strategy(**{k: float(v[i]) for k, v in cols.items()})
    m = load_model("mlp-small")
    hw = load_hardware("a100-80gb")
    one = jax.jit(distir_step_time)(m.spec, hw.spec, hw.constants, s)
    assert best["step_time_s"] == pytest.approx(float(one.step_time_s), rel=1e-6)
    aisim_doc = _json(
        "grid",
        "--model",
        "mlp-small",
        "--gpus",
        "8",
        "--global-batch",
        "128",
        "--zero",
        "0",
        "--recompute",
        "none",
        "--tp",
        "1",
        "--pp",
        "1",
    )
    assert aisim_doc["best"]["cost_model"] == "aisim"
    assert aisim_doc["best"]["step_time_s"] != pytest.approx(best["step_time_s"], rel=1e-3)


@pytest.mark.parametrize(
    "args, needle",
    [
        (("--tp", "0"), "--tp"),
        (("--zero", "5"), "--zero"),
        (("--recompute", "sometimes"), "--recompute"),
        (("--schedule", "zigzag"), "--schedule"),
        (("--sequence-parallel", "maybe"), "--sequence-parallel"),
        (("--fused-attention", "maybe"), "--fused-attention"),
        (("--dtype", "int4"), "--dtype"),
        (("--gpus", "64,x"), "--gpus"),
        (("--out", "grid.txt"), "--out"),
        (("--plot", "grid.pdf"), "--plot"),
        (("--model", "gpt-9"), "gpt-9"),
        (("--hardware", "tpu-v9"), "tpu-v9"),
        (("--cost-model", "calculon"), "--cost-model"),
        (("--top", "0"), "--top"),
        (("--rank-by", "vibes"), "--rank-by"),
        (("--gpus-per-node", "0"), "--gpus-per-node"),
        (("--layers", "0"), "--layers"),
        (("--micro-batch", "0"), "--micro-batch"),
        (("--global-batch", "0"), "--global-batch"),
        (("--stack", "megatron-core,mcore"), "different stacks"),
        (("--stack", "nemo,titan", "--profile", "p.json"), "one stack with --profile"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, needle):
    r = run("grid", *args)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.output


def test_nothing_feasible_says_why_exit_1():
    r = run("grid", "--gpus", "8", "--global-batch", "8")
    assert r.exit_code == 1
    msg = " ".join(r.stderr.split())
    assert "need at least 33 × 80 GiB per replica" in msg and "smallest ZeRO-3 footprint" in msg
    assert "Traceback" not in r.output
    r = run("grid", "--tp", "3", "--pp", "1")
    assert r.exit_code == 1 and "tp does not divide the number of GPUs" in " ".join(
        r.stderr.split()
    )


def test_rank_by_cost_orders_by_price_per_token():
    doc = _json(
        "grid",
        "--model",
        "gpt3-13b",
        "--gpus",
        "64",
        "--global-batch",
        "512",
        "--rank-by",
        "cost",
        "--recompute",
        "full",
        "--zero",
        "1",
        "--top",
        "5",
    )
    costs = [t["cost_per_million_tokens_usd"] for t in doc["top"]]
    assert costs == sorted(costs) and np.isfinite(costs).all()


def test_a_rule_an_option_lifts_names_the_option():
    args = ("grid", "--model", "gpt3-13b", "--gpus", "64", "--global-batch", "512")
    r = run(*args, "--tp", "8", "--gpus-per-node", "4")
    assert r.exit_code == 1
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "tp crosses a node of 4 GPUs" in lines[0]
    assert lines[0].endswith("pass --allow-cross-node-tp")
    doc = _json(*args, "--tp", "4,8", "--gpus-per-node", "4", "--zero", "1", "--top", "1")
    assert doc["infeasible_reasons"]["tp crosses a node of 4 GPUs (pass --allow-cross-node-tp)"]


@pytest.mark.slow  # one grid compiled under each of two stacks
def test_several_stacks_are_sweep_points_each_as_its_own_grid_ranks_it():
    # --stack a,b searches the grid under each stack and ranks them together: each stack's
    # best is what the grid under that stack alone finds, with that stack's constants
    common = ("--model", "gpt3-1.3b", "--hardware", "h100-sxm", "--gpus", "8",
              "--global-batch", "64", "--json")  # fmt: skip
    both = json.loads(run("grid", *common, "--stack", "nemo,titan", "--top", "5").output)
    assert {r["stack"] for r in both["top"]} <= {"megatron-core@nemo", "torchtitan"}
    assert [p["stack"] for p in both["sweep"]] == ["megatron-core@nemo", "torchtitan"]
    for stack, point in zip(("megatron-core@nemo", "torchtitan"), both["sweep"], strict=True):
        alone = json.loads(run("grid", *common, "--stack", stack, "--top", "5").output)["best"]
        assert point["step_time_s"] == alone["step_time_s"]
        assert point["step_time_s_hi"] == alone["step_time_s_hi"]  # its own covariance
        assert strategy_label_of(point) == strategy_label_of(alone)
    assert both["best"]["step_time_s"] == min(p["step_time_s"] for p in both["sweep"])


def strategy_label_of(row: dict) -> tuple:
    return tuple(row[k] for k in KNOB_KEYS)
