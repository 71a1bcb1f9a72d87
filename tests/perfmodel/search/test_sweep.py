"""perfmodel's front doors, ``sweep`` and ``estimate``: named results that agree with the
one-strategy model, and errors as data (the parameter's name, never a command-line flag)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from perfmodel import (
    AisimError,
    Estimate,
    SweepResult,
    load_hardware,
    load_model,
    make_strategy,
    plot_sweep,
    resolve_model,
    step_time,
    strategy_label,
    sweep,
)
from perfmodel import estimate as estimate_one
from perfmodel.step.distir import distir_grid_columns

# a small, quick grid: GPT-3 13B on 64 A100s, ZeRO-1, full recomputation
SMALL = dict(num_gpus=64, global_batch=512, zero=[1], recompute=["full"])


@pytest.fixture(scope="module")
def small() -> SweepResult:
    return sweep("gpt3-13b", "a100-80gb", top=5, keep_all=True, **SMALL)


def test_sweep_result_is_named_and_ranked(small):
    assert small.best == small.top[0] and len(small.top) == 5
    tokens = [r["tokens_per_s"] for r in small.top]
    assert tokens == sorted(tokens, reverse=True)
    assert small.evaluated >= small.feasible > 5
    assert len(small.all_feasible) == small.feasible
    assert small.all_feasible["tokens_per_s"].max() == pytest.approx(tokens[0], rel=1e-6)
    assert {r["zero_stage"] for r in small.top} == {1}
    assert {r["recompute"] for r in small.top} == {"full"}
    # one point (one GPU count, one batch, one hardware): no per-point table, no cost ranking
    assert small.best_per_point == [] and small.pareto_gpus == [] and small.cost_by_hardware == []
    assert small.cheapest_hardware is None
    doc = small.to_dict()
    assert list(doc) == [
        "best",
        "top",
        "evaluated",
        "feasible",
        "seconds",
        "pareto",
        "infeasible_reasons",
    ]
    front = small.pareto
    assert all(
        a["memory"]["total_bytes"] <= b["memory"]["total_bytes"]
        and a["tokens_per_s"] < b["tokens_per_s"]
        for a, b in zip(front, front[1:], strict=False)
    )


def test_grid_best_equals_one_strategy_estimate(small):
    b = small.best
    one = estimate_one(
        "gpt3-13b",
        "a100-80gb",
        num_gpus=b["num_gpus"],
        tp=b["tp"],
        pp=b["pp"],
        global_batch=b["global_batch_size"],
        micro_batch_size=b["micro_batch_size"],
        schedule=b["schedule"],
        interleave=b["interleave"],
        zero_stage=b["zero_stage"],
        recompute=b["recompute"],
        sequence_parallel=b["sequence_parallel"],
    )
    assert isinstance(one, Estimate)
    doc = one.to_dict()
    assert doc["step_time_s"] == pytest.approx(b["step_time_s"], rel=1e-6)
    assert doc["breakdown"] == pytest.approx(b["breakdown"], rel=1e-6)
    assert (doc["model"], doc["hardware"], doc["cost_model"]) == ("gpt3-13b", "a100-80gb", "aisim")
    # a built strategy gives the same numbers as the knobs
    s = make_strategy(
        dp=b["dp"],
        tp=b["tp"],
        pp=b["pp"],
        micro_batch_size=b["micro_batch_size"],
        num_microbatches=b["num_microbatches"],
        interleave=b["interleave"],
        schedule=b["schedule"],
        zero_stage=b["zero_stage"],
        recompute=b["recompute"],
        sequence_parallel=b["sequence_parallel"],
    )
    built = estimate_one(load_model("gpt3-13b"), load_hardware("a100-80gb"), s)
    assert built.step_time_s == pytest.approx(b["step_time_s"], rel=1e-6)


def test_gpu_and_hardware_sweep_fill_the_named_fields():
    calls = []
    r = sweep(
        "gpt3-13b",
        ["a100-80gb", "h100-sxm"],
        num_gpus=[64, 128],
        global_batch=512,
        zero=[1],
        recompute=["full"],
        tp=[2],
        progress=lambda i, n, what: calls.append((i, n, what)),
    )
    assert calls[0] == (0, 2, "gpt3-13b on a100-80gb") and calls[-1][:2] == (2, 2)
    assert len(r.searches) == 2 and [s.hardware.name for s in r.searches] == [
        "a100-80gb",
        "h100-sxm",
    ]
    assert {(p["hardware"], p["num_gpus"]) for p in r.best_per_point} == {
        (h, g) for h in ("a100-80gb", "h100-sxm") for g in (64, 128)
    }
    costs = [c["cost_per_million_tokens_usd"] for c in r.cost_by_hardware]
    assert costs == sorted(costs) and r.cheapest_hardware == r.cost_by_hardware[0]
    doc = r.to_dict()
    assert doc["cheapest_hardware"] == r.cheapest_hardware and "sweep" in doc


def test_constants_may_be_a_function_of_the_hardware(small):
    def slow(hw):
        return dataclasses.replace(
            hw.constants, kernel_overhead_s=hw.constants.kernel_overhead_s * 10
        )

    r = sweep("gpt3-13b", "a100-80gb", top=1, constants=slow, **SMALL)
    assert r.best["tokens_per_s"] < small.best["tokens_per_s"]


def test_distir_cost_model_searches_distir_grid():
    r = sweep("mlp-small", num_gpus=8, global_batch=128, cost_model="distir")
    assert r.evaluated == len(distir_grid_columns(8, 128)["dp"])
    assert {t["cost_model"] for t in r.top} == {"distir"}
    r = sweep("mlp-small", num_gpus=8, global_batch=128, cost_model="distir", tp=[1], pp=[1])
    assert {(t["tp"], t["pp"]) for t in r.top} == {(1, 1)}


def _error(fn, *args, **kwargs) -> AisimError:
    with pytest.raises(AisimError) as e:
        fn(*args, **kwargs)
    text = str(e.value)
    # a library speaks of its own parameters, never of a command line
    assert "--" not in text and "command line" not in text, text
    return e.value


@pytest.mark.parametrize(
    "kwargs, field, value",
    [
        (dict(cost_model="calculon"), "cost_model", "calculon"),
        (dict(rank_by="vibes"), "rank_by", "vibes"),
        (dict(top=0), "top", 0),
        (dict(zero=[5]), "zero_stage", 5),
        (dict(zero_stage=[5]), "zero_stage", 5),
        (dict(schedule=["zigzag"]), "schedule", "zigzag"),
        (dict(recompute=["sometimes"]), "recompute", "sometimes"),
        (dict(dtype=["int4"]), "dtype", "int4"),
        (dict(tp=[0]), "tp", 0),
        (dict(num_gpus=[0]), "num_gpus", 0),
        (dict(gpus_per_node=0), "gpus_per_node", 0),
    ],
)
def test_sweep_errors_are_data(kwargs, field, value):
    e = _error(sweep, "gpt3-13b", **({"num_gpus": 64, "global_batch": 512} | kwargs))
    assert (e.source, e.field, e.value, e.usage) == (None, field, value, True)


def test_nothing_feasible_says_why():
    e = _error(sweep, num_gpus=8, global_batch=8)
    assert not e.usage and "need at least 33 × 80 GiB per replica" in str(e)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(tp=5, num_gpus=40), "tp"),
        (dict(global_batch=1537, num_gpus=1024, tp=8, pp=8), "global_batch_size"),
        (dict(global_batch_size=1537, num_gpus=1024, tp=8, pp=8), "global_batch_size"),
        (dict(zero_stage=5), "zero_stage"),
        (dict(recompute="sometimes"), "recompute"),
    ],
)
def test_estimate_errors_name_its_parameters(kwargs, field):
    e = _error(estimate_one, "gpt3-175b", **kwargs)
    assert e.source is None and e.field == field


def test_estimate_refuses_a_strategy_and_knobs_together():
    e = _error(estimate_one, "gpt3-13b", None, make_strategy(), tp=2)
    assert "{strategy}" not in e.render() and "strategy" in e.render()


def test_resolve_model_errors_are_data_and_render_with_the_callers_names():
    e = _error(resolve_model, "custom", num_layers=4)
    assert (e.field, e.value) == ("model", "custom")
    flags = {"hidden_size": "--hidden", "num_heads": "--heads", "vocab_size": "--vocab"}
    line = e.render(flags)
    assert "--hidden" in line and "--heads" in line and "--vocab" in line
    e = _error(resolve_model, widths="784,x")
    assert (e.field, e.value) == ("widths", "784,x")
    e = _error(resolve_model, widths="784,200,100,10")
    assert e.field == "widths" and "equal hidden widths" in e.expected
    e = _error(resolve_model, params="3")
    assert e.field == "params"
    e = _error(resolve_model, num_layers=0)
    assert (e.field, e.value) == ("num_layers", 0)
    e = _error(resolve_model, "gpt3-13b", params="60M")
    assert "model" in e.render() and "params" in e.render()
    e = _error(
        resolve_model, "custom", num_layers=2, hidden_size=10, num_heads=3, seq_len=8, vocab_size=10
    )
    assert e.source is None and e.field == "hidden_size"


def test_resolve_model_builds_each_kind():
    assert resolve_model().name == "gpt3-175b"
    custom = resolve_model(
        "custom", num_layers=4, hidden_size=256, num_heads=4, seq_len=128, vocab_size=1000
    )
    assert custom.spec.kind == "transformer" and int(custom.spec.hidden_size) == 256
    assert resolve_model(widths="784,200,200,10").spec.kind == "mlp"
    assert float(resolve_model("gpt3-13b", seq_len=4096).spec.seq_len) == 4096
    hw = load_hardware("a100-80gb")
    s = make_strategy(tp=1, micro_batch_size=2, num_microbatches=1)
    mlp = resolve_model(params="60M")
    assert estimate_one(mlp, hw, s).step_time_s == pytest.approx(
        float(step_time(mlp.spec, hw.spec, hw.constants, s).step_time_s), rel=1e-6
    )


def test_strategy_label_short_and_long():
    r = dict(
        dp=32,
        tp=4,
        pp=8,
        micro_batch_size=1,
        num_microbatches=6,
        interleave=6,
        schedule="interleaved",
        zero_stage=1,
        recompute="full",
        sequence_parallel=True,
        dtype="bf16",
        dp_overlap=True,
        fused_attention=False,
    )
    assert strategy_label(r) == "dp32 tp4 pp8 v6 mb1 Z1 SP full"
    assert strategy_label(r, short=False) == "dp32 tp4 pp8 mbs1 m6 interleaved v6 zero1 full sp"
    r.update(schedule="gpipe", interleave=1, dtype="fp16", dp_overlap=False, fused_attention=True)
    assert strategy_label(r) == "dp32 tp4 pp8 gpipe mb1 Z1 SP full fp16 no-ovl FA"


def test_plot_sweep_writes_a_png_atomically(small, tmp_path):
    png = tmp_path / "grid.png"
    plot_sweep(small, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*.tmp"))
    assert np.isfinite(small.best["tokens_per_s"])


def test_a_rule_that_a_parameter_lifts_is_named_as_data():
    e = _error(sweep, "gpt3-13b", num_gpus=64, global_batch=512, tp=[8], gpus_per_node=4)
    assert e.hint == "pass {allow_cross_node_tp}" and not e.usage
    r = sweep(
        "gpt3-13b", num_gpus=64, global_batch=512, tp=[4, 8], gpus_per_node=4, zero=[1], top=1
    )
    assert r.lifted_by == {"tp crosses a node of 4 GPUs": "allow_cross_node_tp"}
    assert r.infeasible_reasons["tp crosses a node of 4 GPUs"] > 0
    lifted = sweep(
        "gpt3-13b",
        num_gpus=64,
        global_batch=512,
        tp=[4, 8],
        gpus_per_node=4,
        zero=[1],
        top=1,
        allow_cross_node_tp=True,
    )
    assert lifted.lifted_by == {} and lifted.feasible > r.feasible


def test_a_stack_whose_every_row_the_hardware_prunes_is_refused_with_the_reason():
    """The NeMo recipe trains in bf16, which a V100 lacks: every row is pruned before the stack
    splits the grid, and the sweep says so (it used to fail concatenating no parts)."""
    from simbase.errors import AisimError

    with pytest.raises(AisimError, match="dtype is not supported by the hardware"):
        sweep("gpt3-13b", "v100-32gb", stack="megatron-core@nemo", num_gpus=64, global_batch=256)
