"""The library boundary: named choices, errors as data (the field, the value, no CLI flag), the
cost-model registry, and a public API whose every name resolves and is documented."""

from __future__ import annotations

import inspect

import jax.numpy as jnp
import numpy as np
import pytest

import perfmodel
from perfmodel import (
    COST_MODELS,
    AisimError,
    Dtype,
    Recompute,
    Schedule,
    ZeroStage,
    enumerate_strategies,
    load_hardware,
    load_model,
    make_strategy,
    select_step_fn,
    step_time,
    strategy_from_knobs,
)
from perfmodel.specs.choices import RECOMPUTE_ALIASES
from perfmodel.step.distir import distir_step_time

# a 96-layer, 96-head model (GPT-3 175B's shape) on 64 GPUs
SHAPE = dict(num_layers=96, num_heads=96, num_kv_heads=96)


def _knobs(**kw):
    return strategy_from_knobs(**(SHAPE | {"num_gpus": 64} | kw))


# ---------------------------------------------------------------- named choices


@pytest.mark.parametrize(
    "choice, value, member",
    [
        (Schedule, "1F1B", Schedule.ONE_F_ONE_B),
        (Schedule, " interleaved ", Schedule.INTERLEAVED),
        (Schedule, 0, Schedule.GPIPE),
        (Schedule, 2.0, Schedule.INTERLEAVED),
        (ZeroStage, "3", ZeroStage.PARAMETERS),
        (ZeroStage, 1, ZeroStage.OPTIMIZER),
        (Recompute, "selective", Recompute.SELECTIVE),
        (Dtype, "bf16", Dtype.BF16),
        (Dtype, Dtype.FP8, Dtype.FP8),
    ],
)
def test_choice_parse_reads_labels_and_codes(choice, value, member):
    assert choice.parse(value, "f") is member


def test_choice_codes_and_labels_are_fixed():
    # the codes are stored in strategies, CSVs and calibrated profiles: they must not move
    assert Schedule.labels() == ("gpipe", "1f1b", "interleaved")
    assert ZeroStage.labels() == ("0", "1", "2", "3")
    assert Recompute.labels() == ("none", "selective", "full")
    assert Dtype.labels() == ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4")  # new ones at the end


def test_recompute_aliases_mean_full_and_none():
    assert Recompute.parse("yes", "r", aliases=RECOMPUTE_ALIASES) is Recompute.FULL
    assert Recompute.parse("False", "r", aliases=RECOMPUTE_ALIASES) is Recompute.NONE


@pytest.mark.parametrize("value", ["sometimes", 3, 1.5, None])
def test_choice_parse_error_is_data(value):
    with pytest.raises(AisimError) as e:
        Recompute.parse(value, "recompute")
    assert e.value.source is None and e.value.field == "recompute" and e.value.value == value
    assert e.value.expected == "one of none, selective, full"


def test_enums_compare_inside_jit():
    s = make_strategy(schedule="interleaved", interleave=2, pp=2, num_microbatches=2)
    assert bool(jnp.asarray(s.batching.schedule) == Schedule.INTERLEAVED)
    assert make_strategy(recompute=Recompute.FULL).memory.recompute == 2.0
    assert make_strategy(recompute="yes").memory.recompute == float(Recompute.FULL)


# ---------------------------------------------------------------- strategy_from_knobs


