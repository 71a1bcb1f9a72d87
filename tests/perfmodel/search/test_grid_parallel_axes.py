"""The grid's parallel axes (cp, ep, etp), the HSDP shard size and the stack's switches:
enumeration == a brute-force loop over the same rules, a switch crossed only where it matters
(each combination of switches a stack of its own), every enumerated row passes the step model's
validity, and grid evaluation (one program per stack) == step_time one strategy at a time, on a
small MoE model."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest

from perfmodel import load_hardware, make_strategy, step_time
from perfmodel.search.evaluate import compile_options, evaluate_grid
from perfmodel.search.grid import LEAF_NAMES, MAX_DEFAULT_EP, divisors, enumerate_strategies
from perfmodel.search.report import strategy_columns
from perfmodel.specs.knobs import BY_NAME
from perfmodel.specs.model import model_from_dict
from perfmodel.specs.stack import Stack
from perfmodel.step.step_time import validity

H100 = load_hardware("h100-sxm")
# one strategy compiles as the library compiles an estimate (XLA:CPU's fast path for few rows)
STEP = jax.jit(step_time, compiler_options=compile_options(1))
# a tiny MoE transformer: 8 routed experts (top-2) of a smaller MLP, the first layer dense
MOE = model_from_dict(
    {
        "name": "tiny-moe",
        "kind": "transformer",
        "num_layers": 4,
        "hidden_size": 256,
        "num_heads": 8,
        "num_kv_heads": 4,
        "ffn_hidden_size": 512,
        "seq_len": 512,
        "vocab_size": 1024,
        "num_experts": 8,
        "experts_per_token": 2,
        "moe_ffn_hidden_size": 128,
        "shared_experts": 1,
        "dense_layers": 1,
        "dropout": False,
    },
    "tiny-moe",
)
DENSE = model_from_dict(
    {
        "name": "tiny-dense",
        "kind": "transformer",
        "num_layers": 4,
        "hidden_size": 256,
        "num_heads": 8,
        "seq_len": 512,
        "vocab_size": 1024,
    },
    "tiny-dense",
)
FIXED = dict(
    micro_batch=[1],
    schedule=["1f1b"],
    recompute=["none"],
    sequence_parallel=[False],
)


def _grid(model=MOE, gpus=16, gbs=32, **kw):
    s = model.spec
    return enumerate_strategies(
        num_layers=int(s.num_layers),
        num_heads=int(s.num_heads),
        num_kv_heads=int(s.num_kv_heads),
        num_gpus=gpus,
        global_batch_size=gbs,
        gpus_per_node=8,
        num_experts=int(s.num_experts),
        seq_len=int(s.seq_len),
        **(FIXED | kw),
    )


def _stack_codes(g, name):
    """A stack behaviour's code on each row of a grid (the row's stack's)."""
    knob = BY_NAME[name]
    return np.asarray([knob.code(getattr(g.stacks[i], name)) for i in g.stack_ids()])


def _rows(g, keys=("tp", "cp", "pp", "dp", "ep", "etp", "zero_stage", "shard_size")):
    return sorted(tuple(int(g.columns[k][i]) for k in keys) for i in range(len(g)))


def test_enumeration_equals_brute_force_loop():
    gpus, gbs, L, E, seq = 16, 32, 4, 8, 512
    cp_l, ep_l, etp_l, sh_l, z_l = [1, 2, 4], [1, 2, 4, 8], [1, 2], [0, 2, 4], [1, 3]
    g = _grid(cp=cp_l, ep=ep_l, etp=etp_l, shard_size=sh_l, zero=z_l, tp=[1, 2, 4], pp=[1, 2])
    want = []
    for tp, cp, pp, ep, etp, z, sh in itertools.product(
        [1, 2, 4], cp_l, [1, 2], ep_l, etp_l, z_l, sh_l
    ):
        if gpus % (tp * cp * pp) or 8 % tp or 4 % tp:  # heads 8, KV heads 4
            continue
        if cp > 1 and seq % (2 * cp):
            continue
        dp = gpus // (tp * cp * pp)
        if pp > L or gbs % dp:
            continue
        if E % ep or (tp * cp * dp) % (ep * etp):
            continue
        if sh and (z != 3 or (dp * cp) % sh or sh == dp * cp):
            continue
        want.append((tp, cp, pp, dp, ep, etp, z, sh))
    assert _rows(g) == sorted(want)
    assert g.rejected["ep·etp does not divide the tp·cp·dp ranks of a stage"] > 0
    assert g.rejected["an HSDP shard size needs ZeRO-3"] > 0
    assert g.rejected["the shard size does not divide dp·cp"] > 0


