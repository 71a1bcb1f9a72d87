"""The boundary check of one strategy (:func:`perfmodel.specs.validate.strategy_from_knobs`):
each parallel degree, the shard group, recomputation and the stack's switches checked against
the model and the GPU count, the error naming the knob by its registry name."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.specs.choices import CpComm, Dtype, MoeDispatch
from perfmodel.specs.strategy import strategy_to_dict
from perfmodel.specs.validate import strategy_from_knobs
from simbase.errors import AisimError

SHAPE = dict(num_layers=8, num_heads=16, num_kv_heads=8)
MOE = dict(SHAPE, num_experts=16, seq_len=1024)


def knobs(**kw):
    return strategy_from_knobs(**(MOE | {"num_gpus": 64} | kw))


def error(**kw) -> AisimError:
    with pytest.raises(AisimError) as e:
        knobs(**kw)
    return e.value


def test_cp_is_a_factor_of_the_gpu_count():
    s = knobs(tp=2, pp=2, cp=4)
    assert float(s.layout.dp) == 4 and float(s.num_gpus) == 64  # 64 = dp·tp·pp·cp
    e = error(tp=2, pp=2, cp=3)
    assert e.field == "cp" and e.value == 3
    e = error(tp=2, pp=2, cp=4, dp=8)
    assert e.field == "dp" and "tp·cp·pp" in e.expected and "4" in e.expected


def test_cp_splits_the_sequence_into_2cp_chunks():
    knobs(cp=8, seq_len=1024)  # 1024 % 16 == 0
    e = error(cp=8, seq_len=1000)  # 1000 % 16 != 0
    assert e.field == "cp" and "1000" in e.expected and "2·cp" in e.expected
    knobs(cp=4, seq_len=None)  # unknown sequence: not checked here (the step model masks it)


def test_expert_parallel_rules():
    s = knobs(tp=2, ep=8, etp=2)
    assert (float(s.layout.ep), float(s.layout.etp)) == (8, 2)
    e = error(ep=3)
    assert e.field == "ep" and "16 routed experts" in e.expected
    # tp·cp·dp = 2·1·4 = 8 ranks per stage (pp 8): ep·etp = 16 does not fit
    e = error(tp=2, pp=8, ep=16)
    assert e.field == "ep" and "tp·cp·dp" in e.expected
    e = error(tp=2, pp=8, ep=8, etp=2)
    assert e.field == "etp"
    for field in ("ep", "etp"):
        e = error(num_experts=0, **{field: 2})
        assert e.field == field and "no experts" in e.expected


def test_hsdp_shard_size_rules():
    s = knobs(zero_stage=3, shard_size=8)
    assert float(s.memory.shard_size) == 8
    e = error(zero_stage=1, shard_size=8)
    assert e.field == "shard_size" and "ZeRO stage is 3" in e.expected
    e = error(zero_stage=3, shard_size=3)
    assert e.field == "shard_size" and "dp·cp = 64·1" in e.expected
    knobs(zero_stage=3, shard_size=16, cp=2)  # divides dp·cp = 32·2
    assert error(zero_stage=3, shard_size=-1).field == "shard_size"


def test_recompute_layers_and_imbalance_rules():
    s = knobs(pp=2, recompute="full", recompute_layers=4)
    assert float(s.memory.recompute_layers) == 4
    e = error(pp=2, recompute="selective", recompute_layers=2)
    assert e.field == "recompute_layers" and "full" in e.expected
    e = error(pp=2, recompute="full", recompute_layers=5)  # 8 layers / pp 2 = 4 per stage
    assert e.field == "recompute_layers" and "4 layers of a stage" in e.expected
    e = error(moe_imbalance=0.9)
    assert e.field == "moe_imbalance"


def test_switch_defaults_and_choices():
    s = knobs()
    assert s.stack.grad_reduce_fp32 is None  # automatic: by the dtype
    assert strategy_to_dict(s)["grad_reduce_fp32"] is True  # bf16: Megatron-Core reduces in fp32
    assert strategy_to_dict(knobs(dtype="fp16"))["grad_reduce_fp32"] is False
    assert knobs(dtype="bf16", grad_reduce_fp32=False).stack.grad_reduce_fp32 is False
    assert knobs(grad_reduce_dtype="bf16").stack.grad_reduce_fp32 is False
    s = knobs(cp=2, ep=4, moe_dispatch="allgather", cp_comm="allgather", fsdp_reshard=False)
    assert s.stack.moe_dispatch == MoeDispatch.ALLGATHER and s.stack.cp_comm == CpComm.ALLGATHER
    assert s.stack.fsdp_reshard is False
    assert error(moe_dispatch="broadcast").field == "moe_dispatch"


def test_interleaved_chunks_may_split_the_layers_unevenly():
    """Qwen3-235B's 94 layers on pp 8 × 4 chunks (94 + embedding + loss = 32 chunks of 3) and
    on 8 × 5 (uneven: a custom Megatron-Core pipeline layout) are accepted, as the step model's
    validity accepts them; more chunks than the 94 layers, the embedding and the loss are not."""
    shape = dict(SHAPE, num_layers=94, num_gpus=64, pp=8, global_batch=64)
    s = strategy_from_knobs(**shape, interleave=4)
    assert (float(s.batching.interleave), float(s.batching.num_microbatches)) == (4, 8)
    assert float(strategy_from_knobs(**shape, interleave=5).batching.interleave) == 5
    # 96 chunks
    assert float(strategy_from_knobs(**shape, interleave=12).batching.interleave) == 12
    with pytest.raises(AisimError) as e:
        strategy_from_knobs(**shape, interleave=13)  # 104 chunks > 96
    assert e.value.field == "interleave"


def test_an_automatic_knob_reads_as_the_physics_uses_it():
    """``grad_reduce_fp32`` left automatic is derived once, by the registry: the report of one
    strategy, the columns of a grid and the gradient bytes the memory model counts agree."""
    from perfmodel.search.report import strategy_columns
    from perfmodel.specs.strategy import stack_strategies
    from perfmodel.step.memory import grad_bytes_per_param

    for dtype in ("bf16", "fp16", "fp8", "fp4"):
        s = knobs(dtype=dtype)
        shown = strategy_to_dict(s)["grad_reduce_fp32"]
        assert shown is (float(grad_bytes_per_param(s)) == 4.0), dtype
    codes = np.asarray([float(Dtype.BF16), float(Dtype.FP16), float(Dtype.FP8)], np.float32)
    grid = stack_strategies({"dtype": codes})
    assert strategy_columns(grid)["grad_reduce_fp32"].tolist() == [True, False, True]
