"""PyTorch eager mode's unfused elementwise kernels (the ``eager`` knob, issue 15).

Hand values of :func:`perfmodel.step.eager.eager_elementwise_bytes` on a tiny Llama-style layer (each
op of torchtitan's RMSNorm, RoPE, SwiGLU and residual adds counted with a pencil), invariants
(eager never speeds a step up, changes no FLOP and no byte of memory, leaves an MLP alone, and
off changes nothing bit for bit), and torchtitan's published eager/compiled twins (the grid
against one-by-one evaluation: tests/perfmodel/step/test_attention_kernel.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import pytest

from calibration.public_runs import MAIN_CSV, load_published_runs, predict_run
from perfmodel import load_hardware, make_strategy, step_time
from perfmodel.search.evaluate import compile_options
from perfmodel.specs.model import model_from_dict
from perfmodel.step.eager import eager_elementwise_bytes

H100 = load_hardware("h100-sxm")
# one strategy compiles as the library compiles an estimate (XLA:CPU's fast path for few rows)
STEP = jax.jit(step_time, compiler_options=compile_options(1))

# the shared tiny Llama-style layer, narrower and shorter
LLAMA = json.loads((Path(__file__).parent / "fixtures" / "tiny_llama.json").read_text()) | dict(
    hidden_size=64, num_heads=4, ffn_hidden_size=128, seq_len=16
)


def _m(**kw):
    return model_from_dict(dict(LLAMA, **kw), "test").spec


def test_eager_bytes_by_hand():
    # b=2, s=16: T=32 tokens; h=64, head 16: Q 64 wide, K 2 heads x 16 = 32; f=128, bf16.
    # per element: RMSNorm 2+4 (float) 4+4 (pow) 4 (mean) 4+4 (x*rsqrt) 4+2 (type_as)
    # 2+2 (*weight) = 36; residual add 2+2+2 = 6; RoPE 2+4, 4+4, 4+2 = 20; silu 2+2 and
    # product 2+2+2 = 10
    per_token = 2 * 64 * 36 + 2 * 64 * 6 + (64 + 32) * 20 + 128 * 10
    nbytes, kernels = eager_elementwise_bytes(_m(), 2.0, 1.0, 0.0, 2.0)
    assert float(nbytes) == 32 * per_token
    assert float(kernels) == 2 * 8 + 2 + 2 * 3 + 2
    # tp 2 with sequence parallelism splits every term; cp 2 halves the tokens
    split, _ = eager_elementwise_bytes(_m(), 2.0, 2.0, 1.0, 2.0, cp=2.0)
    assert float(split) == 32 * per_token / 4
    # without sequence parallelism the norms and residual adds stay whole on each tp rank
    rep, _ = eager_elementwise_bytes(_m(), 2.0, 2.0, 0.0, 2.0)
    assert float(rep) == 32 * (2 * 64 * 36 + 2 * 64 * 6 + ((64 + 32) * 20 + 128 * 10) / 2)
    # fp32 activations: .float() and .type_as() copy nothing (norm 20 and RoPE 8 per element)
    fp32, _ = eager_elementwise_bytes(_m(), 2.0, 1.0, 0.0, 4.0)
    assert float(fp32) == 32 * (2 * 64 * (20 + 8) + 2 * 64 * 12 + 96 * 8 + 128 * 20)
    # a plain (not gated) activation reads and writes once
    plain, k_plain = eager_elementwise_bytes(_m(gated_mlp=False), 2.0, 1.0, 0.0, 2.0)
    assert float(nbytes) - float(plain) == 32 * 128 * (10 - 4)
    assert float(k_plain) == float(kernels) - 1


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_eager_never_speeds_a_step_up_and_changes_no_flop_or_byte(recompute):
    m = _m(seq_len=4096, hidden_size=1024, num_heads=8, ffn_hidden_size=3584)
    base = dict(dp=2, tp=2, sequence_parallel=True, recompute=recompute, fused_attention=True)
    off = STEP(m, H100.spec, H100.constants, make_strategy(**base))
    on = STEP(m, H100.spec, H100.constants, make_strategy(**base, eager=True))
    assert float(on.step_time_s) > float(off.step_time_s)
    assert float(on.model_flops) == float(off.model_flops)
    assert float(on.hardware_flops) == float(off.hardware_flops)
    assert float(on.memory_per_device_bytes) == float(off.memory_per_device_bytes)


def test_eager_leaves_an_mlp_alone():
    mlp = model_from_dict(
        dict(kind="mlp", num_layers=3, hidden_size=256, input_size=64, output_size=10), "mlp"
    ).spec
    off = STEP(mlp, H100.spec, H100.constants, make_strategy(dp=2))
    on = STEP(mlp, H100.spec, H100.constants, make_strategy(dp=2, eager=True))
    assert float(on.step_time_s) == float(off.step_time_s)


def test_eager_off_is_the_default_and_changes_nothing_bit_for_bit():
    m = _m()
    s = make_strategy(dp=2, tp=2, sequence_parallel=True, fused_attention=True)
    assert s.stack.eager is False
    explicit = dataclasses.replace(s, stack=s.stack.replace(eager="off"))
    assert explicit.stack == s.stack
    a = STEP(m, H100.spec, H100.constants, s)
    b = STEP(m, H100.spec, H100.constants, explicit)
    assert jax.tree.all(jax.tree.map(lambda x, y: bool(x == y), a, b))


@pytest.mark.slow
def test_torchtitan_eager_twins_are_read_and_separate_as_measured():
    # torchtitan's 2024-12 Llama 3 8B tables: FSDP eager vs FSDP + torch.compile on 8 and on
    # 128 H100s (published_runs.csv rows 51/52 and 54/55): 5762 vs 6667 and 5605 vs 6514 tokens/s
    runs, _ = load_published_runs(MAIN_CSV)
    by_row = {r.row: r for r in runs}
    for eager_row, compiled_row in ((51, 52), (54, 55)):
        e, c = by_row[eager_row], by_row[compiled_row]
        assert e.strategy.stack.eager is True and c.strategy.stack.eager is False
        measured = e.measured_step_s / c.measured_step_s
        predicted = predict_run(e)["predicted_s"] / predict_run(c)["predicted_s"]
        assert measured == pytest.approx(1.16, abs=0.01)
        # the unfused kernels alone account for the measured gap within 5%
        assert predicted == pytest.approx(measured, rel=0.05)
    # only those two of torchtitan's rows ran eager
    assert sum(r.strategy.stack.eager for r in runs if r.framework == "torchtitan") == 2
