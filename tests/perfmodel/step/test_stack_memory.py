"""The memory facts that made measured runs fit (issue 15): optimizer remainders, Megatron-Core's
recompute modules, the B200's capacity, and what the published-runs loader reads from its rows.

Hand values on tiny models (every byte can be followed with a pencil), the published numbers
behind the presets, and invariants: a knob left off changes nothing (bit for bit), recomputing
more never adds memory and never makes a step faster.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import pytest

from perfmodel import load_hardware, make_strategy, step_time
from perfmodel.search.evaluate import compile_options
from perfmodel.specs.choices import RecomputeModule
from perfmodel.specs.model import attention_shape, model_from_dict
from perfmodel.specs.stack_preset import load_stack
from perfmodel.specs.validate import strategy_from_knobs
from perfmodel.step.memory import memory_per_device, stage_activation_bytes, stage_params_split
from simbase.errors import AisimError

H100 = load_hardware("h100-sxm")
# one strategy compiles as the library compiles an estimate (XLA:CPU's fast path for few rows)
STEP = jax.jit(step_time, compiler_options=compile_options(1))

# a tiny Llama-style layer (GQA, SwiGLU, no biases, no dropout), shared by the step tests
DENSE = json.loads((Path(__file__).parent / "fixtures" / "tiny_llama.json").read_text())
MOE = dict(DENSE, num_experts=8, experts_per_token=2, moe_ffn_hidden_size=128, dense_layers=1)
MLA = dict(
    DENSE,
    q_lora_rank=64,
    kv_lora_rank=32,
    qk_rope_head_dim=16,
    qk_nope_head_dim=32,
    v_head_dim=32,
)


def _m(base=DENSE, **kw):
    return model_from_dict(dict(base, **kw), "test").spec


def _s(**kw):
    kw = dict(dict(recompute="selective", fused_attention=True, micro_batch_size=2), **kw)
    return make_strategy(**kw)


def _acts(m, s):
    return float(stage_activation_bytes(m, s))


# -- param_remainders -------------------------------------------------------------------------


def test_param_remainders_save_two_bytes_per_parameter_by_hand():
    m = _m()
    base, rem = _s(), _s(param_remainders=True)
    dense, experts = stage_params_split(m, base.layout)
    p = float(dense + experts)
    a, b = memory_per_device(m, base), memory_per_device(m, rem)
    # Adam state: 12 bytes (fp32 master, momentum, variance) -> 10 (16-bit remainders)
    assert float(a.optimizer_bytes) == pytest.approx(12.0 * p)
    assert float(a.optimizer_bytes - b.optimizer_bytes) == pytest.approx(2.0 * p)
    assert float(a.weights_bytes) == float(b.weights_bytes)
    # sharded by the distributed optimizer like the rest of the state
    z1 = memory_per_device(m, _s(dp=4, zero_stage=1, param_remainders=True))
    assert float(z1.optimizer_bytes) == pytest.approx(10.0 * p / 4)


@pytest.mark.parametrize("dtype", ["fp16", "fp8", "fp32"])
def test_param_remainders_only_complete_bf16_weights(dtype):
    m = _m()
    on = memory_per_device(m, _s(dtype=dtype, param_remainders=True))
    off = memory_per_device(m, _s(dtype=dtype))
    assert float(on.total_bytes) == float(off.total_bytes)
    with pytest.raises(AisimError, match="param_remainders"):
        strategy_from_knobs(
            num_layers=4, num_heads=8, num_kv_heads=2, num_gpus=1, dtype=dtype,
            param_remainders=True,
        )  # fmt: skip


# -- bf16_moments (Megatron-Core's precision-aware optimizer) ----------------------------------


@pytest.mark.parametrize("dtype, state", [("bf16", 12.0), ("fp8", 12.0), ("fp32", 8.0)])
def test_bf16_moments_save_four_bytes_per_parameter_by_hand(dtype, state):
    m = _m()
    kw = dict(dp=4, zero_stage=1, dtype=dtype)
    a = memory_per_device(m, _s(**kw))
    b = memory_per_device(m, _s(bf16_moments=True, **kw))
    p = float(sum(stage_params_split(m, _s(**kw).layout)))
    # Adam's momentum and variance: 4 + 4 bytes -> 2 + 2, sharded by ZeRO-1 like the rest
    assert float(a.optimizer_bytes) == pytest.approx(state * p / 4)
    assert float(b.optimizer_bytes) == pytest.approx((state - 4.0) * p / 4)
    assert float(a.weights_bytes + a.gradients_bytes) == float(b.weights_bytes + b.gradients_bytes)
    # with the fp32 master kept as remainders too: 2 + 2 + 2, the Bridge MoE recipes' 6 bytes
    both = memory_per_device(m, _s(bf16_moments=True, param_remainders=True, dp=4, zero_stage=1))
    assert float(both.optimizer_bytes) == pytest.approx(6.0 * p / 4)


def test_megatron_core_keeps_bf16_moments_for_expert_parallel_runs_only():
    core, nemo = load_stack("megatron-core"), load_stack("megatron-core@nemo")
    rule = next(r for r in core.rules if r.knob == "bf16_moments")
    assert rule.value({"ep": 8}) and not rule.value({"ep": 1})
    assert all(r.knob != "bf16_moments" for r in nemo.rules) and not nemo.base.bf16_moments
    for name in ("torchtitan", "pytorch-fsdp", "deepspeed"):
        assert not load_stack(name).base.bf16_moments, name


# -- fsdp_fp32_params (PyTorch FSDP: the sharded parameter is the fp32 master) ---------------


@pytest.mark.parametrize("reduce_fp32", [True, False])
def test_fsdp_fp32_params_keep_16_bytes_per_parameter_by_hand(reduce_fp32):
    m, n = _m(), 8
    kw = dict(dp=n, zero_stage=3, grad_reduce_fp32=reduce_fp32)
    off, on = _s(**kw), _s(fsdp_fp32_params=True, **kw)
    dense, experts = stage_params_split(m, off.layout)
    p = float(dense + experts)
    gathered = 2.0 * p / m.num_layers * 2.0  # the current and the prefetched layer, in bf16
    a, b = memory_per_device(m, off), memory_per_device(m, on)
    # DeepSpeed/Megatron ZeRO-3: a sharded bf16 copy beside the fp32 master in the optimizer
    assert float(a.weights_bytes) == pytest.approx(2.0 * p / n + gathered)
    assert float(a.gradients_bytes) == pytest.approx((4.0 if reduce_fp32 else 2.0) * p / n)
    # FSDP: only the gathered layers are bf16; fp32 master (the parameter), m and v, fp32 grads
    assert float(b.weights_bytes) == pytest.approx(gathered)
    assert float(b.optimizer_bytes) == pytest.approx(12.0 * p / n)
    assert float(b.gradients_bytes) == pytest.approx(4.0 * p / n)
    assert float(b.weights_bytes + b.gradients_bytes + b.optimizer_bytes) == pytest.approx(
        16.0 * p / n + gathered
    )


def test_fsdp_fp32_params_drop_the_sharded_fp8_weights_and_leave_fp32_training_alone():
    m, n = _m(), 4
    p = float(sum(stage_params_split(m, _s(dp=n, zero_stage=3).layout)))
    fp8 = [
        memory_per_device(m, _s(dp=n, zero_stage=3, dtype="fp8", fsdp_fp32_params=f))
        for f in (0, 1)
    ]
    assert float(fp8[0].weights_bytes - fp8[1].weights_bytes) == pytest.approx(1.0 * p / n)
    # fp32 training: the weights already are the master (8 bytes of Adam state beside them)
    fp32 = [
        memory_per_device(m, _s(dp=n, zero_stage=3, dtype="fp32", fsdp_fp32_params=f))
        for f in (0, 1)
    ]
    assert float(fp32[0].total_bytes) == float(fp32[1].total_bytes)


@pytest.mark.parametrize("extra", [dict(zero_stage=1), dict(zero_stage=3, param_remainders=True)])
def test_fsdp_fp32_params_need_zero3_without_remainders(extra):
    with pytest.raises(AisimError, match="fsdp_fp32_params"):
        strategy_from_knobs(
            num_layers=4, num_heads=8, num_kv_heads=2, num_gpus=4, dtype="bf16",
            fsdp_fp32_params=True, **extra,
        )  # fmt: skip


# -- recompute_modules: memory by hand --------------------------------------------------------


def test_layernorm_module_drops_both_norm_outputs():
    m = _m()
    sbh = 1024 * 2 * 256  # s·b·h elements of one microbatch
    for tp, sp in ((1, False), (2, True)):
        a = _acts(m, _s(tp=tp, sequence_parallel=sp))
        b = _acts(m, _s(tp=tp, sequence_parallel=sp, recompute_modules="layernorm"))
        # QKV-GEMM and fc1 inputs, 2 bytes each per element, sequence-parallel shards under SP
        assert a - b == pytest.approx(4 * 2 * sbh * 2 / tp)


def test_mlp_module_drops_a_dense_mlps_fc1_and_activation_outputs():
    m = _m()
    T, f = 1024 * 2, 512
    a = _acts(m, _s(tp=2))
    b = _acts(m, _s(tp=2, recompute_modules="mlp"))
    # fc1 (gate and up: 2f) and the SwiGLU output (f), 16-bit, split over tp, 4 layers
    assert a - b == pytest.approx(4 * T * 3 * f * 2 / 2)
    # an MoE layer's MLP is Megatron-Core's "moe" module, not "mlp": only the dense layer saves
    moe = _m(MOE)
    a = _acts(moe, _s())
    b = _acts(moe, _s(recompute_modules="mlp"))
    assert a - b == pytest.approx(1 * T * 3 * f * 2)


def test_moe_act_module_drops_the_routed_activation_outputs():
    moe = _m(MOE)
    a = _acts(moe, _s())
    b = _acts(moe, _s(recompute_modules="moe_act"))
    routed = 1024 * 2 * 2  # b·s·k token copies on one rank (tp 1, balanced)
    assert a - b == pytest.approx(3 * routed * 128 * 2)  # 3 MoE layers, fe = 128, 2 bytes


def test_mla_up_proj_module_keeps_the_latents_instead_of_q_k_v():
    m = _m(MLA)
    att = attention_shape(m)
    T = 1024 * 2
    a = _acts(m, _s())
    b = _acts(m, _s(recompute_modules=["mla_up_proj"]))
    q_k_v = float(att.q_dim + att.kv_exchanged)  # 8·48 + 8·(48 + 32) = 1024 per token
    latents = 64 + 32 + 16
    assert a - b == pytest.approx(4 * T * (q_k_v - latents) * 2)
    # no latent attention, nothing to recompute
    assert _acts(_m(), _s(recompute_modules="mla_up_proj")) == _acts(_m(), _s())


def test_recompute_modules_need_selective_recomputation():
    m = _m()
    for mode in ("none", "full"):
        assert _acts(m, _s(recompute=mode, recompute_modules="layernorm,mlp")) == _acts(
            m, _s(recompute=mode)
        )
    with pytest.raises(AisimError, match="recompute_modules"):
        strategy_from_knobs(
            num_layers=4, num_heads=8, num_kv_heads=2, num_gpus=1, recompute="full",
            recompute_modules="mlp",
        )  # fmt: skip
    with pytest.raises(AisimError, match="module names"):
        RecomputeModule.parse("attention", "recompute_modules")
    assert RecomputeModule.parse("core_attn, mla_up_proj,mlp", "x") == 12
    assert RecomputeModule.label_of(3) == "layernorm,moe_act"


# -- recompute_modules: time ------------------------------------------------------------------


@pytest.mark.parametrize("base", [DENSE, MOE, MLA], ids=["dense", "moe", "mla"])
def test_recomputing_more_never_speeds_up_or_adds_memory(base):
    m = _m(base)
    off = STEP(m, H100.spec, H100.constants, _s(dp=2, tp=2, sequence_parallel=True))
    on = STEP(
        m,
        H100.spec,
        H100.constants,
        _s(dp=2, tp=2, sequence_parallel=True, recompute_modules=15),
    )
    assert float(on.step_time_s) > float(off.step_time_s)
    assert float(on.memory_per_device_bytes) < float(off.memory_per_device_bytes)
    assert float(on.hardware_flops) >= float(off.hardware_flops)
    assert float(on.model_flops) == float(off.model_flops)


def test_knobs_left_off_change_nothing_bit_for_bit():
    m = _m(MOE)
    s = _s(dp=2, tp=2, sequence_parallel=True, zero_stage=1)
    explicit = dataclasses.replace(
        s, stack=s.stack.replace(param_remainders=False, recompute_modules=0)
    )
    a = STEP(m, H100.spec, H100.constants, s)
    b = STEP(m, H100.spec, H100.constants, explicit)
    assert jax.tree.all(jax.tree.map(lambda x, y: bool(x == y), a, b))


# -- published numbers ------------------------------------------------------------------------


def test_b200_capacity_is_what_the_driver_reports():
    # nvidia-smi on a B200: 183359 MiB (NVIDIA/TensorRT-LLM issue #10278, driver 580.95)
    b200 = load_hardware("b200")
    assert float(b200.spec.memory_capacity_bytes) / 2**30 == pytest.approx(183359 / 1024, abs=0.1)


# -- torchtitan: per-op SAC, the unfused loss, FSDP's step gather -----------------------------


def test_per_op_sac_keeps_every_other_matmul_output_by_hand():
    # torchtitan's policy on a Llama layer: input x, Q (wq), V (wv), the attention output, w1's
    # output and w2's output stay: 2·(h + q + v + a + f + h)/h units of s·b·h, tp 1, no dropout
    m = _m()
    sbh = 1024 * 2 * 256
    h, q, v, f = 256, 8 * 32, 2 * 32, 512
    kept = 2 * (h + q + v + q + f + h) / h
    got = _acts(m, _s(recompute_modules="per_op"))
    assert got == pytest.approx(4 * kept * sbh)
    # "none" keeps 8 + 2·(q + k + v + a)/h + 2·f·3/h = 25 units here, per-op 12.5
    assert got == pytest.approx(0.5 * _acts(m, _s(recompute="none")))


def test_per_op_sac_redoes_k_o_and_w3_once_more():
    m = _m()
    s0 = _s(recompute="none", dp=2)
    s1 = _s(recompute_modules="per_op", dp=2)
    a = STEP(m, H100.spec, H100.constants, s0)
    b = STEP(m, H100.spec, H100.constants, s1)
    # GEMM FLOPs redone per layer and sample: K (h·kv/2), O (q·h) and w3 (h·f), 2 FLOPs each
    h, kv, q, f = 256, 2 * 32, 8 * 32, 512
    per_token = 2 * (h * kv + q * h + h * f)
    extra = 2 * 4 * per_token * 1024 * 2  # 2 replicas, 4 layers, microbatch of 2 sequences
    assert float(b.hardware_flops - a.hardware_flops) == pytest.approx(extra, rel=1e-5)
    assert float(b.step_time_s) > float(a.step_time_s)


def test_logit_bytes_scale_the_single_stage_loss():
    m = _m()
    a = memory_per_device(m, _s())
    b = memory_per_device(m, _s(logit_bytes=12.0))
    logits = 1024 * 2 * 1000  # s·b·V of one microbatch
    assert float(b.activations_bytes - a.activations_bytes) == pytest.approx(8 * logits)
    # with pipeline stages the first stage (the peak) holds no logits
    pa = memory_per_device(m, _s(pp=2))
    pb = memory_per_device(m, _s(pp=2, logit_bytes=12.0))
    assert float(pa.total_bytes) == float(pb.total_bytes)
    with pytest.raises(AisimError, match="logit_bytes"):
        strategy_from_knobs(num_layers=4, num_heads=8, num_kv_heads=2, num_gpus=1, logit_bytes=0)


def test_fsdp_step_gather_gathers_once_and_holds_the_stage_by_hand():
    m = _m()
    kw = dict(dp=8, zero_stage=3, num_microbatches=4, fsdp_reshard=False)
    per_mb, step = _s(**kw), _s(**kw, fsdp_step_gather=True)
    dense, experts = stage_params_split(m, per_mb.layout)
    p = float(dense + experts)
    a, b = memory_per_device(m, per_mb), memory_per_device(m, step)
    # fp32 gradients accumulated unsharded across the microbatches: 4 bytes per parameter more
    assert float(b.gradients_bytes - a.gradients_bytes) == pytest.approx(4.0 * p)
    assert float(b.weights_bytes) == float(a.weights_bytes)  # the stage gathered in both
    ta = STEP(m, H100.spec, H100.constants, per_mb)
    tb = STEP(m, H100.spec, H100.constants, step)
    # one all-gather and one reduce-scatter per step instead of one of each per microbatch
    assert float(tb.dp_comm_total_s) == pytest.approx(float(ta.dp_comm_total_s) / 4, rel=1e-5)
    with pytest.raises(AisimError, match="fsdp_step_gather"):
        strategy_from_knobs(
            num_layers=4, num_heads=8, num_kv_heads=2, num_gpus=8, zero_stage=1,
            fsdp_step_gather=True,
        )  # fmt: skip
