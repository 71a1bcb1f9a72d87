"""A model preset's ``fused_attention_default``: the attention kernel a strategy gets when none
is asked for, which is the kernel of the published runs that define the preset.

The published runs of ``calibration/data/published_runs*.csv`` of the presets released since
Llama 2 ran a fused kernel (FlashAttention or cuDNN), so those presets default to it; the GPT-2/GPT-3 and
Megatron presets keep the kernel of Megatron-LM's 2021-22 measurements, which they reproduce
(NVIDIA's later GPT-3 175B benchmarks, which do run a fused kernel, state it). The library, the estimate command and
the grid all take the default from the model, and an explicit choice wins (the command line's:
tests/aisim/test_perf_estimate.py)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from calibration.public_runs import HOLDOUT_CSV, MAIN_CSV, load_published_runs
from perfmodel import estimate, load_model, model_names, sweep
from perfmodel.specs.model import model_from_dict
from simbase.errors import AisimError

runner = CliRunner()
KNOBS = dict(hardware="h100-sxm", num_gpus=8, tp=1, pp=1, global_batch=8, recompute="full")


@pytest.mark.slow  # evaluates every published run
def test_every_preset_a_published_run_uses_defaults_to_the_kernel_those_runs_ran():
    """The kernel each run ran is the one its loader gives it (the row's framework and stack:
    FlashAttention, cuDNN, or BLOOM's unfused softmax); the run's model preset defaults to it.
    GPT-3 175B keeps the 2021 kernel of the measurements it reproduces (below)."""
    used: dict[str, set] = {}
    for path in (MAIN_CSV, HOLDOUT_CSV):
        for r in load_published_runs(path)[0]:
            if r.model.name in model_names() and r.model.name != "gpt3-175b":
                used.setdefault(r.model.name, set()).add(r.strategy.stack.fused_attention)
    assert len(used) >= 8
    wrong = {n: k for n, k in used.items() if k != {load_model(n).fused_attention_default}}
    assert not wrong, "preset: the kernels its runs ran (fused?) " + repr(wrong)


@pytest.mark.parametrize("name", ["gpt3-175b", "gpt3-1.3b", "gpt2", "megatron-1t", "turing-530b"])
def test_the_2021_megatron_presets_default_to_the_unfused_kernel(name):
    assert not load_model(name).fused_attention_default


@pytest.mark.parametrize("name, fused", [("llama3-8b", True), ("gpt3-1.3b", False)])
def test_estimate_takes_the_models_default_and_an_explicit_choice_wins(name, fused):
    default = estimate(name, **KNOBS)
    assert bool(default.strategy.stack.fused_attention) is fused
    same = estimate(name, fused_attention=fused, **KNOBS)
    other = estimate(name, fused_attention=not fused, **KNOBS)
    assert default.to_dict()["step_time_s"] == same.to_dict()["step_time_s"]
    assert default.to_dict()["step_time_s"] != other.to_dict()["step_time_s"]


@pytest.mark.slow  # compiles two grids
def test_the_grid_searches_each_models_own_kernel_unless_told():
    for name, fused in (("llama3-8b", True), ("gpt3-1.3b", False)):
        res = sweep(name, "h100-sxm", num_gpus=8, global_batch=16, top=400)
        assert len(res.top) > 20
        assert {bool(r["fused_attention"]) for r in res.top} == {fused}, name
    one = sweep("llama3-8b", "h100-sxm", num_gpus=8, global_batch=16, fused_attention=[True])
    both = sweep("llama3-8b", "h100-sxm", num_gpus=8, global_batch=16,
                 fused_attention=[False, True])  # fmt: skip
    default = sweep("llama3-8b", "h100-sxm", num_gpus=8, global_batch=16)
    assert default.evaluated == one.evaluated
    assert default.best["step_time_s"] == one.best["step_time_s"]
    # the unfused kernel adds strategies (with the selective recomputation the fused kernel
    # makes pointless), and none of them beats the fused best
    assert both.evaluated > one.evaluated
    assert both.best["step_time_s"] == one.best["step_time_s"]


def test_a_model_file_must_say_true_or_false():
    doc = dict(kind="transformer", num_layers=2, hidden_size=64, num_heads=4, seq_len=16)
    doc["vocab_size"] = 100
    assert model_from_dict(dict(doc, fused_attention_default=True)).fused_attention_default
    with pytest.raises(AisimError, match="fused_attention_default"):
        model_from_dict(dict(doc, fused_attention_default="yes"), "m.json")
