"""`aisim perf estimate`, `aisim presets` and `--version` through the CLI, bad input included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aisim import __version__
from aisim.app import app
from perfmodel import (
    hardware_names,
    load_hardware,
    load_model,
    make_strategy,
    model_names,
    step_time,
)

runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args))


def test_version():
    r = run("--version")
    assert r.exit_code == 0 and __version__ in r.output


def test_presets_lists_everything():
    r = run("presets", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert [h["name"] for h in doc["hardware"]] == hardware_names()
    assert [m["name"] for m in doc["models"]] == model_names()
    for required in ("v100-32gb", "a100-40gb", "a100-80gb", "h100-sxm", "h200", "b200", "cpu-host"):
        assert required in hardware_names()
    r = run("presets", "hardware")
    assert r.exit_code == 0 and "a100-80gb" in r.output


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


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--tp", "5", "--gpus", "40", "--pp", "1"], "attention heads"),
        (["--tp", "8", "--pp", "3", "--gpus", "64"], "divisor of --gpus=64"),
        (["--global-batch", "1537"], "--global-batch"),
        (["--model", "gpt-3"], "did you mean"),
        (["--hardware", "a100"], "a100-80gb"),
        (["--recompute", "sometimes"], "none, selective, full"),
        (["--zero", "5"], "ZeRO stage"),
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
