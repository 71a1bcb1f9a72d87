"""`aisim perf sensitivity`, and `perf estimate --sensitivity` / `perf grid --sensitivity`,
through the CLI: the JSON document, the table, and the same numbers from each command (the
elasticities themselves: tests/perfmodel/plan/test_sensitivity.py)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from aisim.app import app

runner = CliRunner()


@pytest.mark.slow
def test_cli_json_keys_and_text():
    args = ("perf", "sensitivity", "--model", "gpt3-13b", "--gpus", "64", "--global-batch", "256")
    r = runner.invoke(app, [*args, "--tp", "4", "--pp", "4", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    e = doc["elasticities"]
    for key in (
        "peak_tflops.bf16",
        "memory_bandwidth_gb_per_s",
        "memory_capacity_gib",
        "links.inter_node.bandwidth_gb_per_s",
        "links.inter_node.latency_us",
        "matmul_efficiency_max",
    ):
        assert key in e
    assert doc["bound_by"] in e and doc["capacity"]["tiers"]["higher"]["capacity_gib"] == 96.0
    r = runner.invoke(app, [*args, "--best", "--no-capacity"])
    assert r.exit_code == 0, r.output
    assert "this run is bound by" in r.output and "best of the grid" in r.output
    r = runner.invoke(app, [*args, "--tp", "3"])
    assert r.exit_code == 2 and "--tp" in r.output and "Traceback" not in r.output


@pytest.mark.slow  # a several-second compile (pyproject's markers)
def test_cli_out_table(tmp_path):
    out = tmp_path / "e.csv"
    r = runner.invoke(
        app,
        ["perf", "sensitivity", "--model", "gpt3-13b", "--gpus", "64", "--global-batch", "256",
         "--tp", "4", "--pp", "4", "--no-capacity", "--out", str(out)],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert out.read_text().splitlines()[0] == "quantity,elasticity"
    r = runner.invoke(app, ["perf", "sensitivity", "--out", str(tmp_path / "e.txt")])
    assert r.exit_code == 2 and "--out" in r.output


def _json(args):
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


@pytest.mark.slow  # three commands, two compiling the sensitivity program
def test_estimate_sensitivity_block_equals_the_sensitivity_command():
    knobs = ("--model", "gpt3-13b", "--gpus", "64", "--global-batch", "256", "--tp", "4",
             "--pp", "4", "--recompute", "full")  # fmt: skip
    plain = _json(["perf", "estimate", *knobs])
    assert "elasticities" not in plain and "bound_by" not in plain  # opt-in
    doc = _json(["perf", "estimate", *knobs, "--sensitivity"])
    ref = _json(["perf", "sensitivity", *knobs, "--no-capacity"])
    assert doc["elasticities"] == pytest.approx(ref["elasticities"], rel=1e-6, abs=1e-9)
    assert doc["bound_by"] == ref["bound_by"] and doc["bound_by_text"] == ref["bound_by_text"]
    assert doc["step_time_s"] == pytest.approx(ref["step_time_s"])
    r = runner.invoke(app, ["perf", "estimate", *knobs, "--sensitivity"])
    assert r.exit_code == 0 and ref["bound_by_text"] in r.output.replace("\n", " ")


@pytest.mark.slow  # compiles a grid and the sensitivity Jacobian
def test_grid_best_sensitivity_equals_the_sensitivity_command_best():
    args = ("--model", "gpt3-13b", "--gpus", "64", "--global-batch", "256")
    assert "elasticities" not in _json(["perf", "grid", *args])["best"]
    best = _json(["perf", "grid", *args, "--sensitivity"])["best"]
    ref = _json(["perf", "sensitivity", *args, "--best", "--no-capacity"])
    assert best["step_time_s"] == pytest.approx(ref["step_time_s"])
    assert best["elasticities"] == pytest.approx(ref["elasticities"], rel=1e-6, abs=1e-9)
    assert best["bound_by"] == ref["bound_by"] and best["bound_by_text"] == ref["bound_by_text"]
    r = runner.invoke(app, ["perf", "grid", *args, "--sensitivity"])
    assert r.exit_code == 0 and "best strategy: this run is bound by" in r.output


@pytest.mark.slow
def test_best_keeps_every_knob_the_user_passed():
    """``--best`` searches only what the user left open: the knobs given, stack behaviours
    included, restrict the grid whose best is studied."""
    args = ("perf", "sensitivity", "--model", "gpt3-13b", "--gpus", "64", "--global-batch", "256")
    doc = _json([*args, "--best", "--no-capacity", "--tp", "2", "--recompute", "full", "--eager",
                 "--fused-attention", "--attention-kernel", "fa2"])  # fmt: skip
    assert doc["searched"] is True
    assert (doc["tp"], doc["recompute"]) == (2, "full")
    assert (doc["eager"], doc["fused_attention"], doc["attention_kernel"]) == (True, True, "fa2")
    one = _json([*args, "--no-capacity", "--tp", "2", "--pp", str(doc["pp"]), "--recompute",
                 "full", "--eager", "--fused-attention", "--attention-kernel", "fa2",
                 "--micro-batch", str(doc["micro_batch_size"]), "--zero", str(doc["zero_stage"]),
                 "--schedule", doc["schedule"], "--interleave", str(doc["interleave"]),
                 "--sequence-parallel" if doc["sequence_parallel"] else "--no-sequence-parallel",
                 ])  # fmt: skip
    assert one["step_time_s"] == pytest.approx(doc["step_time_s"], rel=1e-6)
    assert one["elasticities"] == pytest.approx(doc["elasticities"], rel=1e-6, abs=1e-9)


@pytest.mark.slow
def test_grid_sensitivity_studies_the_best_under_its_stack():
    """``perf grid --sensitivity`` re-evaluates the best row with its whole strategy, the stack
    behaviours the grid crossed included."""
    args = ("--model", "gpt3-13b", "--gpus", "64", "--global-batch", "256")
    best = _json(["perf", "grid", *args, "--eager", "on", "--fused-attention", "on",
                  "--attention-kernel", "fa2", "--sensitivity"])["best"]  # fmt: skip
    assert (best["eager"], best["attention_kernel"]) == (True, "fa2")
    ref = _json(["perf", "sensitivity", *args, "--best", "--no-capacity", "--eager",
                 "--fused-attention", "--attention-kernel", "fa2"])  # fmt: skip
    assert best["step_time_s"] == pytest.approx(ref["step_time_s"], rel=1e-6)
    assert best["elasticities"] == pytest.approx(ref["elasticities"], rel=1e-6, abs=1e-9)


@pytest.mark.slow
def test_without_a_layout_the_default_layout_that_cannot_fit_the_gpus_is_searched():
    # tp 8 x pp 8 (the default run) cannot be laid out on 8 GPUs: the grid's best is analysed
    args = ("--model", "llama3-8b", "--gpus", "8", "--global-batch", "64", "--no-capacity")
    r = CliRunner().invoke(app, ["perf", "sensitivity", *args, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["searched"] and doc["auto"]["tp"] == doc["tp"] and doc["num_gpus"] == 8
