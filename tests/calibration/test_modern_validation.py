"""Issue 15's accuracy on public measurements of modern runs (calibration/data/modern_runs.csv).

The bounds are the errors achieved when the shipped presets and stack profiles were fitted,
rounded up a little (docs/validation.md, "Modern runs"), so a change to the step model that
makes them worse fails here. The holdout file is not used: it is evaluated once, in the docs.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from calibration.modern import (
    MAIN_CSV,
    cp_ratios,
    evaluate_runs,
    fit_stack_profile,
    fp8_ratios,
    load_modern_runs,
    megatron_flops,
)
from calibration.profile import load_profile_constants, stack_profile_path
from perfmodel import load_hardware
from perfmodel.choices import Recompute, RecomputeModule
from perfmodel.memory import memory_per_device
from perfmodel.workload import model_from_dict
from simbase.errors import AisimError

MEGATRON = ("megatron-core", "nemo", "megatron-bridge")


# the models that had a preset (or whose table columns describe them) when the bounds were set;
# rows of presets added later are reported in docs/validation.md and get their own bounds then
MODELS_AT_FIT = {
    "custom",
    "llama2-7b",
    "llama3-8b",
    "llama3-70b",
    "gpt3-175b",
    "nemotron4-15b",
    "nemotron4-340b",
    "grok-1",
    # issue 15's MoE and 405B presets
    "llama3-405b",
    "deepseek-v3",
    "gpt-oss-120b",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
}


@pytest.fixture(scope="module")
def evaluated():
    runs, skipped = load_modern_runs(MAIN_CSV)
    runs = [r for r in runs if r.model.name in MODELS_AT_FIT]
    return runs, skipped, evaluate_runs(runs)


def _mae(df: pd.DataFrame) -> float:
    return float(df.error_pct.abs().mean())


def test_only_rows_without_a_model_preset_are_skipped():
    runs, skipped = load_modern_runs(MAIN_CSV)
    assert len(runs) + len(skipped) == len(pd.read_csv(MAIN_CSV))
    assert all(why.startswith("no model preset") for _, why in skipped)
    assert sum(r.model.name in MODELS_AT_FIT for r in runs) == 75  # every row


def test_megatron_flops_by_hand():
    # 12·B·s·L·h²·((1 + g/n + s/h) + ffn/h + V/(2·L·h)) for B=2, s=8, L=2, h=4, MHA, ffn 16, V 32
    m = model_from_dict(
        dict(num_layers=2, hidden_size=4, num_heads=2, ffn_hidden_size=16, seq_len=8, vocab_size=32)
    )
    hand = 12 * 2 * 8 * 2 * 16 * ((1 + 1 + 2) + 4 + 32 / 16)
    assert megatron_flops(m, 2) == pytest.approx(hand)


def test_weak_scaling_seconds_reproduce_the_published_mfu(evaluated):
    # S1 publishes TFLOP/s and MFU = TFLOP/s / 989: seconds from Megatron's formula, turned back
    # into TFLOP/s, give the MFU column (41% for the 1.7B row, 49% for 6144 GPUs)
    runs, _, _ = evaluated
    df = pd.read_csv(MAIN_CSV)
    for r in runs:
        if r.seconds_from.startswith("tflops") and r.framework == "megatron-core":
            row = df.iloc[r.row - 2]
            gbs, gpus = int(row.global_batch_size), int(row.num_gpus)
            tflops = megatron_flops(r.model, gbs) / (r.measured_step_s * gpus) / 1e12
            assert round(100 * tflops / 989) == pytest.approx(row.mfu_pct, abs=1)


def test_tokens_per_s_rows_match_their_derived_step_times(evaluated):
    runs, _, _ = evaluated
    df = pd.read_csv(MAIN_CSV)
    both = df.step_time_s.notna() & df.tokens_per_s_per_gpu.notna()
    for _, row in df[both].iterrows():
        secs = row.global_batch_size * row.seq_len / (row.tokens_per_s_per_gpu * row.num_gpus)
        assert secs == pytest.approx(row.step_time_s, rel=1e-3)


def test_dense_megatron_h100_uncalibrated_within_6_5_pct(evaluated):
    # issue 15's target is 10% mean absolute error; 5.7% was achieved
    _, _, df = evaluated
    sel = df[
        (df["stack"] == "megatron-core") & (df["hardware"] == "h100-sxm") & (df["group"] == "dense")
    ]
    assert len(sel) >= 30
    assert _mae(sel) < 6.5


def test_moe_megatron_uncalibrated_within_target(evaluated):
    # target 20%. The H100 rows fitted moe_layer_overhead_ms (9.0%); the B200 rows did not
    # (11.4%: reducing Megatron-Bridge's gradients in bf16, as its recipes do, took GPT-OSS-120B
    # on B200 from -19% to -29%, its gradient reduce-scatter being the exposed part)
    _, _, df = evaluated
    for hw, bound in (("h100-sxm", 10.0), ("b200", 12.0)):
        sel = df[(df["stack"] == "megatron-core") & (df["hardware"] == hw) & (df["group"] == "moe")]
        assert len(sel) >= 4
        assert _mae(sel) < bound, hw


@pytest.mark.slow
def test_moe_layer_overhead_default_is_its_fit_to_the_h100_moe_rows():
    """The shipped ``moe_layer_overhead_ms`` (3.4) is what calibration.fit gives with that one
    constant free on the six Megatron-family MoE rows on H100 (the constants docstring)."""
    from calibration.fit import fit
    from calibration.parameterization import parse_free
    from calibration.rows import RowConfig, build_batch

    runs, _ = load_modern_runs(MAIN_CSV)
    sel = [
        r
        for r in runs
        if r.stack == "megatron-core"
        and r.hardware.name == "h100-sxm"
        and float(r.model.spec.num_experts) > 0
    ]
    assert len(sel) == 6
    batch = build_batch(
        [RowConfig(model=r.model, hardware=r.hardware, knobs={}, where=r.label) for r in sel],
        [r.strategy for r in sel],
    )
    start = dataclasses.replace(sel[0].hardware.constants, moe_layer_overhead_s=np.float32(1e-3))
    res = fit(
        parse_free(["moe_layer_overhead_s"], start),
        batch,
        np.array([r.measured_step_s for r in sel]),
        seed=0,
        cross_validate=False,
    )
    shipped = float(sel[0].hardware.constants.moe_layer_overhead_s)
    assert res.values["moe_layer_overhead_s"] == pytest.approx(shipped, rel=0.05)


def test_b200_dense_uncalibrated_within_6_5_pct(evaluated):
    # 6.0% (4.6% before Megatron-Bridge's bf16 gradient reduction moved the two 405B rows, never
    # fitted, from -5%/-10% to -8%/-13%)
    _, _, df = evaluated
    sel = df[(df["hardware"] == "b200") & (df["group"] == "dense")]
    assert len(sel) >= 2
    assert _mae(sel) < 6.5


def test_peak_memory_where_published(evaluated):
    # issue 15's target: within 20% of the measured peak, met by all 18 torchtitan rows; the
    # two Llama 3 70B rows (TP 8, full AC, local batch 16) are the lightest (-18%, -13%)
    _, _, df = evaluated
    m = df[np.isfinite(df.measured_memory_gib)]
    assert len(m) == 18
    err = (100.0 * (m.memory_gib / m.measured_memory_gib - 1.0)).abs()
    assert float(err.mean()) < 11.0
    assert (err <= 20.0).all(), list(m.label[err > 20.0])


def test_loss_parallel_logits_by_hand():
    """torchtitan 9dec370 runs Llama 3 70B on TP 8 with PyTorch's ``loss_parallel`` and an
    uncompiled loss: at the loss's backward each rank holds the fp32 log-softmax output, the
    scattered gradient, ``grad_input + exp(x)`` and its product with ``grad_output``, 16 bytes
    for each of its s·b·V/t logits, over the 20 GiB of full-AC layer inputs (2·s·b·h/t bytes
    per layer: sequence parallel keeps them split)."""
    runs, _ = load_modern_runs(MAIN_CSV)
    r = next(x for x in runs if x.row == 61)
    s = r.strategy
    assert float(s.logit_bytes) == 16.0 and int(s.tp) == 8 and int(s.micro_batch_size) == 16
    seq, mb, vocab, h, layers = 8192, 16, 128256, 8192, 80
    logits = 16 * seq * mb * vocab / 8
    inputs = layers * 2 * seq * mb * h / 8
    acts = float(memory_per_device(r.model.spec, s).activations_bytes)
    assert acts == pytest.approx(logits + inputs, rel=1e-6)
    assert logits / 2**30 == pytest.approx(31.3, abs=0.05)
    # rows of another torchtitan (its loss compiled) or without TP keep the 12 bytes
    for x in runs:
        if x.framework == "torchtitan" and x.row not in (61, 62):
            assert float(x.strategy.logit_bytes) == 12.0, x.label


def test_loader_reads_each_recipes_memory_facts():
    """What the rows' recipes say (calibration.modern's docstring): NeMo's Apex distributed
    Adam keeps param remainders for bf16 weights, Megatron-Bridge reduces gradients in bf16,
    and the notes' ``recompute_modules [...]`` become the strategy's modules."""
    runs, _ = load_modern_runs(MAIN_CSV)
    by_row = {r.row: r for r in runs}
    s = by_row[21].strategy  # Nemotron-4 340B bf16 (distributed_fused_adam per its yaml)
    assert float(s.param_remainders) == 1 and float(s.grad_reduce_fp32) == 0
    assert float(by_row[22].strategy.param_remainders) == 0  # its FP8 twin: fp8 params
    assert float(by_row[25].strategy.param_remainders) == 0  # Grok-1: mcore_distributed_optim
    for r in runs:
        # torchtitan's FSDP2 keeps fp32 sharded parameters as the master weights; the
        # Megatron family keeps bf16 weights beside an fp32 master in the optimizer
        fsdp2 = r.framework == "torchtitan" and int(r.strategy.zero_stage) == 3
        assert float(r.strategy.fsdp_fp32_params) == float(fsdp2), r.label
        if r.framework == "megatron-bridge":
            assert float(r.strategy.grad_reduce_fp32) == 0, r.label
        if r.framework == "megatron-core" and not r.fp8:
            assert float(r.strategy.grad_reduce_fp32) == 1, r.label
    assert RecomputeModule.label_of(float(by_row[30].strategy.recompute_modules)) == (
        "mlp,mla_up_proj"
    )
    assert RecomputeModule.label_of(float(by_row[31].strategy.recompute_modules)) == (
        "layernorm,moe_act"
    )
    assert int(by_row[30].strategy.recompute) == Recompute.SELECTIVE


def test_fp8_speedups(evaluated):
    # target: within 10% of the measured ratio: all 14 pairs are (max 8.7%, torchtitan's Llama 3
    # 70B with async TP), with the sequence-parallel all-gathers in FP8 as Transformer Engine and
    # torchao run them (docs/validation.md)
    runs, _, df = evaluated
    r = fp8_ratios(runs, df.predicted_s.to_numpy())
    assert len(r) >= 14
    assert (r.error_pct.abs() < 10.0).all()
    assert float(r.error_pct.abs().mean()) < 4.5


def test_context_parallel_ratios_within_target(evaluated):
    # target 15%: NeMo's Llama 2 7B 4K-1M series is within 4%; torchtitan's two series (its
    # Tables 2 and 6: FlashAttention-2 and PyTorch's ring attention, whose fp32 merges and
    # K/V all-gather the step model prices) within 15%, the widest Llama 3 8B's 256K point
    runs, _, df = evaluated
    r = cp_ratios(runs, df.predicted_s.to_numpy())
    nemo = r[r.series.str.contains("nemo")]
    assert len(nemo) == 8
    assert (nemo.error_pct.abs() < 5.0).all()
    titan = r[r.series.str.contains("torchtitan")]
    assert len(titan) == 6
    assert (titan.error_pct.abs() < 15.0).all()


def test_context_parallel_series_is_one_published_table(evaluated):
    # torchtitan's Llama 3.1 405B 8K runs (Table 5: local batch 32, a pipeline-schedule study)
    # move the same 2M tokens per step as its CP study (Table 6: local batch 8, 32K-256K), but
    # they are another experiment: the series starts at Table 6's own 32K run
    runs, _, df = evaluated
    r = cp_ratios(runs, df.predicted_s.to_numpy())
    big = r[r.series.str.startswith("llama3-405b")]
    assert sorted(big.seq_len) == [65536, 131072, 262144]
    base = next(
        x
        for x in runs
        if x.model.name == "llama3-405b"
        and x.table.endswith("Table 6")
        and float(x.model.spec.seq_len) == 32768
    )
    longest = next(
        x for x in runs if x.table == base.table and float(x.model.spec.seq_len) == 262144
    )
    # the published TPS/GPU: 76 at 32K, 16 at 256K (the step times are derived from them)
    assert float(big[big.seq_len == 262144].measured_ratio.iloc[0]) == pytest.approx(
        base.measured_step_s / longest.measured_step_s
    )
    assert float(big[big.seq_len == 262144].measured_ratio.iloc[0]) == pytest.approx(16 / 76)


def test_no_measured_run_is_predicted_infeasible(evaluated):
    # issue 15's target. What made the last 9 fit, each a fact of the run's software or
    # hardware (docs/validation.md): Apex's param remainders (Nemotron-4 340B), the B200's 179
    # GiB, Megatron-Bridge's bf16 gradients and its recipes' recompute modules (DeepSeek-V3,
    # GPT-OSS), torchtitan's per-op selective checkpointing (Llama 3 8B on 8 GPUs)
    _, _, df = evaluated
    assert df.feasible.all(), list(df.label[~df.feasible])
    # no strategy that ran is called invalid (DeepSeek-V3's 61 layers on pp 8 x 2 chunks
    # included: Megatron-Bridge places them with a custom pipeline layout)
    assert df.valid.all()


@pytest.mark.parametrize(
    ("name", "bound"), [("megatron-core-h100", 8.0), ("pytorch-fsdp-h100", 8.0)]
)
def test_shipped_stack_profiles_loo_error(name, bound):
    path = stack_profile_path(name)
    doc = json.loads(path.read_text())
    assert doc["fit"]["cv_method"] == "leave-one-out"
    loo = np.array([r["held_out_error_pct"] for r in doc["fitted_to"]])
    assert len(loo) == doc["rows"] >= 20
    assert float(np.mean(np.abs(loo))) == pytest.approx(doc["fit"]["cv_mape_pct"], rel=1e-6)
    assert doc["fit"]["cv_mape_pct"] < bound
    hw = load_hardware(doc["hardware"])
    c = load_profile_constants(name, hw.name, hw.constants)  # --profile NAME resolves
    assert 0.5 < float(c.matmul_efficiency_max) < 0.9


def test_unknown_profile_name_lists_the_shipped_stacks():
    with pytest.raises(AisimError, match="megatron-core-h100"):
        stack_profile_path("no-such-stack")


@pytest.mark.slow
def test_megatron_core_profile_refits_to_its_shipped_loo():
    runs, _ = load_modern_runs(MAIN_CSV)
    shipped = json.loads(stack_profile_path("megatron-core-h100").read_text())
    doc = fit_stack_profile(
        runs, shipped["fitted"], stack="megatron-core", hardware="h100-sxm", seed=0
    )
    assert doc["fit"]["cv_mape_pct"] < 8.0  # issue 15: within 8% on held-out rows
    assert doc["rows"] == shipped["rows"]