@pytest.mark.parametrize(
    "kw, field, value",
    [
        (dict(num_gpus=0), "num_gpus", 0),
        (dict(tp=0), "tp", 0),
        (dict(micro_batch_size=2.5), "micro_batch_size", 2.5),
        (dict(zero_stage=5), "zero_stage", 5),
        (dict(tp=5, num_gpus=40), "tp", 5),
        (dict(tp=8, pp=3), "pp", 3),
        (dict(tp=3, num_gpus=64, num_heads=96), "tp", 3),
        (dict(dp=3), "dp", 3),
        (dict(pp=128, num_gpus=128), "pp", 128),
        (dict(global_batch=65), "global_batch_size", 65),
        (dict(global_batch_size=64, num_microbatches=2), "global_batch_size", 64),
        (dict(schedule="1f1b", interleave=2), "interleave", 2),
        (dict(schedule="interleaved", interleave=1, pp=2), "interleave", 1),
        (dict(schedule="interleaved", interleave=50, pp=2), "interleave", 50),  # 100 > 96 + 2
        (
            dict(schedule="interleaved", interleave=2, pp=4, num_microbatches=6),
            "num_microbatches",
            6,
        ),
        (dict(schedule="zigzag"), "schedule", "zigzag"),
        (dict(recompute="sometimes"), "recompute", "sometimes"),
        (dict(dtype="int4"), "dtype", "int4"),
        (dict(tp_rule="megatron"), "tp_rule", "megatron"),
    ],
)
def test_strategy_from_knobs_raises_with_its_own_field(kw, field, value):
    with pytest.raises(AisimError) as e:
        _knobs(**kw)
    err = e.value
    assert err.source is None and err.field == field and err.value == value
    assert "--" not in err.render() and "command line" not in err.render()


def test_tp_pp_hint_names_the_gpu_count_in_the_readers_words():
    with pytest.raises(AisimError) as e:
        _knobs(tp=8, pp=3)
    line = e.value.render({"pp": "--pp", "num_gpus": "--gpus"}, source="command line")
    assert line.startswith("command line: field '--pp' = 3: expected tp·pp dividing")
    assert "divisor of --gpus=64" in line
    # a CSV row relabels the same error with its own column names
    row = e.value.relabel(source="m.csv:3", names={"num_gpus": "gpus"})
    assert str(row).startswith("m.csv:3: field 'pp' = 3") and "divisor of gpus=64" in str(row)


def test_interleave_message_names_no_flag():
    with pytest.raises(AisimError) as e:
        _knobs(schedule="1f1b", interleave=2)
    assert e.value.expected == "1 unless the schedule is interleaved"


def test_strategy_from_knobs_derives_what_was_left_out():
    s = _knobs(tp=8, pp=4, global_batch=64, micro_batch_size=1, interleave=2)
    assert (float(s.layout.dp), float(s.batching.num_microbatches)) == (2.0, 32.0)
    assert s.batching.schedule == Schedule.INTERLEAVED
    assert _knobs(tp=8, pp=4).batching.schedule == Schedule.ONE_F_ONE_B
    assert _knobs(recompute="yes").memory.recompute == Recompute.FULL
    assert _knobs(zero="2").memory.zero_stage == ZeroStage.GRADIENTS
    assert _knobs(zero_stage="2").memory.zero_stage == ZeroStage.GRADIENTS


def test_distir_tp_rule_accepts_a_non_divisor():
    s = strategy_from_knobs(
        num_layers=12, num_heads=12, num_kv_heads=12, num_gpus=8, tp=8, tp_rule="distir"
    )
    assert float(s.layout.tp) == 8.0
    with pytest.raises(AisimError) as e:
        strategy_from_knobs(
            num_layers=12, num_heads=12, num_kv_heads=12, num_gpus=16, tp=16, tp_rule="distir"
        )
    assert e.value.field == "tp" and "DistIR" in e.value.expected


# ---------------------------------------------------------------- grid and cost models


@pytest.mark.parametrize(
    "kw, field", [({"schedule": ["zigzag"]}, "schedule"), ({"dtype": ["int4"]}, "dtype")]
)
def test_enumerate_strategies_errors_name_the_argument(kw, field):
    with pytest.raises(AisimError) as e:
        enumerate_strategies(**SHAPE, num_gpus=64, global_batch_size=64, gpus_per_node=8, **kw)
    assert e.value.source is None and e.value.field == field
    assert "--" not in str(e.value)


def test_grid_rules_name_no_flag_and_say_which_argument_lifts_them():
    g = enumerate_strategies(**SHAPE, num_gpus=64, global_batch_size=64, gpus_per_node=4, tp=[8])
    reason = "tp crosses a node of 4 GPUs"
    assert g.rejected[reason] > 0 and g.lifted_by == {reason: "allow_cross_node_tp"}
    assert not any("--" in r for r in g.rejected)
    assert g.take(np.arange(0)).lifted_by == g.lifted_by


