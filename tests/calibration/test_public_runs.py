"""The model's accuracy on published measurements of training runs
(calibration/data/published_runs.csv), each described by its stack name and the facts its source
prints, predicted with the constants the stack ships for its hardware (calibration/stacks.py).

The accuracy bounds are what the shipped constants record (``error_pct`` in each stack file's
``constants`` block): the model evaluated now must give what the fit recorded, so a change to
the step model that is not refitted fails here. The holdout file is evaluated once, in the docs.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from calibration.measurements import load_measurements
from calibration.public_runs import (
    HOLDOUT_CSV,
    MAIN_CSV,
    cp_ratios,
    evaluate_runs,
    fp8_ratios,
    load_published_runs,
    megatron_flops,
)
from calibration.rows import resolve_rows, row_strategy
from perfmodel import load_stack
from perfmodel.specs.choices import Recompute, RecomputeModule
from perfmodel.specs.model import model_from_dict
from perfmodel.specs.strategy import leaves_of, strategy_to_dict
from simbase.errors import AisimError

pytestmark = pytest.mark.slow  # one compiled program per stack behaviour, model and hardware


@pytest.fixture(scope="module")
def evaluated():
    runs, skipped = load_published_runs(MAIN_CSV)
    return runs, skipped, evaluate_runs(runs)


def _mae(df: pd.DataFrame) -> float:
    return float(df.error_pct.abs().mean())


def test_every_row_loads_and_a_row_whose_layout_does_not_multiply_out_is_skipped(
    evaluated, tmp_path
):
    # every published row is a run the loader can describe; a row whose printed layout does not
    # multiply out to its GPUs (BLOOM's misprinted '48 node contenders' row, left out of the file:
    # DP 8 x TP 8 x PP 10 = 640 for 40 nodes of 8) is skipped with why, not guessed at
    runs, skipped, _ = evaluated
    assert not skipped and len(runs) == len(pd.read_csv(MAIN_CSV))
    df = pd.read_csv(MAIN_CSV)
    bloom = df[df.source_id == "bigscience-bloom-2022"].head(2).copy()
    bloom.iloc[0, bloom.columns.get_loc("num_gpus")] = 320
    bloom.to_csv(tmp_path / "two.csv", index=False)
    ok, bad = load_published_runs(tmp_path / "two.csv")
    assert len(ok) == 1 and len(bad) == 1
    assert "expected" in bad[0][1] and "tp" in bad[0][1]


def test_megatron_flops_by_hand():
    # 12·B·s·L·h²·((1 + g/n + s/h) + ffn/h + V/(2·L·h)) for B=2, s=8, L=2, h=4, MHA, ffn 16, V 32
    m = model_from_dict(
        dict(num_layers=2, hidden_size=4, num_heads=2, ffn_hidden_size=16, seq_len=8, vocab_size=32)
    )
    hand = 12 * 2 * 8 * 2 * 16 * ((1 + 1 + 2) + 4 + 32 / 16)
    assert megatron_flops(m, 2) == pytest.approx(hand)


def test_weak_scaling_seconds_reproduce_the_published_mfu(evaluated):
    # Megatron-LM's table publishes TFLOP/s and MFU = TFLOP/s / 989: seconds from Megatron's
    # formula, turned back into TFLOP/s, give the MFU column
    runs, _, _ = evaluated
    df = pd.read_csv(MAIN_CSV)
    n = 0
    for r in runs:
        if r.seconds_from.startswith("tflops") and r.framework == "megatron-core":
            row = df.iloc[r.row - 2]
            gbs, gpus = int(row.global_batch_size), int(row.num_gpus)
            tflops = megatron_flops(r.model, gbs) / (r.measured_step_s * gpus) / 1e12
            assert round(100 * tflops / 989) == pytest.approx(row.mfu_pct, abs=1)
            n += 1
    assert n == 9


def test_tokens_per_s_rows_match_their_derived_step_times():
    df = pd.read_csv(MAIN_CSV)
    both = df.step_time_s.notna() & df.tokens_per_s_per_gpu.notna()
    assert both.sum() > 100
    for _, row in df[both].iterrows():
        secs = row.global_batch_size * row.seq_len / (row.tokens_per_s_per_gpu * row.num_gpus)
        # tables print tokens/s per GPU as integers (llm-foundry truncates): up to one unit
        rel = max(2e-3, 1.0 / row.tokens_per_s_per_gpu)
        assert secs == pytest.approx(row.step_time_s, rel=rel), row.model


def test_each_run_is_its_printed_facts(evaluated):
    """The strategy keeps every number the source prints (layout, batch, dtype) and names the
    row's stack; nothing else comes from the row."""
    runs, _, _ = evaluated
    df = pd.read_csv(MAIN_CSV)
    for r in runs:
        row = df.iloc[r.row - 2]
        d = strategy_to_dict(r.strategy)
        assert r.strategy.stack.name == row.stack
        for k in ("tp", "pp", "cp", "ep", "micro_batch_size"):
            if pd.notna(row[k]):
                assert d[k] == int(row[k]), (r.label, k)
        if pd.notna(row.global_batch_size):
            gbs = d["dp"] * d["micro_batch_size"] * d["num_microbatches"]
            assert gbs == int(row.global_batch_size), r.label
        if pd.notna(row.dtype) and row.dtype in ("bf16", "fp8", "fp16"):
            assert d["dtype"] == row.dtype, r.label