def test_cp_must_split_the_sequence_in_2cp_chunks():
    g = _grid(cp=[1, 2, 4, 8], ep=[1], tp=[1], pp=[1], gpus=8, gbs=8)
    ok = {c for c in (1, 2, 4, 8) if c == 1 or 512 % (2 * c) == 0}
    assert set(np.unique(g.columns["cp"]).astype(int)) == ok
    short = _grid(cp=[1, 2, 4, 8], ep=[1], tp=[1], pp=[1], gpus=8, gbs=8)
    assert "2·cp does not divide the 512-token sequence" not in short.rejected
    s = MOE.spec
    g12 = enumerate_strategies(
        num_layers=4, num_heads=8, num_kv_heads=4, num_gpus=8, global_batch_size=8,
        gpus_per_node=8, seq_len=12, num_experts=int(s.num_experts), cp=[1, 2, 4], ep=[1],
        tp=[1], pp=[1], **FIXED,
    )  # fmt: skip
    assert set(np.unique(g12.columns["cp"]).astype(int)) == {1, 2}  # 12 % 8 != 0
    assert g12.rejected["2·cp does not divide the 12-token sequence"] > 0


def test_moe_default_ep_is_every_divisor_of_the_experts_that_fits():
    g = _grid()
    tpcpdp = g.columns["tp"] * g.columns["cp"] * g.columns["dp"]
    for ep in np.unique(g.columns["ep"]):
        assert 8 % ep == 0 and ep <= MAX_DEFAULT_EP
    # every (tp, dp) pair gets every divisor of 8 that divides its tp·cp·dp ranks
    for t in np.unique(tpcpdp):
        got = set(np.unique(g.columns["ep"][tpcpdp == t]).astype(int))
        assert got == {int(d) for d in divisors(8) if t % d == 0}
    assert set(np.unique(g.columns["etp"])) == {1}


def test_dense_model_keeps_ep_1_and_names_the_rule():
    g = _grid(DENSE)
    assert set(np.unique(g.columns["ep"])) == {1}
    asked = _grid(DENSE, ep=[1, 2])
    assert set(np.unique(asked.columns["ep"])) == {1}
    # one rejection per (tp, cp, pp) factorisation: ep = 2 is pruned before the other axes
    layouts = set(_rows(asked, ("tp", "cp", "pp")))
    assert asked.rejected["the model has no experts (ep or etp > 1)"] == len(layouts)


def test_unset_axes_and_switches_leave_the_grid_unchanged():
    """A dense grid without the parallel axes or switches has the same rows as before they
    existed: cp = 1, ep = etp = 1, shard 0, one stack with every switch at its default, fp32
    gradient reduction for bf16."""
    g = _grid(DENSE, recompute=None, zero=None, sequence_parallel=None)
    for k, v in dict(cp=1, ep=1, etp=1, shard_size=0, recompute_layers=0,
                     moe_imbalance=1).items():  # fmt: skip
        assert set(np.unique(g.columns[k])) == {v}, k
    assert g.stacks == (Stack(),)
    cols = strategy_columns(g.strategy())
    for k, v in dict(tp_overlap=False, moe_dispatch="alltoall", moe_overlap=False, cp_comm="p2p",
                     fsdp_reshard=True, grad_reduce_fp32=True).items():  # fmt: skip
        assert set(cols[k]) == {v}, k