def test_cost_model_registry():
    assert list(COST_MODELS) == ["aisim", "distir"]
    assert select_step_fn() is step_time and select_step_fn("distir") is distir_step_time
    with pytest.raises(AisimError) as e:
        select_step_fn("calculon")
    err = e.value
    assert (err.source, err.field, err.value) == (None, "cost_model", "calculon")
    assert err.expected == "one of aisim, distir"
    line = err.render({"cost_model": "--cost-model"}, source="command line")
    assert line == "command line: field '--cost-model' = 'calculon': expected one of aisim, distir"


def test_every_cost_model_returns_a_breakdown():
    m, hw = load_model("gpt2").spec, load_hardware("v100-32gb")
    s = make_strategy(dp=2, tp=2, pp=2, num_microbatches=2)
    for fn in COST_MODELS.values():
        out = fn(m, hw.spec, hw.constants, s)
        assert float(out.step_time_s) > 0


# ---------------------------------------------------------------- the public API


def test_public_api_resolves_and_is_documented():
    assert len(set(perfmodel.__all__)) == len(perfmodel.__all__)
    for name in perfmodel.__all__:
        obj = getattr(perfmodel, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert inspect.getdoc(obj), f"perfmodel.{name} has no docstring"


def test_search_rank_by_error_is_data():
    from perfmodel.search import reduce as srch

    g = enumerate_strategies(**SHAPE, num_gpus=8, global_batch_size=8, gpus_per_node=8, tp=[8])
    hw = load_hardware("a100-80gb")
    with pytest.raises(AisimError) as e:
        srch.search(load_model("gpt3-175b").spec, hw.spec, hw.constants, g, rank_by="speed")
    assert (e.value.field, e.value.value) == ("rank_by", "speed")


@pytest.mark.slow
def test_a_stack_by_name_is_the_stack_with_its_constants_in_the_library_and_the_cli():
    """``estimate(stack="torchtitan")`` and ``sweep(stack=...)`` are what ``--stack torchtitan``
    gives: the preset's behaviours, recipe defaults and constants fitted on the hardware."""
    import json

    from typer.testing import CliRunner

    from aisim.app import app
    from perfmodel import load_hardware, load_stack, sweep
    from perfmodel.plan.stack_constants import stack_constants

    kw = dict(hardware="h100-sxm", num_gpus=8, tp=2, pp=1, global_batch=16)
    by_name = perfmodel.estimate("llama3-8b", stack="torchtitan", **kw)
    preset = load_stack("torchtitan")
    consts = stack_constants(preset, load_hardware("h100-sxm")).constants
    by_hand = perfmodel.estimate("llama3-8b", stack=preset, constants=consts, **kw)
    assert by_name.strategy == by_hand.strategy
    assert by_name.strategy.stack.name == "torchtitan"
    assert by_name.strategy.stack.attention_kernel.name == "FA2"  # the preset's, not cuDNN
    assert float(by_name.breakdown.step_time_s) == float(by_hand.breakdown.step_time_s)
    # not the registry's behaviours and the hardware preset's constants
    plain = perfmodel.estimate("llama3-8b", **kw)
    assert float(plain.breakdown.step_time_s) != float(by_name.breakdown.step_time_s)
    cli = CliRunner().invoke(app, ["perf", "estimate", "--model", "llama3-8b", "--hardware",
                                   "h100-sxm", "--gpus", "8", "--tp", "2", "--pp", "1",
                                   "--global-batch", "16", "--stack", "torchtitan", "--json"])  # fmt: skip
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.stdout)["step_time_s"] == pytest.approx(
        float(by_name.breakdown.step_time_s), rel=1e-6
    )
    grid = sweep("llama3-8b", "h100-sxm", num_gpus=8, global_batch=16, tp=[2], pp=[1],
                 micro_batch_size=[by_name.strategy.batching.micro_batch_size],
                 stack="torchtitan", top=50)  # fmt: skip
    same = [r for r in grid.top if r["recompute"] == by_name.to_dict()["recompute"]
            and r["zero_stage"] == by_name.to_dict()["zero_stage"]]  # fmt: skip
    assert same and same[0]["step_time_s"] == pytest.approx(
        float(by_name.breakdown.step_time_s), rel=1e-5
    )