def test_the_stacks_fill_what_the_sources_do_not_print(evaluated):
    """What each stack does by default, read from the preset and not from the row: NeMo 2's
    recipes keep fp32 master weights unless the recipe prints Apex's distributed Adam (Nemotron-4
    340B, line 21), Megatron-Bridge reduces gradients in bf16, torchtitan's FSDP2 keeps its fp32
    sharded parameters as the master weights, and recomputation is the least that fits."""
    runs, _, _ = evaluated
    by_row = {r.row: r for r in runs}
    assert by_row[21].strategy.stack.param_remainders is True
    assert by_row[22].strategy.stack.param_remainders is False
    bridge = load_stack("megatron-core@bridge")
    for r in runs:
        # PyTorch FSDP's mixed precision (FSDP2 in torchtitan, FSDP1 under Composer) shards the
        # fp32 parameters themselves; Megatron-FSDP and DeepSpeed keep a 16-bit shard
        pytorch = r.stack.startswith(("torchtitan", "pytorch-fsdp"))
        fsdp = pytorch and int(r.strategy.memory.zero_stage) == 3
        assert r.strategy.stack.fsdp_fp32_params is fsdp, r.label
        if r.stack == "megatron-core@bridge":
            assert strategy_to_dict(r.strategy)["grad_reduce_fp32"] is False, r.label
            assert r.strategy.stack.fp8_recipe == bridge.base.fp8_recipe or r.fp8
        if r.stack.startswith("megatron-core@nemo") and r.row != 21:
            assert r.strategy.stack.param_remainders is False, r.label
    assert RecomputeModule.label_of(by_row[30].strategy.stack.recompute_modules) == (
        "mlp,mla_up_proj"
    )
    assert int(by_row[30].strategy.memory.recompute) == Recompute.SELECTIVE
    # a run whose source leaves recomputation out gets the least that fits, and says so
    auto = [r for r in runs if "recompute" in r.auto]
    assert len(auto) > 20
    assert {r.auto["recompute"] for r in auto} >= {"none", "full"}


def test_no_measured_run_is_predicted_infeasible(evaluated):
    # issue 30's target: with auto recomputation and the stacks' defaults, every run that ran fits
    # met for 453 of 454: BLOOM's TP 8 / PP 2 topology-search run (36 layers and the embedding
    # on a stage) is predicted at 81.8 GiB with the preset's reserve, where nvidia-smi read 76 GB
    _, _, df = evaluated
    assert df.valid.all()
    assert list(df.label[~df.feasible]) == [
        "gpt-h14336-L72 a100-80gb x384 tp/pp/cp/ep=8/2/1/1 s2K dtype? megatron-deepspeed"
    ]


def test_peak_memory_where_published(evaluated):
    # issue 30's target, within 20% of the measured peak where the source prints one: 17 of
    # torchtitan's 18 (the caching allocator's reserved peak, which holds its fragmentation
    # too); the 18th, Llama 3 405B at 256K tokens, is 21.7% low. BLOOM's 66 nvidia-smi readings,
    # which hold the allocator's free blocks too, are 15% above the model on average and 44 of
    # them within 20% (docs/validation.md)
    _, _, df = evaluated
    m = df[np.isfinite(df.measured_memory_gib)]
    err = 100.0 * (m.memory_gib / m.measured_memory_gib - 1.0)
    titan = err[m["stack"].str.startswith("torchtitan")]
    assert len(titan) == 18 and int((titan.abs() <= 20.0).sum()) == 17
    assert float(titan.abs().max()) < 22.0
    bloom = err[m["stack"].str.startswith("deepspeed")]
    assert len(bloom) == 66
    assert -16.0 < float(bloom.mean()) < 0.0 and float(bloom.abs().mean()) < 18.0
    assert int((bloom.abs() <= 20.0).sum()) >= 44


