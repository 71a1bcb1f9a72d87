"""The strategy options of `aisim perf estimate` and `perf grid` (derived from the knob registry
by :mod:`aisim.options`): the parallel degrees, shard group and stack switches reach the
strategy as the library's knobs do, a bad one is one line naming its flag, and the grid's
comma lists become axes (the rules themselves: tests/perfmodel/specs/test_validate.py)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from aisim.app import app
from perfmodel import estimate
from perfmodel.specs.model import model_from_dict

runner = CliRunner()
MOE_DOC = {
    "name": "tiny-moe",
    "kind": "transformer",
    "num_layers": 8,
    "hidden_size": 512,
    "num_heads": 16,
    "num_kv_heads": 8,
    "ffn_hidden_size": 1024,
    "seq_len": 1024,
    "vocab_size": 4096,
    "num_experts": 16,
    "experts_per_token": 2,
    "moe_ffn_hidden_size": 256,
    "dropout": False,
}


def _model_file(tmp_path):
    path = tmp_path / "tiny-moe.json"
    path.write_text(json.dumps(MOE_DOC))
    return str(path)


BASE = ["--hardware", "h100-sxm", "--gpus", "16", "--tp", "2", "--pp", "1",
        "--global-batch", "32", "--recompute", "none"]  # fmt: skip


def test_estimate_flags_reach_the_strategy(tmp_path):
    args = ["perf", "estimate", "--model-file", _model_file(tmp_path), *BASE]
    args += ["--cp", "2", "--ep", "4", "--etp", "2", "--zero", "3", "--shard-size", "4"]
    args += ["--tp-overlap", "--grad-reduce-dtype", "bf16", "--moe-imbalance", "1.2"]
    args += ["--moe-dispatch", "allgather", "--moe-overlap", "--cp-comm", "allgather"]
    args += ["--no-reshard-after-forward", "--json"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert (doc["dp"], doc["tp"], doc["cp"], doc["ep"], doc["etp"]) == (4, 2, 2, 4, 2)
    assert doc["shard_size"] == 4 and doc["tp_overlap"] and doc["moe_overlap"]
    assert doc["grad_reduce_fp32"] is False and doc["fsdp_reshard"] is False
    assert doc["moe_dispatch"] == "allgather" and doc["cp_comm"] == "allgather"
    assert doc["moe_imbalance"] == pytest.approx(1.2)
    lib = estimate(
        model_from_dict(MOE_DOC, "tiny-moe"), "h100-sxm", num_gpus=16, tp=2, global_batch=32,
        cp=2, ep=4, etp=2, zero_stage=3, shard_size=4, tp_overlap=True, grad_reduce_fp32=False,
        moe_imbalance=1.2, moe_dispatch="allgather", moe_overlap=True, cp_comm="allgather",
        fsdp_reshard=False,
    )  # fmt: skip
    assert doc["step_time_s"] == pytest.approx(lib.step_time_s, rel=1e-6)


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--model", "gpt3-175b", "--ep", "2"], "--ep"),
        (["--cp", "3"], "--cp"),
        (["--ep", "3"], "--ep"),
        (["--shard-size", "4"], "--shard-size"),
        (["--recompute-layers", "2"], "--recompute-layers"),
        (["--grad-reduce-dtype", "fp64"], "--grad-reduce-dtype"),
        (["--moe-imbalance", "0.5"], "--moe-imbalance"),
        (["--moe-dispatch", "ring"], "--moe-dispatch"),
        (["--cp-comm", "tree"], "--cp-comm"),
    ],
)
def test_bad_new_flag_is_one_line_naming_it(tmp_path, extra, flag):
    model = [] if "--model" in extra else ["--model-file", _model_file(tmp_path)]
    r = runner.invoke(app, ["perf", "estimate", *model, *BASE, *extra])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and flag in lines[0], r.output


@pytest.mark.slow  # a grid over cp, ep, shard size and tp: its own program
def test_grid_comma_lists_become_axes(tmp_path):
    args = ["perf", "grid", "--model-file", _model_file(tmp_path), "--hardware", "h100-sxm"]
    args += ["--gpus", "16", "--global-batch", "32", "--cp", "1,2", "--ep", "1,4"]
    args += ["--shard-size", "0,4", "--zero", "3", "--tp", "1,2", "--top", "200", "--json"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    top = json.loads(r.output)["top"]
    assert {t["cp"] for t in top} == {1, 2} and {t["ep"] for t in top} == {1, 4}
    assert {t["shard_size"] for t in top} == {0, 4}
    for t in top:
        assert t["dp"] * t["tp"] * t["pp"] * t["cp"] == 16


def test_grid_crosses_ep_by_default_for_a_moe_model(tmp_path):
    args = ["perf", "grid", "--model-file", _model_file(tmp_path), "--hardware", "h100-sxm"]
    args += ["--gpus", "16", "--global-batch", "32", "--tp", "1", "--pp", "1", "--top", "500"]
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    # tp·cp·dp = 16 ranks: every divisor of the 16 experts fits
    assert {t["ep"] for t in json.loads(r.output)["top"]} == {1, 2, 4, 8, 16}


def test_bad_grid_list_names_the_flag(tmp_path):
    for extra, flag in ((["--cp", "0"], "--cp"), (["--moe-imbalance", "x"], "--moe-imbalance")):
        r = runner.invoke(app, ["perf", "grid", "--model", "gpt3-1.3b", *extra])
        assert r.exit_code == 2, r.output
        assert flag in r.output, r.output
