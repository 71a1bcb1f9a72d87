"""Today's knobs at the boundary: strategy_from_knobs checks each one against the model and the
GPU count and names the field; the CLI options reach the strategy and a bad one is one line
naming the flag; the grid's comma lists become axes; the table bolds the dominating term."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from aisim.app import app
from aisim.perf_grid import TERM_HEADERS, TOP_DROP, _drop_order, _term_cells
from perfmodel import BREAKDOWN_TERMS, estimate
from perfmodel.choices import CpComm, MoeDispatch
from perfmodel.knobs import strategy_from_knobs
from perfmodel.workload import model_from_dict
from simbase.errors import AisimError

runner = CliRunner()
SHAPE = dict(num_layers=8, num_heads=16, num_kv_heads=8)
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
MOE = dict(SHAPE, num_experts=16, seq_len=1024)


def knobs(**kw):
    return strategy_from_knobs(**(MOE | {"num_gpus": 64} | kw))


def error(**kw) -> AisimError:
    with pytest.raises(AisimError) as e:
        knobs(**kw)
    return e.value


def test_cp_is_a_factor_of_the_gpu_count():
    s = knobs(tp=2, pp=2, cp=4)
    assert float(s.dp) == 4 and float(s.num_gpus) == 64  # 64 = dp·tp·pp·cp
    e = error(tp=2, pp=2, cp=3)
    assert e.field == "cp" and e.value == 3
    e = error(tp=2, pp=2, cp=4, dp=8)
    assert e.field == "dp" and "tp·cp·pp" in e.expected and "4" in e.expected


def test_cp_splits_the_sequence_into_2cp_chunks():
    knobs(cp=8, seq_len=1024)  # 1024 % 16 == 0
    e = error(cp=8, seq_len=1000)  # 1000 % 16 != 0
    assert e.field == "cp" and "1000" in e.expected and "2·cp" in e.expected
    knobs(cp=4, seq_len=None)  # unknown sequence: not checked here (the step model masks it)


def test_expert_parallel_rules():
    s = knobs(tp=2, ep=8, etp=2)
    assert (float(s.ep), float(s.etp)) == (8, 2)
    e = error(ep=3)
    assert e.field == "ep" and "16 routed experts" in e.expected
    # tp·cp·dp = 2·1·4 = 8 ranks per stage (pp 8): ep·etp = 16 does not fit
    e = error(tp=2, pp=8, ep=16)
    assert e.field == "ep" and "tp·cp·dp" in e.expected
    e = error(tp=2, pp=8, ep=8, etp=2)
    assert e.field == "etp"
    for field in ("ep", "etp"):
        e = error(num_experts=0, **{field: 2})
        assert e.field == field and "no experts" in e.expected


def test_hsdp_shard_size_rules():
    s = knobs(zero_stage=3, shard_size=8)
    assert float(s.shard_size) == 8
    e = error(zero_stage=1, shard_size=8)
    assert e.field == "shard_size" and "ZeRO stage is 3" in e.expected
    e = error(zero_stage=3, shard_size=3)
    assert e.field == "shard_size" and "dp·cp = 64·1" in e.expected
    knobs(zero_stage=3, shard_size=16, cp=2)  # divides dp·cp = 32·2
    assert error(zero_stage=3, shard_size=-1).field == "shard_size"


def test_recompute_layers_and_imbalance_rules():
    s = knobs(pp=2, recompute="full", recompute_layers=4)
    assert float(s.recompute_layers) == 4
    e = error(pp=2, recompute="selective", recompute_layers=2)
    assert e.field == "recompute_layers" and "full" in e.expected
    e = error(pp=2, recompute="full", recompute_layers=5)  # 8 layers / pp 2 = 4 per stage
    assert e.field == "recompute_layers" and "4 layers of a stage" in e.expected
    e = error(moe_imbalance=0.9)
    assert e.field == "moe_imbalance"


def test_switch_defaults_and_choices():
    s = knobs()
    assert float(s.grad_reduce_fp32) == 1  # bf16: Megatron-Core reduces in fp32
    assert float(knobs(dtype="fp16").grad_reduce_fp32) == 0
    assert float(knobs(dtype="bf16", grad_reduce_fp32=False).grad_reduce_fp32) == 0
    s = knobs(cp=2, ep=4, moe_dispatch="allgather", cp_comm="allgather", fsdp_reshard=False)
    assert int(s.moe_dispatch) == MoeDispatch.ALLGATHER and int(s.cp_comm) == CpComm.ALLGATHER
    assert float(s.fsdp_reshard) == 0
    assert error(moe_dispatch="broadcast").field == "moe_dispatch"


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


def test_table_bolds_the_largest_term_of_each_row():
    rng = np.random.default_rng(1)
    for _ in range(5):
        b = dict(zip(BREAKDOWN_TERMS, rng.uniform(0, 1, len(BREAKDOWN_TERMS)), strict=True))
        cells = _term_cells(b)
        bold = [k for k, c in zip(BREAKDOWN_TERMS, cells, strict=True) if "[bold]" in c]
        assert bold == [max(b, key=b.get)]
    assert {"cp", "ep"} <= set(TERM_HEADERS.values())


def test_narrow_table_hides_empty_then_small_terms_first():
    """A MoE row whose ep term is large keeps ep after the zero terms and the smaller ones."""
    b = dict.fromkeys(BREAKDOWN_TERMS, 0.0) | dict(
        compute_s=10.0, ep_comm_s=2.0, dp_comm_exposed_s=0.5, optimizer_s=0.1
    )
    order = _drop_order([{"breakdown": b}])
    assert sorted(order) == sorted(TOP_DROP)
    zero = [TERM_HEADERS[k] for k in BREAKDOWN_TERMS if b[k] == 0]
    assert set(order[: len(zero)]) == set(zero)
    shown = [h for h in order if h in ("optim", "dp", "ep", "compute")]
    assert shown == ["optim", "dp", "ep", "compute"]  # smallest hidden first


def test_interleaved_chunks_may_split_the_layers_unevenly():
    """Qwen3-235B's 94 layers on pp 8 × 4 chunks (94 + embedding + loss = 32 chunks of 3) and
    on 8 × 5 (uneven: a custom Megatron-Core pipeline layout) are accepted, as the step model's
    validity accepts them; more chunks than the 94 layers, the embedding and the loss are not."""
    shape = dict(SHAPE, num_layers=94, num_gpus=64, pp=8, global_batch=64)
    s = strategy_from_knobs(**shape, interleave=4)
    assert (float(s.interleave), float(s.num_microbatches)) == (4, 8)
    assert float(strategy_from_knobs(**shape, interleave=5).interleave) == 5
    assert float(strategy_from_knobs(**shape, interleave=12).interleave) == 12  # 96 chunks
    with pytest.raises(AisimError) as e:
        strategy_from_knobs(**shape, interleave=13)  # 104 chunks > 96
    assert e.value.field == "interleave"