def test_shipped_constants_give_the_errors_they_record(evaluated):
    """Each stack file records the in-sample error of its constants per hardware (a version's
    own where it has them); the step model evaluated now with those constants gives the same (to
    0.05 points), so a physics change that was not refitted (``python -m calibration.stacks
    --write``) fails here."""
    runs, _, df = evaluated
    unit = []
    for r in runs:
        own = load_stack(r.stack).document.get("variants", {})
        version = r.stack.partition("@")[2]
        has = version and r.hardware.name in (own.get(version, {}).get("constants") or {})
        unit.append((r.stack if has else r.stack.partition("@")[0], r.hardware.name))
    df = df.assign(unit=unit)
    checked = 0
    for (name, hw), rows in df.groupby("unit"):
        entry = load_stack(name).constants.get(hw)
        if not isinstance(entry, dict) or entry.get("status") != "fitted":
            continue
        assert _mae(rows) == pytest.approx(entry["error_pct"]["fitted"], abs=0.05), (name, hw)
        checked += 1
    assert checked >= 10


def test_accuracy_per_stack_with_shipped_constants(evaluated):
    # issue 30: every run predicted from its stack name and printed facts alone; the bounds are
    # the errors reached (docs/validation.md), rounded up
    _, _, df = evaluated
    base = df["stack"].str.partition("@")[0]
    bounds = {"megatron-core": 11.5, "torchtitan": 7.5, "deepspeed": 6.0, "pytorch-fsdp": 7.0}
    for st, bound in bounds.items():
        assert _mae(df[base == st]) < bound, st
    dense_h100 = df[(base == "megatron-core") & (df.hardware == "h100-sxm") & (df.group == "dense")]
    assert len(dense_h100) >= 40
    assert _mae(dense_h100) < 5.0


def test_fp8_speedups(evaluated):
    # target: within 10% of the measured ratio. 32 of the 33 BF16/FP8 pairs are (mean 4.4%); the
    # one that is not is llm-foundry's MPT-1B at 512 tokens (measured 1.35, predicted 1.16: a
    # model this small at this length is launch-bound in the model, less so on the H100)
    runs, _, df = evaluated
    r = fp8_ratios(runs, df.predicted_s.to_numpy())
    assert len(r) >= 33
    miss = r[r.error_pct.abs() >= 10.0]
    assert list(miss.pair) == [p for p in r.pair if p.startswith("mpt-1b") and " s512 " in p]
    assert float(miss.error_pct.abs().max()) < 15.0
    assert float(r.error_pct.abs().mean()) < 5.0


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
    # the 405B within 7%; Llama 3 8B's steps do not follow one trend (throughput falls 1.53x,
    # 2.37x, 1.95x per doubling), so the model sits between them: 18% at 256K misses the 15% target
    assert (titan[titan.series.str.contains("405b")].error_pct.abs() < 10.0).all()
    assert (titan.error_pct.abs() < 20.0).all()


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


def test_an_independent_deepspeed_source_from_its_printed_facts():
    """Megatron-Turing NLG 530B on 2240-3360 A100 (Smith et al. 2022, section 2.4; in the holdout
    file, never fitted to): described by its stack name and what the paper prints (model, GPUs,
    tp 8, pp 35, batch 1920), every other choice the stack's recipe default (micro-batch 2, ZeRO-1,
    full recomputation), its iteration times are predicted within 10% with the constants fitted
    on BLOOM's cluster alone."""
    runs, skipped = load_published_runs(HOLDOUT_CSV)
    mtnlg = [r for r in runs if r.source_id == "mtnlg-2022"]
    assert len(mtnlg) == 3 and not skipped
    assert {int(r.strategy.batching.micro_batch_size) for r in mtnlg} == {2}
    df = evaluate_runs(mtnlg)
    assert df.feasible.all()
    assert (df.error_pct.abs() < 10.0).all(), df[["label", "error_pct"]]


