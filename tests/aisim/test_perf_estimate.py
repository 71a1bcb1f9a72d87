"""`aisim perf estimate` through the CLI: the JSON document against the library, the model's
attention kernel and DistIR's cost model, user model and hardware files, and bad input (one
line, exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from aisim.app import app
from perfmodel import estimate, load_hardware, load_model, make_strategy, step_time
from perfmodel.step.distir import distir_step_time

runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args))


def test_estimate_json_matches_library_and_has_required_keys():
    r = run(
        "perf",
        "estimate",
        "--model",
        "megatron-22B",
        "--hardware",
        "A100-80GB",
        "--gpus",
        "8",
        "--tp",
        "8",
        "--pp",
        "1",
        "--global-batch",
        "4",
        "--micro-batch",
        "4",
        "--recompute",
        "selective",
        "--sequence-parallel",
        "--json",
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    for key in (
        "step_time_s",
        "throughput_samples_per_s",
        "tokens_per_s",
        "mfu",
        "hfu",
        "memory_per_device_bytes",
        "feasible",
        "breakdown",
    ):
        assert key in doc
    hw = load_hardware("a100-80gb")
    s = make_strategy(
        tp=8, micro_batch_size=4, num_microbatches=1, recompute="selective", sequence_parallel=True
    )
    out = step_time(load_model("megatron-22b").spec, hw.spec, hw.constants, s)
    assert doc["step_time_s"] == pytest.approx(float(out.step_time_s), rel=1e-5)
    assert doc["throughput_samples_per_s"] == pytest.approx(4 / doc["step_time_s"], rel=1e-5)
    assert sum(v for k, v in doc["breakdown"].items() if k != "step_time_s") == pytest.approx(
        doc["step_time_s"], rel=1e-5
    )
    assert doc["fused_attention"] is False
    # --fused-attention reaches the model: the library's number, and the knob in the document
    r = run(
        "perf",
        "estimate",
        "--model",
        "megatron-22B",
        "--gpus",
        "8",
        "--tp",
        "8",
        "--pp",
        "1",
        "--global-batch",
        "4",
        "--micro-batch",
        "4",
        "--recompute",
        "none",
        "--fused-attention",
        "--json",
    )
    assert r.exit_code == 0, r.output
    fa = json.loads(r.output)
    assert fa["fused_attention"] is True
    s = make_strategy(
        tp=8, micro_batch_size=4, num_microbatches=1, recompute="none", fused_attention=True
    )
    out = step_time(load_model("megatron-22b").spec, hw.spec, hw.constants, s)
    assert fa["step_time_s"] == pytest.approx(float(out.step_time_s), rel=1e-5)


def test_estimate_table_for_people():
    r = run("perf", "estimate")
    assert r.exit_code == 0, r.output
    assert "step time" in r.output and "MFU" in r.output


@pytest.mark.slow  # two stacks: two step programs
def test_an_estimate_under_several_stacks_is_each_stack_alone():
    base = ("perf", "estimate", "--model", "gpt3-1.3b", "--gpus", "8", "--tp", "2",
            "--global-batch", "64")  # fmt: skip
    r = run(*base, "--stack", "nemo,titan", "--json")
    assert r.exit_code == 0, r.output
    docs = json.loads(r.output)
    assert [d["stack"] for d in docs] == ["megatron-core@nemo", "torchtitan"]
    for name, doc in zip(("nemo", "titan"), docs, strict=True):
        alone = json.loads(run(*base, "--stack", name, "--json").output)
        assert alone["step_time_s"] == pytest.approx(doc["step_time_s"], rel=1e-6)
        assert alone["memory"]["total_bytes"] == pytest.approx(doc["memory"]["total_bytes"])
    r = run(*base, "--stack", "nemo,titan")
    assert r.exit_code == 0, r.output
    titles = [ln for ln in r.output.splitlines() if ln.startswith("gpt3-1.3b on 8 x a100-80gb")]
    assert [t.split("stack=")[1].split()[0] for t in titles] == ["megatron-core@nemo", "torchtitan"]
    r = run("perf", "sensitivity", "--stack", "nemo,titan")
    assert r.exit_code == 2 and "perf estimate, grid and compare take several" in r.output


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--tp", "5", "--gpus", "40", "--pp", "1"], "attention heads"),
        (["--tp", "8", "--pp", "3", "--gpus", "64"], "divisor of --gpus=64"),
        (["--global-batch", "1537"], "--global-batch"),
        (["--model", "gpt-4"], "did you mean"),
        (["--stack", "nemo,megatron-core@nemo"], "different stacks"),
        (["--hardware", "a100"], "a100-80gb"),
        (["--recompute", "sometimes"], "none, selective, full"),
        (["--zero", "5"], "one of 0, 1, 2, 3"),  # the stages there are
        (["--interleave", "13"], "interleave"),  # 8 x 13 chunks > 96 layers + 2
        (["--schedule", "1f1b", "--interleave", "2"], "interleave"),
        (["--cost-model", "calculon"], "--cost-model"),
        (["--layers", "0"], "--layers"),
        (["--widths", "784,x"], "--widths"),
        (["--params", "60M", "--model", "gpt3-13b"], "--params"),
        (["--gpus-per-node", "0"], "--gpus-per-node"),
        (["--micro-batch", "0"], "--micro-batch"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle):
    r = run("perf", "estimate", *args)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.output
    assert "Traceback" not in r.output


def _hw_doc():
    return json.loads(Path(load_hardware("a100-80gb").path).read_text())


def test_user_hardware_file_is_used_and_validated(tmp_path):
    doc = _hw_doc()
    doc["memory_bandwidth_gb_per_s"] = 4078.0  # twice the A100's HBM bandwidth
    f = tmp_path / "fast.json"
    f.write_text(json.dumps(doc))
    args = [
        "perf",
        "estimate",
        "--model",
        "gpt3-1.3b",
        "--gpus",
        "8",
        "--tp",
        "1",
        "--pp",
        "1",
        "--json",
    ]
    base = json.loads(run(*args).output)["step_time_s"]
    fast = json.loads(run(*args, "--hardware-file", str(f)).output)["step_time_s"]
    assert fast < base
    doc["memory_bandwidth_gb_per_s"] = -1
    f.write_text(json.dumps(doc))
    r = run(*args, "--hardware-file", str(f))
    assert r.exit_code == 2 and "memory_bandwidth_gb_per_s" in r.output and "GB/s" in r.output
    del doc["links"]["inter_node"]["bandwidth_gb_per_s"]
    doc["memory_bandwidth_gb_per_s"] = 2039
    f.write_text(json.dumps(doc))
    r = run(*args, "--hardware-file", str(f))
    assert r.exit_code == 2 and "links.inter_node.bandwidth_gb_per_s" in r.output
    # 1e30 TFLOP/s overflowed the float32 model before it was refused (issue 29)
    doc = _hw_doc()
    doc["peak_tflops"]["fp32"] = 1e30
    f.write_text(json.dumps(doc))
    r = run(*args, "--hardware-file", str(f))
    assert (
        r.exit_code == 2
        and "'peak_tflops.fp32' = 1e+30: expected a number in TFLOP/s up to" in r.output
    )


def test_user_model_file_is_validated(tmp_path):
    f = tmp_path / "m.json"
    f.write_text(
        json.dumps(
            {
                "kind": "transformer",
                "num_layers": 4,
                "hidden_size": -64,
                "num_heads": 4,
                "seq_len": 128,
                "vocab_size": 1000,
            }
        )
    )
    r = run("perf", "estimate", "--model-file", str(f), "--gpus", "1", "--tp", "1", "--pp", "1")
    assert r.exit_code == 2 and "hidden_size" in r.output and "-64" in r.output
    f.write_text(
        json.dumps(
            {
                "kind": "transformer",
                "num_layers": 4,
                "hidden_size": 64,
                "num_heads": 4,
                "vocab_size": 1000,
            }
        )
    )
    r = run("perf", "estimate", "--model-file", str(f), "--gpus", "1", "--tp", "1", "--pp", "1")
    assert r.exit_code == 2 and "seq_len" in r.output
    f.write_text("{not json")
    r = run("perf", "estimate", "--model-file", str(f), "--gpus", "1", "--tp", "1", "--pp", "1")
    assert r.exit_code == 2 and "not valid JSON" in r.output


def test_custom_model_and_params_mlp():
    r = run(
        "perf",
        "estimate",
        "--model",
        "custom",
        "--layers",
        "4",
        "--hidden",
        "256",
        "--heads",
        "4",
        "--seq-len",
        "128",
        "--vocab",
        "1000",
        "--gpus",
        "1",
        "--tp",
        "1",
        "--pp",
        "1",
        "--json",
    )
    assert r.exit_code == 0, r.output
    r = run(
        "perf",
        "estimate",
        "--model",
        "custom",
        "--layers",
        "4",
        "--gpus",
        "1",
        "--tp",
        "1",
        "--pp",
        "1",
    )
    assert r.exit_code == 2 and "--hidden" in r.output
    r = run(
        "perf",
        "estimate",
        "--params",
        "60M",
        "--gpus",
        "2",
        "--tp",
        "1",
        "--pp",
        "1",
        "--global-batch",
        "64",
        "--json",
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["params"] == pytest.approx(60e6, rel=0.01)


def test_profile_for_other_hardware_names_the_option_to_pass(tmp_path):
    from calibration.profile import PROFILE_SCHEMA

    f = tmp_path / "p.json"
    f.write_text(json.dumps({"schema": PROFILE_SCHEMA, "hardware": "a100-80gb", "constants": {}}))
    for cmd in (["estimate"], ["grid", "--model", "gpt3-13b", "--gpus", "64"]):
        r = run("perf", *cmd, "--profile", str(f), "--hardware", "h100-sxm")
        assert r.exit_code == 2, r.output
        lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
        assert len(lines) == 1 and str(f) in lines[0] and "pass --hardware a100-80gb" in lines[0]
    r = run("perf", "estimate", "--profile", str(f), "--json")
    assert r.exit_code == 0 and json.loads(r.output)["hardware"] == "a100-80gb"


def test_the_cli_default_and_its_override():
    args = ["perf", "estimate", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8"]
    args += ["--tp", "1", "--pp", "1", "--global-batch", "8", "--recompute", "full", "--json"]
    on = json.loads(runner.invoke(app, args).stdout)
    off = json.loads(runner.invoke(app, [*args, "--no-fused-attention"]).stdout)
    assert on["fused_attention"] is True
    assert off["fused_attention"] is False
    assert on["step_time_s"] < off["step_time_s"]
    knobs = dict(hardware="h100-sxm", num_gpus=8, tp=1, pp=1, global_batch=8, recompute="full")
    assert np.isclose(on["step_time_s"], estimate("llama3-8b", **knobs).to_dict()["step_time_s"])


def test_cli_estimate_cost_model_distir():
    res = CliRunner().invoke(
        app,
        [
            "perf",
            "estimate",
            "--model",
            "mlp-small",
            "--cost-model",
            "distir",
            "--gpus",
            "4",
            "--tp",
            "1",
            "--pp",
            "1",
            "--global-batch",
            "128",
            "--micro-batch",
            "32",
            "--dtype",
            "fp16",
            "--recompute",
            "none",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["cost_model"] == "distir"
    assert doc["throughput_samples_per_s"] == pytest.approx(121.73, rel=0.005)


def test_cli_estimate_distir_takes_tp_that_only_fits_distirs_rule():
    # gpt2 has 12 heads: tp 8 is DistIR-valid (heads >= tp) but not a Megatron split of the heads.
    args = [
        "perf",
        "estimate",
        "--model",
        "gpt2",
        "--gpus",
        "8",
        "--tp",
        "8",
        "--pp",
        "1",
        "--global-batch",
        "8",
        "--micro-batch",
        "8",
        "--dtype",
        "fp16",
        "--json",
    ]
    res = CliRunner().invoke(app, [*args, "--cost-model", "distir"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    gpt2 = load_model("gpt2").spec
    hw = load_hardware("a100-80gb")
    one = distir_step_time(gpt2, hw.spec, hw.constants, make_strategy(tp=8, micro_batch_size=8))
    assert doc["valid"] and doc["step_time_s"] == pytest.approx(float(one.step_time_s), rel=1e-6)
    aisim = CliRunner().invoke(app, [*args, "--cost-model", "aisim"])
    assert (
        aisim.exit_code == 2 and "a divisor of the number of attention heads (12)" in aisim.output
    )
    over = CliRunner().invoke(
        app,
        [
            "perf",
            "estimate",
            "--model",
            "gpt2",
            "--gpus",
            "16",
            "--tp",
            "16",
            "--pp",
            "1",
            "--cost-model",
            "distir",
        ],
    )
    assert over.exit_code == 2 and "at most the number of attention heads (12" in over.output


def test_without_a_layout_a_model_the_default_layout_cannot_take_gets_the_grids_best():
    # the default run's tp 8 x pp 8 is 64 GPUs: on 8 GPUs, with no layout given, estimate takes
    # the strategy perf grid ranks first for the same fixed knobs, and says what it chose
    common = ("--model", "llama3-8b", "--gpus", "8", "--global-batch", "64", "--json")
    r = run("perf", "estimate", *common)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    g = run("perf", "grid", *common, "--top", "1")
    assert g.exit_code == 0, g.output
    best = json.loads(g.output)["best"]
    assert doc["step_time_s"] == best["step_time_s"] and doc["feasible"]
    assert doc["tp"] == best["tp"] and doc["pp"] == best["pp"] and doc["auto"]["tp"] == best["tp"]
    # a layout the user gives is never replaced: its error stands
    bad = run("perf", "estimate", *common[:-1], "--tp", "3")
    assert bad.exit_code == 2 and "'--tp' = 3" in bad.output
    # a layout the user gives is the whole layout: the degrees left out are 1, as in the
    # frameworks, not the default run's tp 8 x pp 8
    r = run("perf", "estimate", *common[:-1], "--pp", "2", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert (doc["tp"], doc["pp"], doc["dp"]) == (1, 2, 4) and "tp" not in doc["auto"]


def test_an_fsdp_stack_without_a_layout_shards_over_every_gpu_and_searches_where_that_fails():
    # plain FSDP trainers and torchtitan default to no tensor or pipeline parallelism: a run
    # named by its stack and GPU count is FSDP over all of them, not the default run's tp 8 x pp 8
    common = ("--hardware", "a100-80gb", "--gpus", "64", "--global-batch", "512", "--json")
    r = run("perf", "estimate", "--model", "llama2-70b", "--seq-len", "4096", *common,
            "--stack", "pytorch-fsdp")  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert (doc["dp"], doc["tp"], doc["pp"], doc["zero_stage"]) == (64, 1, 1, 3)
    assert doc["feasible"] and "tp" not in doc["auto"]
    # none of these trainers pipelines (accelerate's ParallelismConfig has no pp): a grid under
    # the stack searches pp 1 only, where torchtitan's crosses pp
    grid = ("perf", "grid", "--model", "llama2-70b", "--seq-len", "4096", *common, "--top", "50")
    top = json.loads(run(*grid, "--stack", "pytorch-fsdp").output)["top"]
    assert len(top) == 50 and {r["pp"] for r in top} == {1}
    assert {r["pp"] for r in json.loads(run(*grid, "--stack", "torchtitan").output)["top"]} != {1}
    # torchtitan's FSDP over 256 H100 cannot hold Llama 3 70B at 8K with its selective
    # recomputation: with no layout given, the estimate is the grid's best, which fits
    common = ("--hardware", "h100-sxm", "--gpus", "256", "--global-batch", "256")
    r = run("perf", "estimate", "--model", "llama3-70b", *common, "--stack", "torchtitan",
            "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    fsdp = run("perf", "estimate", "--model", "llama3-70b", *common, "--stack", "torchtitan",
               "--tp", "1", "--json")  # fmt: skip
    assert not json.loads(fsdp.output)["feasible"]
    assert doc["feasible"] and doc["tp"] * doc["pp"] > 1 and doc["auto"]["tp"] == doc["tp"]
