"""Which fused attention kernel runs (``attention_kernel``: cuDNN or FlashAttention-2, issue 15).

The H100 preset's ``fa2_attention_ratio`` is the published ratio of the two kernels (Shah et al.
2024, FlashAttention-3, Figs. 5-6); invariants: cuDNN (the default) ignores the ratio bit for
bit, FA2 at ratio 1 is cuDNN bit for bit, a smaller ratio only slows the attention (more for
longer sequences, never the GEMMs); the grid equals one-by-one; the loader gives torchtitan FA2
and the Megatron family cuDNN; a bad ratio in a hardware file is one error naming the field.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calibration.public_runs import MAIN_CSV, load_published_runs
from perfmodel import AttentionKernel, load_hardware, make_strategy, step_time
from perfmodel.search.evaluate import compile_options, evaluate_grid
from perfmodel.search.grid import enumerate_strategies
from perfmodel.specs.hardware import hardware_from_dict
from perfmodel.specs.model import model_from_dict
from perfmodel.specs.strategy import leaves_of, stack_strategies
from simbase.errors import AisimError

H100 = load_hardware("h100-sxm")
# one strategy compiles as the library compiles an estimate (XLA:CPU's fast path for few rows)
STEP = jax.jit(step_time, compiler_options=compile_options(1))


def _m(seq_len=8192):
    return model_from_dict(
        dict(
            kind="transformer",
            num_layers=4,
            hidden_size=1024,
            num_heads=8,
            num_kv_heads=2,
            ffn_hidden_size=3584,
            seq_len=seq_len,
            vocab_size=32000,
            gated_mlp=True,
            tied_embeddings=False,
            learned_pos_emb=False,
            bias=False,
            dropout=False,
        ),
        "test",
    ).spec


def _s(**kw):
    return make_strategy(**dict(dict(dp=2, fused_attention=True, recompute="full"), **kw))


def _hw(ratio):
    return dataclasses.replace(H100.spec, fa2_attention_ratio=jnp.float32(ratio))


def _t(m, hw, s):
    return float(STEP(m, hw, H100.constants, s).step_time_s)


def test_h100_ratio_is_flashattention3_papers():
    # Shah et al. 2024 (arXiv:2407.08608), H100 SXM5, head dim 128, 16K tokens: FlashAttention-2
    # 370 TFLOP/s forward and 322 backward, cuDNN 595 and 516
    assert float(H100.spec.fa2_attention_ratio) == pytest.approx(370 / 595, abs=0.005)
    assert float(H100.spec.fa2_attention_ratio) == pytest.approx(322 / 516, abs=0.005)
    assert float(load_hardware("a100-80gb").spec.fa2_attention_ratio) == 1.0  # not measured


def test_cudnn_ignores_the_ratio_and_fa2_at_one_is_cudnn_bit_for_bit():
    m = _m()
    a = STEP(m, _hw(0.62), H100.constants, _s())
    b = STEP(m, _hw(1.0), H100.constants, _s())
    c = STEP(m, _hw(1.0), H100.constants, _s(attention_kernel="fa2"))
    for x, y in ((a, b), (b, c)):
        assert jax.tree.all(jax.tree.map(lambda u, v: bool(u == v), x, y))
    assert _s().stack.attention_kernel == AttentionKernel.CUDNN


def test_fa2_slows_only_the_attention_more_at_longer_sequences():
    fa2 = _s(attention_kernel="fa2")
    slower = []
    for seq in (2048, 32768):
        m = _m(seq)
        base, slow = _t(m, H100.spec, _s()), _t(m, H100.spec, fa2)
        assert slow > base
        slower.append(slow / base)
        one = STEP(m, H100.spec, H100.constants, fa2)
        ref = STEP(m, H100.spec, H100.constants, _s())
        assert float(one.model_flops) == float(ref.model_flops)
        assert float(one.memory_per_device_bytes) == float(ref.memory_per_device_bytes)
    assert slower[1] > slower[0]  # the s² share grows with the sequence
    # an unfused attention (the scores in memory) is not a fused kernel: the knob does nothing
    m = _m(2048)
    unfused = dict(fused_attention=False)
    assert _t(m, H100.spec, _s(**unfused)) == _t(m, H100.spec, _s(attention_kernel=1, **unfused))


@pytest.mark.slow
def test_grid_equals_one_by_one_for_the_attention_kernel_and_eager():
    """Each (eager, kernel) pair is a stack of its own: its grid of layouts, evaluated in one
    program, equals each strategy evaluated alone."""
    m = _m(16384)
    layouts = (dict(), dict(dp=1, tp=2), dict(dp=1, pp=2, num_microbatches=2, recompute="none"))
    for e in (False, True):
        for k in ("cudnn", "fa2"):
            rows = [_s(eager=e, attention_kernel=k, **lay) for lay in layouts]
            assert len({r.stack for r in rows}) == 1
            leaves = [leaves_of(r) for r in rows]
            cols = {n: np.array([float(v[n]) for v in leaves], np.float32) for n in leaves[0]}
            out = evaluate_grid(m, H100.spec, H100.constants, stack_strategies(cols, rows[0].stack))
            one = [_t(m, H100.spec, r) for r in rows]
            np.testing.assert_allclose(np.asarray(out.step_time_s), one, rtol=1e-6)


@pytest.mark.slow  # evaluates the torchtitan published runs
def test_loader_gives_torchtitan_flashattention2():
    runs, _ = load_published_runs(MAIN_CSV)
    kernels = {"torchtitan": AttentionKernel.FA2}
    kernels |= dict.fromkeys(("megatron-core", "nemo", "megatron-bridge"), AttentionKernel.CUDNN)
    assert {r.framework for r in runs} >= set(kernels)
    for r in runs:
        if r.framework in kernels:
            assert r.strategy.stack.attention_kernel == kernels[r.framework], r.label


def test_a_bad_ratio_in_a_hardware_file_names_the_field():
    doc = json.loads(Path(H100.path).read_text())
    doc["fa2_attention_ratio"] = 1.5
    with pytest.raises(AisimError, match="fa2_attention_ratio"):
        hardware_from_dict(doc, "my-gpu.json")


def _stack_column(g, name):
    """A stack behaviour's value on each row of a grid (the row's stack's)."""
    return np.asarray([getattr(g.stacks[i], name) for i in g.stack_ids()])


def test_grid_crosses_eager_everywhere_and_the_kernel_only_with_fused_attention():
    def grid(**kw):
        return enumerate_strategies(
            num_layers=4,
            num_heads=8,
            num_kv_heads=2,
            num_gpus=[8],
            global_batch_size=[16],
            seq_len=8192,
            gpus_per_node=8,
            tp=[1, 2],
            pp=[1],
            fused_attention=[False, True],
            **kw,
        )

    base = grid()
    # defaults: off, cudnn
    assert not _stack_column(base, "eager").any()
    assert set(_stack_column(base, "attention_kernel")) == {AttentionKernel.CUDNN}
    both = grid(eager=[False, True], attention_kernel=["cudnn", "fa2"])
    fused = int(_stack_column(base, "fused_attention").sum())
    assert len(both) == 2 * (len(base) + fused)
    kernel, on = _stack_column(both, "attention_kernel"), _stack_column(both, "fused_attention")
    assert not ((kernel == AttentionKernel.FA2) & ~on.astype(bool)).any()
