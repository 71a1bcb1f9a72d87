"""PyTorch's ring attention (``--cp-comm torch``, issue 15): merges and exchange.

Hand values of :func:`perfmodel.step.torch_ring.torch_ring_ops` on a tiny Llama-style layer (each
tensor op of ``_templated_ring_attention`` and its backward counted with a pencil), the
exchange's exposed time by hand, invariants (the ring's merges add time but no FLOP and no
byte of memory, and nothing without context parallelism), the grid against one-by-one
evaluation, and the loader giving torchtitan's CP rows this ring.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from calibration.public_runs import MAIN_CSV, load_published_runs
from perfmodel import load_hardware, make_strategy, step_time
from perfmodel.search.evaluate import compile_options, evaluate_grid
from perfmodel.specs.choices import CpComm
from perfmodel.specs.model import model_from_dict
from perfmodel.specs.strategy import leaves_of, stack_strategies
from perfmodel.step import collectives as coll
from perfmodel.step import communication as comm_terms
from perfmodel.step.torch_ring import torch_ring_ops

H100 = load_hardware("h100-sxm")
# one strategy compiles as the library compiles an estimate (XLA:CPU's fast path for few rows)
STEP = jax.jit(step_time, compiler_options=compile_options(1))

# the shared tiny Llama-style layer: h 64, 4 heads of 16, 2 K/V heads, 16 tokens
LLAMA = json.loads((Path(__file__).parent / "fixtures" / "tiny_llama.json").read_text()) | dict(
    hidden_size=64, num_heads=4, ffn_hidden_size=128, seq_len=16
)


def _m(**kw):
    return model_from_dict(dict(LLAMA, **kw), "test").spec


def _ring(cp=2.0, tp=1.0, eager=False, cp_comm="torch", b=2.0):
    s = make_strategy(
        dp=1, tp=tp, cp=cp, micro_batch_size=b, cp_comm=cp_comm, eager=eager, fused_attention=True
    )
    f, w = torch_ring_ops(_m(), s.layout, s.batching, s.stack.eager, 2.0)
    return float(f.bytes), float(w.bytes), float(f.kernels), float(w.kernels)


def test_merge_and_accumulation_bytes_by_hand():
    # b=2, s=16, cp 2: T = 16 tokens on a rank, one ring step after the local block (n = 1).
    # Q = O = 16 x 64 = 1024 elements; K and V at the query's 4 heads (repeat_kv): 2048.
    # forward, compiled: per step read fp32 out (4) + bf16 block (2), write fp32 (4) = 10 per
    # output element; the first block's upcast (2+4) and the final downcast (4+2) = 12
    fwd, bwd, kf, kb = _ring()
    assert fwd == 1 * 10 * 1024 + 12 * 1024
    # backward, compiled: zeroed fp32 dQ/dK/dV (4 per element of Q + K/V = 3072), the local
    # block's adds into them (4+2 read, 4 write), the final casts to bf16 (4+2); per step dQ
    # += (10 per element) and the arriving fp32 dK/dV buffer plus the half-block gradient
    # written on (4 + 1 + 4 = 9 per K/V element)
    assert bwd == 4 * 3072 + 10 * 3072 + 6 * 3072 + 1 * (10 * 1024 + 9 * 2048)
    assert (kf, kb) == (1 + 2, 2 * 1 + 7)
    # eager: the merge is .to(fp32) (2+4), out - block (4+4+4), sigmoid(..) * diff (4+4),
    # out - prod (4+4+4) = 38 per element, and the K/V concatenation for the exchange (2+2 per
    # K/V element); backward per step dQ += (10), the half-block in-place add (10 / 2), the
    # chunks' torch.cat (4+4) and the send's torch.cat (4+4) per K/V element, and the K/V
    # concatenation again (2+2)
    fwd_e, bwd_e, kf_e, kb_e = _ring(eager=True)
    assert fwd_e == 1 * 38 * 1024 + 12 * 1024 + 1 * 4 * 2048
    assert bwd_e == (4 + 10 + 6) * 3072 + 1 * (10 * 1024 + (5 + 8 + 8 + 4) * 2048)
    assert (kf_e, kb_e) == (11 * 1 + 2, 7 * 1 + 10)
    # cp 4 (n = 3) on half the tokens per rank: T = 8
    fwd4, bwd4, _, _ = _ring(cp=4.0)
    assert fwd4 == 3 * 10 * 512 + 12 * 512
    assert bwd4 == 20 * 1536 + 3 * (10 * 512 + 9 * 1024)
    # tensor parallelism splits the heads
    fwd_tp, bwd_tp, _, _ = _ring(tp=2.0)
    assert (fwd_tp, bwd_tp) == (fwd / 2, bwd / 2)


@pytest.mark.parametrize(
    ("cp", "cp_comm"), [(1.0, "torch"), (2.0, "p2p"), (2.0, "allgather"), (4.0, "p2p")]
)
def test_nothing_without_pytorchs_ring(cp, cp_comm):
    if cp_comm == "torch":  # the ring's kernels: none without context parallelism
        assert _ring(cp=cp, cp_comm=cp_comm) == (0.0, 0.0, 0.0, 0.0)
    # the step computes no merges: the same compute as under another exchange without them
    other = {"torch": "p2p", "p2p": "allgather", "allgather": "p2p"}[cp_comm]

    def compute(kind):
        s = make_strategy(dp=1, cp=cp, micro_batch_size=2, cp_comm=kind, fused_attention=True)
        return float(STEP(_m(), H100.spec, H100.constants, s).compute_s)

    assert compute(cp_comm) == compute(other)


def test_exchange_exposed_by_hand():
    # K/V (at the query's heads, bf16) all-gathered once per layer behind the local block;
    # dK/dV in fp32 around the ring, each send behind the next step's attention, the last one
    # after the loop; a forward recomputed under full recomputation gathers again
    m = _m()
    s = make_strategy(dp=1, cp=4, micro_batch_size=2, cp_comm="torch", fused_attention=True)
    a, b = comm_terms.links(H100.spec, H100.constants, 4.0, 1.0, 8.0)
    kv = 2 * 16 / 4 * (64 + 64)  # elements on a rank
    ag = float(coll.all_gather_s(4.0, 4 * kv * 2.0, a, b))
    dkv = float(coll.p2p_s(kv * 4.0, a, b))
    layers = 4.0
    # no attention to hide behind: everything is exposed
    bare = comm_terms.cp_exchange(m, H100.spec, H100.constants, s, 2.0, 0.0, 0.0, layers, False)
    assert float(bare) == pytest.approx(layers * (ag + ag + 3 * dkv), rel=1e-6)
    redo = comm_terms.cp_exchange(m, H100.spec, H100.constants, s, 2.0, 0.0, 0.0, layers, True)
    assert float(redo) == pytest.approx(layers * (2 * ag + ag + 3 * dkv), rel=1e-6)
    # long attention hides the gather and the middle sends, never the last send
    hidden = comm_terms.cp_exchange(m, H100.spec, H100.constants, s, 2.0, 1.0, 1.0, layers, False)
    assert float(hidden) == pytest.approx(layers * dkv, rel=1e-6)


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("tp", [1, 8])
def test_ring_merges_add_time_but_no_flop_or_memory(recompute, tp):
    m = _m(seq_len=32768, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=14336)
    base = dict(dp=2, tp=tp, cp=4, recompute=recompute, fused_attention=True, gpus_per_node=8)
    p2p = STEP(m, H100.spec, H100.constants, make_strategy(**base))
    ring = STEP(m, H100.spec, H100.constants, make_strategy(**base, cp_comm="torch"))
    assert float(ring.compute_s) > float(p2p.compute_s)
    assert float(ring.step_time_s) > float(p2p.step_time_s)
    assert float(ring.hardware_flops) == float(p2p.hardware_flops)
    assert float(ring.memory_per_device_bytes) == float(p2p.memory_per_device_bytes)


@pytest.mark.slow
def test_grid_with_pytorchs_ring_equals_one_by_one():
    """Each exchange (and PyTorch's ring eager) is a stack: its grid of layouts, one program,
    equals each strategy alone."""
    m = _m(seq_len=4096, hidden_size=1024, num_heads=8, num_kv_heads=2, ffn_hidden_size=3584)
    layouts = [
        dict(dp=4, tp=2, cp=2, recompute=2.0),
        dict(dp=2, tp=1, cp=8),
        dict(dp=1, tp=4, cp=4, recompute=2.0),
    ]
    stacks = [dict(cp_comm=2.0), dict(cp_comm=2.0, eager=1.0), dict(cp_comm=0.0),
              dict(cp_comm=1.0)]  # fmt: skip
    base = dict(pp=1.0, micro_batch_size=1.0, num_microbatches=2.0, interleave=1.0, schedule=1.0,
                fused_attention=1.0, gpus_per_node=8.0, dp_overlap=1.0, dtype=2.0,
                zero_stage=0.0, recompute=0.0, sequence_parallel=0.0)  # fmt: skip
    for behaviours in stacks:
        ones = [make_strategy(**(base | lay | behaviours)) for lay in layouts]
        leaves = [leaves_of(s) for s in ones]
        cols = {k: np.asarray([float(v[k]) for v in leaves]) for k in leaves[0]}
        out = evaluate_grid(m, H100.spec, H100.constants, stack_strategies(cols, ones[0].stack))
        for i, s in enumerate(ones):
            one = STEP(m, H100.spec, H100.constants, s)
            for name in ("step_time_s", "compute_s", "cp_comm_s", "memory_per_device_bytes"):
                assert float(getattr(out, name)[i]) == pytest.approx(
                    float(getattr(one, name)), rel=1e-6
                ), (behaviours, i, name)

    # the ring's eager merges cost more than its compiled ones, same strategy otherwise
    def merges(eager):
        def run(**kw):
            s = make_strategy(dp=2, cp=8, eager=eager, fused_attention=True, **kw)
            return float(STEP(m, H100.spec, H100.constants, s).compute_s)

        return run(cp_comm="torch") - run()

    assert merges(True) > merges(False) > 0.0


@pytest.mark.slow
def test_loader_gives_torchtitans_context_parallel_rows_pytorchs_ring():
    runs, _ = load_published_runs(MAIN_CSV)
    cp_runs = [r for r in runs if float(r.strategy.layout.cp) > 1]
    titan = [r for r in cp_runs if r.framework == "torchtitan"]
    others = [r for r in cp_runs if r.framework != "torchtitan"]
    assert len(titan) == 6 and others
    assert all(r.strategy.stack.cp_comm == CpComm.TORCH for r in titan)
    assert all(r.strategy.stack.cp_comm == CpComm.P2P for r in others)
