"""The whole-grid search: enumeration == a brute-force loop, grid == one-by-one, sharded ==
unsharded, on-device top-k/Pareto == a full sort on the host, and GPT-3 175B vs Narayanan SC21."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pandas as pd
import pytest

from perfmodel import gpt_training_flops, load_hardware, load_model, make_strategy, step_time
from perfmodel.search import evaluate as ev
from perfmodel.search import reduce as srch
from perfmodel.search.evaluate import evaluate_grid
from perfmodel.search.grid import LEAF_NAMES, enumerate_strategies
from perfmodel.specs.knobs import STACK_KNOBS
from perfmodel.specs.strategy import RECOMPUTE, SCHEDULES, leaf_codes

ROOT = Path(__file__).resolve().parents[3]
A100 = load_hardware("a100-80gb")
GPT3 = load_model("gpt3-175b")
# one strategy compiles as the library compiles an estimate (XLA:CPU's fast path for few rows)
STEP = jax.jit(step_time, compiler_options=ev.compile_options(1))


def _stack_column(g, name):
    """A stack behaviour's value on each row of a grid (the row's stack's)."""
    return np.asarray([getattr(g.stacks[i], name) for i in g.stack_ids()])


def _each_stack(g):
    """(stack, row indices, the rows as one strategy) for each stack of a grid with rows."""
    return [(g.stacks[i], rows, g.take(rows).strategy()) for i, rows in g.by_stack()]


def _one(g, i):
    """Row ``i`` of a grid as one strategy under its stack."""
    stack = g.stacks[g.stack_ids()[i]]
    return make_strategy(stack=stack, **{k: float(g.columns[k][i]) for k in LEAF_NAMES})


def _grid_175b(**kw):
    s = GPT3.spec
    return enumerate_strategies(
        num_layers=int(s.num_layers),
        num_heads=int(s.num_heads),
        num_kv_heads=int(s.num_kv_heads),
        num_gpus=kw.pop("gpus", 1024),
        global_batch_size=kw.pop("gbs", 1536),
        gpus_per_node=8,
        **kw,
    )


