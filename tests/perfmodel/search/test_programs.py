"""The stacks a preset's rules give a grid's rows share one compiled program: the rules are
traced per row (:func:`perfmodel.step.select.behaviour`), and each row gets what its own stack
gives it evaluated alone."""

from __future__ import annotations

import copy
import dataclasses

import jax
import numpy as np
import pytest

from perfmodel import load_hardware, load_stack
from perfmodel.search.evaluate import compile_options, evaluate_grid
from perfmodel.search.grid import enumerate_strategies
from perfmodel.specs.knobs import LEAF_KNOBS
from perfmodel.specs.model import model_from_dict
from perfmodel.specs.stack_preset import TRACED_BEHAVIOURS, Rule, preset_from_dict, program_key
from perfmodel.specs.strategy import leaf_codes, leaves_of, make_strategy, stack_strategies
from perfmodel.step.step_time import step_time

H100 = load_hardware("h100-sxm")
STEP = jax.jit(step_time, compiler_options=compile_options(1))
MODEL = model_from_dict(
    dict(num_layers=4, hidden_size=1024, num_heads=8, num_kv_heads=2, ffn_hidden_size=3584,
         seq_len=4096, vocab_size=32000)
)  # fmt: skip


def _every_behaviour_by_rule():
    """torchtitan's document with a rule on every behaviour the step function traces, each
    flipping on a different knob, and PyTorch's ring for context parallelism (whose eager
    merges follow the ``eager`` rule)."""
    doc = copy.deepcopy(load_stack("torchtitan").document)
    b = doc["behaviours"]
    b["tp_overlap"] = {"cases": [{"when": {"tp": ">1"}, "value": "on"}, {"value": "off"}]}
    b["dp_overlap"] = {"cases": [{"when": {"zero_stage": ">=1"}, "value": "on"}, {"value": "off"}]}
    b["dp_bucket_size"] = {"cases": [{"when": {"pp": ">1"}, "value": 0}, {"value": 4e7}]}
    b["eager"] = {"cases": [{"when": {"cp": ">1"}, "value": "on"}, {"value": "off"}]}
    b["cp_comm"] = {"value": "torch"}
    doc.pop("variants", None)
    return preset_from_dict(doc, "rules.json")


ROWS = [
    dict(dp=8, tp=1, pp=1, cp=1, zero_stage=0, recompute="none", dtype="bf16"),
    dict(dp=2, tp=2, pp=2, cp=1, zero_stage=3, recompute="selective", dtype="fp8"),
    dict(dp=2, tp=2, pp=1, cp=2, zero_stage=3, recompute="none", dtype="bf16"),
    dict(dp=1, tp=1, pp=2, cp=4, zero_stage=1, recompute="selective", dtype="fp8"),
]


@pytest.mark.slow  # five compiled programs: the shared one and each row's own
def test_one_program_gives_each_row_what_its_own_stack_gives():
    preset = _every_behaviour_by_rule()
    assert {r.knob for r in preset.rules} == TRACED_BEHAVIOURS
    batching = dict(micro_batch_size=1, num_microbatches=4)
    rows = [make_strategy(**batching, **r) for r in ROWS]
    codes = [leaf_codes({k.name: float(leaves_of(s)[k.name]) for k in LEAF_KNOBS}) for s in rows]
    stacks = [preset.stack_for(c) for c in codes]
    # each behaviour takes both of its values over the rows, so each select is exercised
    for name in TRACED_BEHAVIOURS:
        assert len({getattr(st, name) for st in stacks}) == 2, name
    program = dataclasses.replace(preset.base, **{r.knob: r for r in preset.rules})
    cols = {k: np.asarray([c[k] for c in codes], np.float32) for k in codes[0]}
    out = evaluate_grid(MODEL.spec, H100.spec, H100.constants, stack_strategies(cols, program))
    for i, (r, st) in enumerate(zip(ROWS, stacks, strict=True)):
        one = STEP(MODEL.spec, H100.spec, H100.constants, make_strategy(stack=st, **batching, **r))
        # every output: the step's terms, the memory by part, the FLOPs and the validity
        for (path, whole), alone in zip(
            jax.tree_util.tree_leaves_with_path(out), jax.tree.leaves(one), strict=True
        ):
            assert float(whole[i]) == pytest.approx(float(alone), rel=1e-6), (i, path)


def test_a_presets_rules_share_a_program_and_listed_values_split_it():
    m = dict(num_layers=4, num_heads=8, num_kv_heads=2, gpus_per_node=8, seq_len=4096)
    kw = dict(num_gpus=8, global_batch_size=32, **m)
    g = enumerate_strategies(stack=load_stack("torchtitan"), **kw)
    assert len(g.by_stack()) > 4  # pipelining, ZeRO-3, TP and recomputation pick its FSDP policy
    (program, rows), = g.by_program()  # fmt: skip
    assert len(rows) == len(g)
    # a behaviour is traced only where the grid's stacks differ in it
    traced = {
        f.name for f in dataclasses.fields(program) if isinstance(getattr(program, f.name), Rule)
    }
    differ = {
        f.name for f in dataclasses.fields(program)
        if len({getattr(g.stacks[i], f.name) for i, _ in g.by_stack()}) > 1 and f.name != "name"
    }  # fmt: skip
    assert traced == differ and traced
    # the values a user lists are sweep points of their own, each its own program
    listed = enumerate_strategies(stack=load_stack("torchtitan"), fsdp_reshard=[True, False], **kw)
    assert len(listed.by_program()) == 2
    # a grid without a preset's rules has one program per stack, as before
    plain = enumerate_strategies(tp_overlap=[False, True], **kw)
    assert len(plain.by_program()) == len(plain.by_stack()) == 2


def test_a_rule_is_traced_only_where_it_gives_the_stacks_own_value():
    preset = load_stack("torchtitan")
    (logit,) = [r for r in preset.rules if r.knob == "logit_bytes"]  # tp > 1: 2.25, else 1.75
    assert logit.gives(2.25, {"tp": np.array([2.0, 4.0])})
    assert not logit.gives(2.25, {"tp": np.array([1.0, 2.0])})
    assert logit.gives(1.75, {"tp": 1.0}) and not logit.gives(1.75, {"tp": 2.0})
    # a run whose stack sets the behaviour itself (a value the rule would not give) keeps it
    mine = dataclasses.replace(preset.base, logit_bytes=4.0)
    assert program_key(mine, (logit,), {"tp": 2.0}).logit_bytes == 4.0
    assert program_key(preset.base, (logit,), {"tp": 1.0}).logit_bytes is logit
