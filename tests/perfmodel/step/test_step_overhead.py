"""Fixed per-step costs: the step_overhead_s term by hand, its place among the terms, its share of
short steps, and its gradient."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import pytest

from perfmodel import BREAKDOWN_TERMS, load_hardware, load_model, make_strategy, step_time
from perfmodel.step.memory import stage_params_split

A100 = load_hardware("a100-80gb")
STEP = jax.jit(step_time)


def test_step_overhead_by_hand():
    # GPT-3 1.3B on 2 DGX A100 nodes, dp 16, ZeRO-1 (bf16: fp32 gradients, 4 bytes):
    # constant + this rank's gradient shard read once at the asymptotic HBM efficiency + one
    # launch + a tree all-reduce of the norm over 16 ranks in 2 nodes of 8:
    # 2·((8 - 1)·α_intra + ceil(log2 2)·α_inter) = 2·(7·3 µs + 1·5 µs) = 52 µs
    m = load_model("gpt3-1.3b").spec
    s = make_strategy(tp=1, pp=1, dp=16, micro_batch_size=4, num_microbatches=2, zero_stage=1)
    c = A100.constants
    out = STEP(m, A100.spec, c, s)
    dense, _ = stage_params_split(m, s.layout)
    norm = float(dense) / 16 * 4.0 / (2039e9 * float(c.memory_efficiency_max))
    tree = 2.0 * (7 * 3e-6 + math.ceil(math.log2(2)) * 5e-6)
    expected = float(c.step_overhead_s) + norm + float(c.kernel_overhead_s) + tree
    assert float(out.step_overhead_s) == pytest.approx(expected, rel=1e-5)
    assert float(c.step_overhead_s) == pytest.approx(5e-3)  # the shipped default


def test_it_is_a_named_term_of_the_step():
    assert BREAKDOWN_TERMS[-1] == "step_overhead_s"
    m = load_model("gpt3-1.3b").spec
    s = make_strategy(tp=2, pp=2, dp=2, micro_batch_size=1, num_microbatches=8)
    out = STEP(m, A100.spec, A100.constants, s)
    total = sum(float(getattr(out, k)) for k in BREAKDOWN_TERMS)
    assert total == pytest.approx(float(out.step_time_s), rel=1e-6)


def test_it_dominates_short_steps_and_not_long_ones():
    # GPT-2 small on 8 GPUs, 8 samples each: a ~50 ms step carries ~10% of fixed cost; GPT-3
    # 175B's 20 s step carries none to speak of
    small = STEP(
        load_model("gpt2").spec,
        A100.spec,
        A100.constants,
        make_strategy(dp=8, micro_batch_size=8, num_microbatches=1, fused_attention=True),
    )
    share = float(small.step_overhead_s) / float(small.step_time_s)
    assert float(small.step_time_s) < 0.2 and share > 0.05
    big = STEP(
        load_model("gpt3-175b").spec,
        A100.spec,
        A100.constants,
        make_strategy(tp=8, pp=8, dp=16, micro_batch_size=1, num_microbatches=96,
                      sequence_parallel=True, recompute="selective", zero_stage=1),
    )  # fmt: skip
    assert float(big.step_overhead_s) / float(big.step_time_s) < 1e-3


def test_calibration_sees_the_constant():
    m = load_model("gpt2").spec
    s = make_strategy(dp=8, micro_batch_size=8, num_microbatches=1)

    def t(x):
        c = dataclasses.replace(A100.constants, step_overhead_s=x)
        return step_time(m, A100.spec, c, s).step_time_s

    assert float(jax.grad(t)(jnp.float32(5e-3))) == pytest.approx(1.0, rel=1e-6)


@pytest.mark.slow  # compiles the MoE step, which no fast test of this file needs
def test_a_stack_sets_its_moe_host_overhead():
    # the per-MoE-layer host overhead is the stack's: a stack's constants block (preset units)
    # overrides the hardware's 3.4 ms, and the leaf stays free for calibration. Qwen3-30B-A3B,
    # 48 MoE layers on one stage, 2 microbatches: 48 x 2 x 3.4 ms of compute go away at 0
    from perfmodel.specs.constants import constants_with_overrides
    from simbase.errors import AisimError

    h100 = load_hardware("h100-sxm")
    m = load_model("qwen3-30b-a3b").spec
    s = make_strategy(dp=8, ep=8, micro_batch_size=1, num_microbatches=2, fused_attention=True)
    free = constants_with_overrides(h100.constants, {"moe_layer_overhead_ms": 0.0}, "stack")
    assert float(free.moe_layer_overhead_s) == 0.0
    assert float(free.matmul_efficiency_max) == float(h100.constants.matmul_efficiency_max)
    base = STEP(m, h100.spec, h100.constants, s)
    without = STEP(m, h100.spec, free, s)
    n_moe = 48  # qwen3-30b-a3b: every layer has experts
    delta = float(base.compute_s) - float(without.compute_s)
    assert delta == pytest.approx(n_moe * 2 * 3.4e-3, rel=1e-4)
    with pytest.raises(AisimError):
        constants_with_overrides(h100.constants, {"moe_layer_overhead_s": 1.0}, "stack")