def _brute_force(L, heads, kv, N, G, gpn):
    """Every valid strategy by nested Python loops over the knobs (the reference)."""
    out = set()
    for tp, pp in itertools.product(range(1, N + 1), range(1, N + 1)):
        if N % (tp * pp) or heads % tp or kv % tp or tp > gpn or gpn % tp or pp > L:
            continue
        dp = N // (tp * pp)
        if G % dp:
            continue
        for mbs in range(1, G // dp + 1):
            if (G // dp) % mbs:
                continue
            m = G // (dp * mbs)
            for sched, v in itertools.product(range(3), range(1, L + 1)):
                if sched == 2 and not (pp > 1 and v >= 2 and L % (pp * v) == 0 and m % pp == 0):
                    continue
                if sched != 2 and (v != 1 or (pp == 1 and sched != 1)):
                    continue
                for z, r, sp, fa in itertools.product(range(4), range(3), range(2), range(2)):
                    if (dp == 1 and z != 0) or (tp == 1 and sp) or (fa and r == 1):
                        continue  # (a fused kernel makes selective recomputation the same as none)
                    out.add((dp, tp, pp, mbs, m, v, sched, z, r, sp, 2, 1, fa, gpn))
    return out


def test_enumeration_equals_brute_force_loop():
    # a small GPT (12 layers, 12 heads) on 48 GPUs: every knob's rule is exercised
    L, heads, N, G, gpn = 12, 12, 48, 96, 8
    g = enumerate_strategies(
        num_layers=L,
        num_heads=heads,
        num_kv_heads=heads,
        num_gpus=N,
        global_batch_size=G,
        gpus_per_node=gpn,
        fused_attention=[False, True],
    )
    # the knobs the loops above cross (the MoE/CP/FSDP knobs stay at their defaults here)
    crossed = ("dp", "tp", "pp", "micro_batch_size", "num_microbatches", "interleave",
               "schedule", "zero_stage", "recompute", "sequence_parallel", "dtype")  # fmt: skip
    cols = [g.columns[k] for k in crossed] + [
        _stack_column(g, "dp_overlap"),
        _stack_column(g, "fused_attention"),
        g.columns["gpus_per_node"],
    ]
    rows = {tuple(int(x) for x in r) for r in np.stack(cols, axis=1)}
    defaults = leaf_codes({})
    for k in LEAF_NAMES:
        if k not in crossed and k != "gpus_per_node":
            assert np.all(g.columns[k] == defaults[k]), k
    for st in g.stacks:
        for knob in STACK_KNOBS:
            if knob.name != "fused_attention":
                assert getattr(st, knob.name) == knob.default, knob.name
    assert len(rows) == len(g), "the grid has duplicate strategies"
    assert rows == _brute_force(L, heads, heads, N, G, gpn)


def test_enumeration_rules_on_gpt3_175b():
    g = _grid_175b(allow_cross_node_tp=False)
    c = {k: g.columns[k].astype(np.int64) for k in LEAF_NAMES}
    assert np.all(c["dp"] * c["tp"] * c["pp"] == 1024)
    assert np.all(96 % c["tp"] == 0) and c["tp"].max() == 8
    assert np.all(c["dp"] * c["micro_batch_size"] * c["num_microbatches"] == 1536)
    inter = c["schedule"] == 2
    assert np.all(96 % (c["pp"][inter] * c["interleave"][inter]) == 0)
    assert np.all(c["num_microbatches"][inter] % c["pp"][inter] == 0)
    assert np.all(c["interleave"][~inter] == 1)
    assert not np.any((c["tp"] == 1) & (c["sequence_parallel"] == 1))
    assert set(np.unique(c["recompute"])) == {0, 1, 2} and set(np.unique(c["zero_stage"])) == {
        0,
        1,
        2,
        3,
    }
    # uneven stages: pp that does not divide the 96 layers is allowed (ceil(L/pp) in the model)
    assert 64 in set(c["pp"]) and 96 % 64
    wide = _grid_175b(allow_cross_node_tp=True, recompute=["full"], zero=[1])
    assert set(np.unique(wide.columns["tp"])) == {1, 2, 4, 8, 16, 32}


def test_restricted_knobs_and_rejection_reasons():
    g = _grid_175b(tp=[3, 8], pp=[8], zero=[1], recompute=["full"], micro_batch=[1, 5])
    assert set(np.unique(g.columns["tp"])) == {8} and set(np.unique(g.columns["pp"])) == {8}
    assert set(np.unique(g.columns["micro_batch_size"])) == {1}
    assert g.rejected["tp does not divide the number of GPUs"] == 1
    assert g.rejected["the micro-batch size does not divide the per-replica batch"] == 1


def test_grid_equals_each_strategy_alone():
    g = _grid_175b(fused_attention=[False, True])
    assert len(g.by_stack()) == 2
    rng = np.random.default_rng(0)
    for _, rows, strategy in _each_stack(g):
        out = evaluate_grid(GPT3.spec, A100.spec, A100.constants, strategy)
        for j in rng.choice(len(rows), size=12, replace=False):
            one = STEP(GPT3.spec, A100.spec, A100.constants, _one(g, rows[j]))
            for leaf_grid, leaf_one in zip(jax.tree.leaves(out), jax.tree.leaves(one), strict=True):
                np.testing.assert_allclose(
                    np.asarray(leaf_grid)[j], np.asarray(leaf_one), rtol=2e-6, atol=0
                )


@pytest.mark.slow  # a grid searched and evaluated whole, two programs
def test_on_device_selection_equals_host_sort():
    g = _grid_175b(gpus=[512, 1024], recompute=["selective", "full"])
    r = srch.search(GPT3.spec, A100.spec, A100.constants, g, k=7)
    full = srch.feasible_frame(GPT3.spec, A100.spec, A100.constants, g)
    assert r.feasible == len(full) and r.evaluated == len(g)
    ref = full.sort_values("tokens_per_s", ascending=False, kind="stable").head(7)
    np.testing.assert_allclose(r.top["tokens_per_s"], ref["tokens_per_s"], rtol=0)
    # the best of each GPU count
    best = full.groupby("num_gpus")["tokens_per_s"].max()
    np.testing.assert_allclose(r.best_per_point["tokens_per_s"], best.to_numpy(), rtol=0)
    assert list(r.best_per_point["num_gpus"]) == [512, 1024]
    # Pareto front by brute force: no other feasible strategy has at most the memory and at
    # least the tokens/s, and is better in one of them
    mem, tok = full["memory_per_device_bytes"].to_numpy(), full["tokens_per_s"].to_numpy()
    on_front = [
        not np.any((mem <= m_) & (tok >= t_) & ((mem < m_) | (tok > t_)))
        for m_, t_ in zip(mem, tok, strict=True)
    ]
    front_ref = full[on_front].drop_duplicates(["memory_per_device_bytes", "tokens_per_s"])
    assert len(r.pareto) == len(front_ref)
    np.testing.assert_allclose(
        np.sort(r.pareto["tokens_per_s"]), np.sort(front_ref["tokens_per_s"]), rtol=0
    )
    assert np.all(np.diff(r.pareto["tokens_per_s"]) > 0) and np.all(
        np.diff(r.pareto["memory_per_device_bytes"]) >= 0
    )
    # out-of-memory rows are masked and counted, never dropped with an error
    assert r.out_of_memory == len(g) - r.feasible > 0


_SHARDED = r"""
import json, sys, numpy as np, jax
from perfmodel import load_hardware, load_model
from perfmodel.search import reduce as srch
from perfmodel.search.evaluate import evaluate_grid
from perfmodel.search.grid import enumerate_strategies
from perfmodel.search.evaluate import compile_options
assert len(jax.devices()) == 4, jax.devices()
m, hw = load_model("gpt3-175b"), load_hardware("a100-80gb")
g = enumerate_strategies(num_layers=96, num_heads=96, num_kv_heads=96, num_gpus=[512, 1024], global_batch_size=1536,
                         gpus_per_node=8, recompute=["full"], zero=[1, 3])
g = g.take(np.arange(4 * (len(g) // 4) - 1))  # not a multiple of the 4 devices: padding is exercised
out = evaluate_grid(m.spec, hw.spec, hw.constants, g.strategy())
assert len(out.step_time_s.sharding.device_set) == 4
r = srch.search(m.spec, hw.spec, hw.constants, g, k=5)
np.savez(sys.argv[1], n=len(g), step=np.asarray(out.step_time_s), mem=np.asarray(out.memory_per_device_bytes),
         feas=np.asarray(out.feasible), top=r.top["tokens_per_s"].to_numpy(), front=r.pareto["tokens_per_s"].to_numpy(),
         counts=np.array([r.feasible, r.out_of_memory]))
"""


@pytest.mark.slow
def test_sharded_over_four_devices_equals_unsharded(tmp_path):
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=str(ROOT),
    )
    dest = tmp_path / "sharded.npz"
    subprocess.run(
        [sys.executable, "-c", _SHARDED, str(dest)], check=True, env=env, cwd=ROOT, timeout=300
    )
    sharded = np.load(dest)
    g = enumerate_strategies(
        num_layers=96,
        num_heads=96,
        num_kv_heads=96,
        num_gpus=[512, 1024],
        global_batch_size=1536,
        gpus_per_node=8,
        recompute=["full"],
        zero=[1, 3],
    )
    g = g.take(np.arange(4 * (len(g) // 4) - 1))
    assert int(sharded["n"]) == len(g) and len(g) % 4
    out = evaluate_grid(GPT3.spec, A100.spec, A100.constants, g.strategy())
    # the same function on the same rows; XLA may fuse the sharded program differently, so
    # float32 results agree to rounding (a few ulps), not bit for bit
    np.testing.assert_allclose(sharded["step"], np.asarray(out.step_time_s), rtol=1e-6)
    np.testing.assert_array_equal(sharded["mem"], np.asarray(out.memory_per_device_bytes))
    np.testing.assert_array_equal(sharded["feas"], np.asarray(out.feasible))
    r = srch.search(GPT3.spec, A100.spec, A100.constants, g, k=5)
    np.testing.assert_array_equal(sharded["top"], r.top["tokens_per_s"].to_numpy())
    np.testing.assert_array_equal(sharded["front"], r.pareto["tokens_per_s"].to_numpy())
    np.testing.assert_array_equal(sharded["counts"], [r.feasible, r.out_of_memory])


def test_gpt3_175b_on_1024_a100_against_narayanan_sc21():
    """Narayanan et al. SC21 §5.1 / Table 1: GPT-3 175B, 1024 A100-80GB, batch 1536, full
    recomputation: tp 8 within a node, pp 16, 140 TFLOP/s per GPU counted with eq. 3.

    What holds: the grid's best strategy keeps tp within a node and uses pipeline parallelism,
    and the paper's own strategy (tp 8, pp 16, dp 8, mbs 1, 1F1B, no SP, no ZeRO, DP all-reduce
    after the backward as in Megatron-LM 2021) comes out within 20% of the measured 140.
    What does not (issue 3 asks for 15% on the grid's best): the best strategy is predicted at
    about 191 TFLOP/s (+36%), and the paper's strategy at +15.2%. The README says so. Calibrated
    on the same paper's Table 1, the paper's strategy comes within 8% and the best at +25%
    (tests/calibration/test_narayanan2021.py).
    """
    # the paper compares PTD-P layouts (ZeRO-3 at this scale is a near tie in the model, as
    # PyTorch FSDP's 2023 measurements of GPT-175B suggest; the paper's 2021 ZeRO-3 was slower)
    g = _grid_175b(recompute=["full"], zero=[0, 1])
    r = srch.search(GPT3.spec, A100.spec, A100.constants, g, k=1)
    best = r.top.iloc[0]
    assert best["tp"] <= 8 and best["pp"] > 1
    paper = make_strategy(
        dp=8,
        tp=8,
        pp=16,
        micro_batch_size=1,
        num_microbatches=192,
        schedule="1f1b",
        zero_stage=0,
        recompute="full",
        sequence_parallel=False,
        dp_overlap=False,
        gpus_per_node=8,
    )
    t = float(step_time(GPT3.spec, A100.spec, A100.constants, paper).step_time_s)
    eq3 = float(gpt_training_flops(GPT3.spec, 1536, 1.0)) / t / 1024 / 1e12
    assert eq3 == pytest.approx(140.0, rel=0.20), (
        f"the paper's strategy: {eq3:.1f} TFLOP/s per GPU by eq. 3"
    )


def test_nothing_fits_says_why():
    g = _grid_175b(gpus=8, gbs=8)
    r = srch.search(GPT3.spec, A100.spec, A100.constants, g)
    assert r.feasible == 0 and r.out_of_memory == r.evaluated > 0
    msg = srch.no_feasible_message(r, "gpt3-175b", float(A100.spec.memory_capacity_bytes))
    # 16 B/param × 174.6B params over 80 GiB devices: ceil(2.79e12 / 85.9e9) = 33
    assert "need at least 33 × 80 GiB per replica" in msg and "smallest ZeRO-3 footprint" in msg
    smallest = r.smallest.iloc[-1]
    assert smallest["zero_stage"] == 3 and smallest["memory_per_device_bytes"] > float(
        A100.spec.memory_capacity_bytes
    )
    # the reported footprint is the minimum over every ZeRO-3 strategy of the grid
    full = evaluate_grid(GPT3.spec, A100.spec, A100.constants, g.strategy())
    z3 = g.columns["zero_stage"] == 3
    assert smallest["memory_per_device_bytes"] == np.asarray(full.memory_per_device_bytes)[z3].min()


@pytest.mark.slow
def test_a_grid_of_several_stacks_reduces_as_one():
    """Each stack is searched in its own program; the merged result is what one search over
    all the rows would give: the best rows, the counts and the smallest (ZeRO-3) footprint."""
    g = _grid_175b(gpus=8, gbs=8, fused_attention=[False, True])
    assert len(g.by_stack()) == 2
    r = srch.search(GPT3.spec, A100.spec, A100.constants, g)
    parts = [
        srch.search(GPT3.spec, A100.spec, A100.constants, g.take(rows)) for _, rows in g.by_stack()
    ]
    assert r.evaluated == len(g) == sum(p.evaluated for p in parts)
    assert r.out_of_memory == sum(p.out_of_memory for p in parts) == r.evaluated
    msg = srch.no_feasible_message(r, "gpt3-175b", float(A100.spec.memory_capacity_bytes))
    assert "smallest ZeRO-3 footprint" in msg
    smallest = min(float(p.smallest.iloc[-1]["memory_per_device_bytes"]) for p in parts)
    assert len(r.smallest) == 2
    assert float(r.smallest.iloc[-1]["memory_per_device_bytes"]) == smallest
    big = _grid_175b(recompute=["full"], zero=[1], fused_attention=[False, True])
    r = srch.search(GPT3.spec, A100.spec, A100.constants, big, k=5)
    full = srch.feasible_frame(GPT3.spec, A100.spec, A100.constants, big)
    ref = full.sort_values("tokens_per_s", ascending=False, kind="stable").head(5)
    np.testing.assert_allclose(r.top["tokens_per_s"], ref["tokens_per_s"], rtol=0)
    assert r.feasible == len(full)


def test_empty_grid_names_the_rule():
    g = _grid_175b(tp=[16], recompute=["full"])
    assert len(g) == 0
    r = srch.search(GPT3.spec, A100.spec, A100.constants, g)
    assert "tp crosses a node of 8 GPUs" in srch.no_feasible_message(r, "gpt3-175b", 80 * 2**30)


def test_pareto_mask_hand_case():
    cost = np.array([1.0, 2.0, 2.0, 3.0, 4.0, 0.5])
    gain = np.array([1.0, 3.0, 2.0, 2.5, 5.0, 0.1])
    ok = np.array([True, True, True, True, True, False])
    expected = [True, True, False, False, True, False]
    host = srch.pareto_mask(cost, gain, ok)  # numpy in, numpy out (no jax dispatch)
    assert isinstance(host, np.ndarray) and list(host) == expected
    jitted = jax.jit(srch.pareto_mask)(cost, gain, ok)  # as the on-device reduction runs it
    assert list(np.asarray(jitted)) == expected


def test_fast_compile_options_only_for_small_cpu_grids():
    small = ev.compile_options(1000, "cpu")
    assert small == {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}
    assert ev.compile_options(ev.FAST_COMPILE_ROWS, "cpu") == small
    assert ev.compile_options(ev.FAST_COMPILE_ROWS + 1, "cpu") is None
    assert ev.compile_options(1000, "gpu") is None and ev.compile_options(1, "tpu") is None


def test_fast_jit_is_jit_with_the_small_grid_options():
    # what the one-off programs (an estimate's memory check, a fit, the published runs) compile
    # with: jax.jit's values, its static arguments, and the fast options, chosen on first call
    def f(x, n):
        return jax.numpy.sin(x) * n + jax.numpy.exp(-x)

    fast = ev.fast_jit(f, static_argnames=("n",))
    x = np.linspace(0.0, 3.0, 7, dtype=np.float32)
    np.testing.assert_allclose(fast(x, n=3), jax.jit(f, static_argnames=("n",))(x, n=3), rtol=1e-6)
    with pytest.raises(Exception, match="hash|static"):
        fast(x, n=np.ones(2))  # a static argument must be hashable, as under jax.jit


@pytest.mark.slow
def test_fast_compile_equals_default_compile():
    # the same grid through both compiled programs (one per stack): only float32 rounding may
    # differ
    g = _grid_175b(fused_attention=[False, True])
    for _, _, strategy in _each_stack(g):
        args = (step_time, None, GPT3.spec, A100.spec, A100.constants, strategy, None, ())
        fast = ev._evaluate_grid_fast_compile(*args)
        default = ev._evaluate_grid(*args)
        for a, b in zip(jax.tree.leaves(fast), jax.tree.leaves(default), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=0)


def test_results_frame_names_and_json_roundtrip():
    g = _grid_175b(
        tp=[8], pp=[16], micro_batch=[1], zero=[1], recompute=["full"], sequence_parallel=[False]
    )
    r = srch.search(GPT3.spec, A100.spec, A100.constants, g, k=3)
    assert set(r.top["schedule"]) <= set(SCHEDULES) and set(r.top["recompute"]) == {RECOMPUTE[2]}
    assert isinstance(r.top, pd.DataFrame) and json.loads(r.top.to_json())  # plain values
