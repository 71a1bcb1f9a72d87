"""``interleave`` = ``auto``: the virtual pipeline stages a Megatron-Core recipe picks (about two
layers each), the recipe default of the ``megatron-core`` stack for pp > 1; a user's value wins."""

from __future__ import annotations

import pytest

from perfmodel.plan.estimate import estimate
from perfmodel.specs.choices import Schedule
from perfmodel.specs.knobs import BY_NAME
from perfmodel.specs.validate import recipe_interleave, strategy_from_knobs
from simbase.errors import AisimError

SHAPE = dict(num_heads=16, num_kv_heads=16)


@pytest.mark.parametrize(
    ("pp", "layers", "microbatches", "v"),
    [
        (8, 96, 16, 6),  # 96 / (8·2) = 6 chunks of 2 layers
        (16, 126, 16, 3),  # 126 // 32 = 3: chunks of 2-3 layers (uneven, as Megatron-Core allows)
        (4, 80, 64, 10),
        (2, 61, 8, 15),
        (1, 96, 16, 1),  # no pipeline
        (4, 12, 8, 1),  # 12 // 8 = 1: no split into two stages of two layers
        (4, 80, 6, 1),  # 6 microbatches are not a multiple of pp = 4: plain 1F1B
    ],
)
def test_the_rule_by_hand(pp, layers, microbatches, v):
    assert recipe_interleave(pp, layers, microbatches) == v


def test_auto_is_resolved_without_a_memory_estimate():
    s = strategy_from_knobs(
        **SHAPE, num_layers=96, num_gpus=64, tp=1, pp=8, global_batch=128, interleave="auto"
    )  # dp 8, 16 microbatches of 1
    assert float(s.batching.interleave) == 6
    assert int(s.batching.schedule) == Schedule.INTERLEAVED
    s = strategy_from_knobs(**SHAPE, num_layers=96, num_gpus=64, tp=8, pp=1, interleave="auto")
    assert float(s.batching.interleave) == 1


def test_the_megatron_core_stack_interleaves_pipelines_and_says_so():
    kw = dict(
        hardware="h100-sxm", num_gpus=512, tp=8, pp=8, global_batch=256, stack="megatron-core"
    )
    e = estimate("gpt3-175b", **kw)  # 96 layers, dp 8, 32 microbatches
    assert float(e.strategy.batching.interleave) == 6
    assert e.auto["interleave"] == 6
    # the user's value wins; and without a pipeline there is nothing to interleave
    assert float(estimate("gpt3-175b", **kw, interleave=1).strategy.batching.interleave) == 1
    flat = estimate("gpt3-175b", **(kw | {"pp": 1, "num_gpus": 64}))
    assert float(flat.strategy.batching.interleave) == 1 and "interleave" not in flat.auto


def test_auto_is_a_word_of_the_knob():
    knob = BY_NAME["interleave"]
    assert knob.parse("auto") == "auto" and knob.parse("4") == 4
    with pytest.raises(AisimError) as e:
        knob.parse("x")
    assert "a positive integer or auto" in str(e.value)
    with pytest.raises(AisimError) as e:  # the same for a knob whose auto is a memory search
        BY_NAME["recompute_layers"].parse("abc")
    assert "an integer >= 0 or auto" in str(e.value)
    assert BY_NAME["recompute_layers"].parse("auto") == "auto"


def test_auto_recomputation_recomputes_the_fewest_layers_that_fit():
    """Llama 3.1 405B on 16,384 H100 as Meta's paper prints it (tp 8, pp 16, batch 2048): no
    recomputation does not fit; under Megatron-Core's block method (the stack's
    ``recompute_layers`` auto) the fewest layers per stage that fit are recomputed, not all 8."""
    kw = dict(
        hardware="h100-sxm", num_gpus=16384, tp=8, pp=16, global_batch=2048,
        stack="megatron-core",
    )  # fmt: skip
    e = estimate("llama3-405b", **kw)
    k = e.auto["recompute_layers"]
    assert e.auto["recompute"] == "full" and 0 < k < 8
    assert not e.infeasible_because()
    assert estimate("llama3-405b", **kw, recompute="none").infeasible_because()
    if k > 1:
        assert estimate(
            "llama3-405b", **kw, recompute="full", recompute_layers=k - 1
        ).infeasible_because()
    # a chosen "full" recomputes every layer; a stack without the block method recomputes all
    assert (
        float(estimate("llama3-405b", **kw, recompute="full").strategy.memory.recompute_layers) == 0
    )
    ds = estimate("llama3-405b", **(kw | {"stack": "deepspeed"}))
    assert "recompute_layers" not in ds.auto


def test_jobs_checked_together_choose_what_each_chooses_alone():
    """The published runs' auto choices are made for all runs at once
    (:func:`least_that_fits_many`): candidates of different models, hardware and stacks share a
    program where their structure agrees; each job's choice is the one it makes alone."""
    from perfmodel.plan.estimate import _candidates, least_that_fits, least_that_fits_many
    from perfmodel.specs.hardware import load_hardware
    from perfmodel.specs.model import load_model
    from perfmodel.specs.stack_preset import load_stack

    jobs = []
    for name, hw_name, stack, knobs in [
        ("llama3-405b", "h100-sxm", "megatron-core", dict(num_gpus=16384, tp=8, pp=16, gb=2048)),
        ("llama3-70b", "h100-sxm", "megatron-core", dict(num_gpus=64, tp=4, pp=4, gb=64)),
        ("llama3-70b", "a100-80gb", "megatron-core", dict(num_gpus=64, tp=8, pp=1, gb=64)),
        ("llama3-8b", "h100-sxm", "torchtitan", dict(num_gpus=8, tp=1, pp=1, gb=32)),
        ("gpt3-175b", "a100-80gb", "deepspeed", dict(num_gpus=1024, tp=8, pp=8, gb=1536)),
    ]:
        m, hw = load_model(name), load_hardware(hw_name)
        knobs = knobs | dict(global_batch=knobs.pop("gb"), recompute="auto")
        cands = _candidates(m, hw, None, "aisim", knobs, load_stack(stack))
        jobs.append((m, hw, [c[1] for c in cands]))
    alone = [least_that_fits(*job) for job in jobs]
    assert least_that_fits_many(jobs) == alone
    assert least_that_fits_many(jobs[::-1]) == alone[::-1]
    assert len({len(job[2]) for job in jobs}) > 1 and any(k > 0 for k in alone)  # a real choice