def test_switches_are_crossed_only_where_they_matter():
    g = _grid(
        ep=[1, 2], cp=[1, 2], tp=[1, 2], pp=[1], tp_overlap=[False, True],
        moe_overlap=[False, True], cp_comm=["p2p", "allgather"],
        moe_dispatch=["alltoall", "allgather"], moe_imbalance=[1.0, 1.3],
        grad_reduce_fp32=[False, True], zero=[1, 3], fsdp_reshard=[True, False],
    )  # fmt: skip
    c = dict(g.columns)
    switches = ("tp_overlap", "moe_overlap", "cp_comm", "moe_dispatch", "grad_reduce_fp32",
                "fsdp_reshard")  # fmt: skip
    c |= {k: _stack_codes(g, k) for k in switches}
    assert not np.any((c["tp"] == 1) & (c["tp_overlap"] == 1))
    assert not np.any((c["ep"] == 1) & ((c["moe_overlap"] == 1) | (c["moe_dispatch"] == 1)))
    assert not np.any((c["cp"] == 1) & (c["cp_comm"] == 1))
    assert not np.any((c["zero_stage"] != 3) & (c["fsdp_reshard"] == 0))  # the default: on
    assert set(np.unique(c["moe_imbalance"])) == {np.float32(1.0), np.float32(1.3)}
    assert set(np.unique(c["grad_reduce_fp32"])) == {0, 1}
    # where they matter, every combination is there
    both = (c["tp"] == 2) & (c["ep"] == 2) & (c["cp"] == 2) & (c["zero_stage"] == 3)
    keys = (*LEAF_NAMES, *switches)
    assert len(np.unique(np.stack([c[k][both] for k in keys]), axis=1).T) == both.sum()
    assert both.sum() == 2**7 * len(np.unique(c["dp"][both]))


def test_every_enumerated_row_is_valid_for_the_step_model():
    g = _grid(cp=[1, 2], shard_size=[0, 2], zero=[1, 3], recompute=["none", "full"],
              recompute_layers=[0, 1, 2])  # fmt: skip
    ok = jax.vmap(lambda s: validity(MOE.spec, H100.spec, s))(g.strategy())
    assert bool(np.all(np.asarray(ok)))
    c = g.columns
    assert not np.any((c["recompute_layers"] > 0) & (c["recompute"] != 2))
    assert np.all(c["recompute_layers"] <= np.ceil(4 / c["pp"]))


def _evaluate_by_stack(model, g):
    """The grid evaluated one program per stack, as leaves of shape ``(n,)`` in grid order."""
    parts = []
    for _, rows in g.by_stack():
        sub = g.take(rows)
        out = evaluate_grid(model.spec, H100.spec, H100.constants, sub.strategy())
        parts.append((rows, [np.asarray(x) for x in jax.tree.leaves(out)]))
    leaves = [np.empty(len(g), x.dtype) for x in parts[0][1]]
    for rows, values in parts:
        for whole, part in zip(leaves, values, strict=True):
            whole[rows] = part
    return leaves


@pytest.mark.parametrize("model", [MOE, DENSE], ids=["moe", "dense"])
@pytest.mark.slow
def test_grid_equals_each_strategy_alone(model):
    g = _grid(model, cp=[1, 2], ep=None if model is MOE else [1], shard_size=[0, 2],
              zero=[1, 3], moe_imbalance=[1.0, 1.25], tp_overlap=[False, True])  # fmt: skip
    assert len(g) > 24 and len(g.by_stack()) == 2
    out = _evaluate_by_stack(model, g)
    rng = np.random.default_rng(0)
    picked = rng.choice(len(g), size=24, replace=False)
    c = g.columns
    masks = [_stack_codes(g, "tp_overlap") > 0]
    if model is MOE:  # make sure rows with each new axis above its default are compared
        masks += [c["cp"] > 1, c["ep"] > 1, c["shard_size"] > 0, c["ep"] == 8]
    for mask in masks:
        picked = np.append(picked, np.flatnonzero(mask)[:2])
    for i in picked:
        stack = g.stacks[g.stack_ids()[i]]
        s = make_strategy(stack=stack, **{k: float(c[k][i]) for k in LEAF_NAMES})
        one = STEP(model.spec, H100.spec, H100.constants, s)
        for leaf_grid, leaf_one in zip(out, jax.tree.leaves(one), strict=True):
            np.testing.assert_allclose(leaf_grid[i], np.asarray(leaf_one), rtol=2e-6, atol=0)