def test_shipped_public_runs_map_like_their_loader(evaluated):
    """The research table read through the general measurement schema gives each row the
    parallel layout and dtype that calibration.public_runs reads for it."""
    df = load_measurements(MAIN_CSV, purpose="any", skip_bad_rows=True)
    runs = evaluated[0]  # the runs this module reads (load_published_runs reads a file once)
    by_label = {}
    for r in runs:
        v = leaves_of(r.strategy)
        by_label.setdefault((r.model.name, r.hardware.name.split("@")[0]), []).append(
            tuple(int(float(v[k])) for k in ("tp", "pp", "cp", "ep", "dtype"))
        )
    checked = 0
    for rc in resolve_rows(df[df["model"] != "custom"]):
        try:
            s = row_strategy(rc)
        except AisimError:
            continue
        key = (rc.model.name, rc.hardware.name)
        if key not in by_label:
            continue
        v = leaves_of(s)
        got = tuple(int(float(v[k])) for k in ("tp", "pp", "cp", "ep", "dtype"))
        assert got in by_label[key], (rc.where, got)
        checked += 1
    assert checked >= 20
    assert np.nanmax(df["cp"].astype(float)) > 1 and np.nanmax(df["ep"].astype(float)) > 1


def _megatron_mla_flops_per_token(spec, seq: float) -> float:
    """Megatron-LM's ``num_floating_point_operations`` per token for a DeepSeek-V3-style model
    (MLA with q/kv LoRA, dense then MoE layers, shared experts, SwiGLU, no MTP), by hand from its
    MLA branch at 4c2e1c9b30 (megatron/training/training.py): 12·h·(MLP widths) + 6·L·(the
    attention GEMMs' weights + the causal half of the core attention) + 6·h·V."""
    h, n, L = spec.hidden_size, spec.num_heads, spec.num_layers
    qk, rope, v = spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim
    dense, moe = spec.dense_layers, L - spec.dense_layers
    mlp = (
        12
        * h
        * 1.5
        * (
            spec.ffn_hidden_size * dense
            + spec.moe_ffn_hidden_size * (spec.experts_per_token + spec.shared_experts) * moe
        )
    )
    attn = (
        6
        * L
        * (
            spec.q_lora_rank * (h + n * (qk + rope) + 1)
            + spec.kv_lora_rank * (h + n * (qk + v) + 1)
            + h * rope
            + n * v * h
            + seq * n * (qk + rope) / 2
            + seq * n * v / 2
        )
    )
    return mlp + attn + 6 * h * spec.vocab_size


def test_deepseek_v3_on_gb200_before_and_after_the_stack_was_tuned():
    """Megatron-LM's GB200 guide (holdout, never fitted to): DeepSeek-V3 MXFP8 on 256 GB200, one
    layout, 494 TFLOPS/GPU before Megatron-Core's kernel, dispatcher and CUDA-graph work and 970
    after. The step times follow from the printed TFLOPS by Megatron's own FLOP count; the model,
    given the stack name and the printed facts, predicts the tuned row within 20% and cannot tell
    the two apart (what changed is not a fact a planner gives)."""
    runs, _ = load_published_runs(HOLDOUT_CSV)
    pair = [r for r in runs if r.source_id == "megatron-lm-dsv3-gb200"]
    assert len(pair) == 2
    spec = pair[0].model.spec
    per_token = float(_megatron_mla_flops_per_token(spec, 4096.0))
    assert per_token == pytest.approx(249.812e9, rel=1e-5)
    for r, tflops in zip(pair, (494.46, 970.01), strict=True):
        secs = 2048 * 4096 * per_token / (tflops * 1e12 * 256)
        assert r.measured_step_s == pytest.approx(secs, abs=5e-5)  # as the CSV rounds it
    df = evaluate_runs(pair)
    base, tuned = df.predicted_s
    assert abs(tuned / pair[1].measured_step_s - 1.0) < 0.20, df[["label", "error_pct"]]
    assert abs(base / tuned - 1.0) < 0.05  # measured: 1.96x apart
    # it fits with the recomputation its source prints: the first GPU holds 7 layers (3 dense)
    # under the uneven split, the others 8 with fewer microbatches in flight
    assert df.feasible.all(), df[["label", "memory_gib"]]
    assert pair[0].measured_step_s / pair[1].measured_step_s == pytest.approx(970.01 / 494.46, 1e-4)
