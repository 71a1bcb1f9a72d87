"""Public measurements of modern runs (``calibration/data/modern_runs*.csv``) as model inputs.

Contract: :func:`load_modern_runs` reads the research tables of 2024-2026 runs (Megatron-Core,
NeMo, Megatron-Bridge, torchtitan; H100 and B200; dense, MoE, long context, FP8) into one
:class:`ModernRun` per row: the :class:`~perfmodel.workload.Model`, the
:class:`~perfmodel.strategy.Strategy` the framework ran, the hardware preset, the measured
seconds per step and peak memory, and the software stack. A row whose model has no preset (and
whose dimensions the table cannot describe alone) is returned in ``skipped`` with the reason.
:func:`evaluate_runs` predicts every row with the constants given (the preset's when none), and
:func:`stack_profile_path` finds a shipped stack profile (``perfmodel/profiles/stacks``) by name.

Measured seconds per step (``measured_step_s``), by what the row publishes:

- ``step_time_s``: as published, or derived by the research note from tokens/s
  (``global_batch · seq_len / (tokens_per_s_per_gpu · num_gpus)``, see its ``derivation``);
- ``tokens_per_s_per_gpu`` only: the same formula here;
- ``tflops_per_gpu`` only: seconds = model FLOPs per step / (TFLOP/s · GPUs), with the FLOPs of
  the row's own convention (:data:`FLOP_CONVENTIONS`). The two documents that publish only
  TFLOP/s (Megatron-LM's weak-scaling table and NeMo 24.03's long-sequence table) both use
  Megatron's ``num_floating_point_operations`` (:func:`megatron_flops`): forward + backward,
  attention scores over the full (non-causal) s², recomputation not counted.

Strategy assumptions where a row is blank (each a documented default of the framework):

- micro-batch 1 for Megatron-Core/NeMo/Megatron-Bridge (their perf configs; Megatron-LM's
  weak-scaling runs use 1); torchtitan without pipelining runs the whole local batch as one
  micro-batch (no gradient accumulation), and with pipelining splits it into pp microbatches
  (its default ``pipeline_parallel_microbatches``: the pipeline degree);
- ``zero_stage`` blank: 1 for the Megatron family (the distributed optimizer of every NVIDIA
  perf recipe), as published otherwise (torchtitan: 3);
- ``recompute`` blank: none; torchtitan "selective" is per-op SAC (``selective`` with the
  ``per_op`` recompute module: every other matmul's output kept);
- ``sequence_parallel`` whenever tp > 1 (Megatron-Core/NeMo require it with TP comm overlap;
  torchtitan's TP plan shards norms as sequence parallel); ``fused_attention`` always
  (TE/cuDNN/FlashAttention in every stack); ``dp_overlap`` always;
- ``tp_overlap``: on for the Megatron family on H100/B200 (NeMo's yaml ``tp_comm_overlap``,
  Megatron-LM's README, Megatron-Bridge's H100 recipes) and for torchtitan rows whose notes say
  "Async TP"/"AsyncTP";
- gradients reduced in bf16 for NeMo launcher and Megatron-Bridge rows (their recipes'
  ``grad_sync_dtype: bf16`` and ``grad_reduce_in_fp32 = False``), in fp32 otherwise
  (Megatron-Core's default); rows whose notes name Apex ``distributed_fused_adam`` keep the
  master weights of bf16 runs as 16-bit remainders (``param_remainders``); rows whose notes
  quote a recipe's ``recompute_modules [...]`` recompute those submodules
  (``recompute_modules``, with ``recompute`` selective);
- MoE: the EP all-to-all overlaps compute for Megatron-Bridge rows and rows whose notes say
  "1f1b overlap"; tokens are dispatched with DeepEP (``flex``) for DeepSeek-V3 and rows whose
  notes name DeepEP, with the plain all-to-all otherwise;
- torchtitan: its loss holds 12 bytes per logit (an unfused fp32 cross-entropy:
  ``logit_bytes``), or the row's ``logit_bytes`` column where set (16: PyTorch's
  ``loss_parallel`` decomposition under TP, uncompiled, as torchtitan 9dec370 runs it), and
  with pipelining FSDP keeps each stage's parameters gathered and its gradients unreduced
  across the microbatches (``fsdp_reshard`` off, ``fsdp_step_gather``); its FSDP2 keeps the
  sharded parameters in fp32 as the master weights, with no sharded bf16 copy
  (``fsdp_fp32_params``);
- ``eager`` blank: the elementwise ops are fused (Megatron's fused kernels, torchtitan's
  ``torch.compile``); 1 for torchtitan rows run without ``torch.compile`` (PyTorch eager mode's
  separate kernels, :mod:`perfmodel.eager`);
- attention kernel: FlashAttention-2 (``fa2``) for torchtitan (PyTorch SDPA's flash backend),
  cuDNN's fused attention for the Megatron family (Transformer Engine's choice on Hopper);
- torchtitan "Interleaved 1F1B" with unpublished virtual stages: 2 chunks per rank (its default
  for the interleaved schedule when the stage count is not set).
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from perfmodel.constants import Constants
from perfmodel.hardware import Hardware, load_hardware
from perfmodel.step_time import step_time
from perfmodel.strategy import Strategy, make_strategy
from perfmodel.workload import Model, load_model, model_from_dict, model_names, with_overrides

DATA_DIR = Path(__file__).parent / "data"
MAIN_CSV = DATA_DIR / "modern_runs.csv"
HOLDOUT_CSV = DATA_DIR / "modern_runs_holdout.csv"

# framework column -> the stack profile that covers it
STACKS = {
    "megatron-core": "megatron-core",
    "nemo": "megatron-core",
    "megatron-bridge": "megatron-core",
    "torchtitan": "pytorch-fsdp",
}
_MEGATRON = ("megatron-core", "nemo", "megatron-bridge")

# flop_convention prefixes -> how seconds per step follow from TFLOP/s (only rows that publish
# neither a step time nor tokens/s need one)
FLOP_CONVENTIONS = {
    "Megatron-LM num_floating_point_operations": "megatron",
    # NeMo 24.03's logged TFLOPS come from the same Megatron formula (NeMo's llama2 model FLOPs:
    # 12·(1 + g/n + s/h) + 18·ffn/h + 6·V/(L·h), per B·s·L·h², the full s² attention term)
    "NeMo 'TFLOPS / GPU' (model FLOPs of the NeMo 24.03 container)": "megatron",
}

# models without a preset whose table columns describe them whole (no MLA, no sliding window):
# the flags the columns cannot carry, from the configs the research note cites
_TABLE_MODELS = {
    # Nemotron-4 (Parmar et al. 2024, arXiv:2402.16819): squared-ReLU MLP (not gated), no bias,
    # untied embeddings, RoPE, no dropout
    "nemotron4-15b": dict(gated_mlp=False),
    "nemotron4-340b": dict(gated_mlp=False),
    # Grok-1 (dgxc grok1_314b.yaml): GeGLU experts (gated), 8 experts top-2, RoPE, no dropout
    "grok-1": dict(gated_mlp=True),
}
_DIMS = (
    "num_layers",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "ffn_hidden_size",
    "vocab_size",
    "num_experts",
    "experts_per_token",
    "moe_ffn_hidden_size",
    "shared_experts",
    "dense_layers",
)


@dataclasses.dataclass(frozen=True)
class ModernRun:
    """One measured run, ready to predict.

    Attributes:
      label: ``model hw gpus tp/pp/cp/ep dtype framework`` for tables.
      row: line of the CSV (header = 1) and ``file``: the CSV's name.
      model, hardware, strategy: what the run ran.
      measured_step_s: measured seconds per step.
      measured_memory_gib: peak memory per GPU as published (NaN when not).
      framework: the CSV's framework; ``stack``: its stack profile name.
      fp8: the dtype is fp8; ``fp8_pair``: key shared by a BF16 run and its FP8 twin.
      group: ``dense`` or ``moe``.
      seconds_from: ``step_time_s``, ``tokens_per_s_per_gpu`` or the FLOP convention used.
      table: the published table the value was read from (its document and the table's name in
        ``source_of_value``), so that ratios are taken within one experiment.
    """

    label: str
    file: str
    row: int
    model: Model
    hardware: Hardware
    strategy: Strategy
    measured_step_s: float
    measured_memory_gib: float
    framework: str
    stack: str
    fp8: bool
    fp8_pair: str
    group: str
    seconds_from: str
    notes: str
    table: str = ""


def _cell(row: pd.Series, col: str) -> Any:
    v = row.get(col)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, str) and not v.strip():
        return None
    if isinstance(v, np.integer | np.floating):
        return v.item()
    return v


def _int(row: pd.Series, col: str, default: int) -> int:
    v = _cell(row, col)
    return default if v is None else int(v)


def _float(row: pd.Series, col: str) -> float | None:
    v = _cell(row, col)
    return None if v is None else float(v)


def megatron_flops(m: Model, global_batch: int) -> float:
    """Model FLOPs per step by Megatron-LM's ``num_floating_point_operations`` (training.py).

    ``12·B·s·L·h²·((1 + g/n + s/h)·q/h + ffn/h·k·(3/2 if gated) + V/(2·L·h))``: forward and
    backward of the weight GEMMs, the attention scores over the full s² (no causal halving) and
    the logits; recomputation is not counted. ``q/h`` = 1 (heads · head size = hidden).
    """
    s = m.spec
    b, seq, layers, h = global_batch, float(s.seq_len), float(s.num_layers), float(s.hidden_size)
    g_over_n = float(s.num_kv_heads) / float(s.num_heads)
    k = float(s.experts_per_token) if float(s.num_experts) else 1.0
    ffn = float(s.moe_ffn_hidden_size) if float(s.num_experts) else float(s.ffn_hidden_size)
    gated = 1.5 if float(s.gated_mlp) else 1.0
    attn = 1.0 + g_over_n + seq / h
    mlp = ffn / h * k * gated
    logit = float(s.vocab_size) / (2.0 * layers * h)
    return 12.0 * b * seq * layers * h * h * (attn + mlp + logit)


def _model(row: pd.Series, cache: dict[str, Model]) -> tuple[Model | None, str]:
    """The row's model (its preset with the row's dimensions), or None and why."""
    name = str(_cell(row, "model"))
    dims = {k: _cell(row, k) for k in _DIMS}
    seq = _cell(row, "seq_len")
    if name == "custom" or name in _TABLE_MODELS:
        # Megatron-LM's weak-scaling GPTs (MHA, 4h GeLU MLP: Megatron's defaults) and the
        # presetless table models: the CSV's columns, untied embeddings, RoPE, no bias
        doc = {k: v for k, v in dims.items() if v is not None}
        doc.update(_TABLE_MODELS.get(name, {}))
        doc.update(
            kind="transformer",
            name=name,
            seq_len=seq,
            tied_embeddings=False,
            learned_pos_emb=False,
            bias=False,
            dropout=name == "custom",  # Megatron's GPT default dropout 0.1
        )
        return model_from_dict(doc, f"{name} (table columns)"), ""
    if name not in model_names():
        return None, f"no model preset {name!r} (perfmodel/profiles/models)"
    if name not in cache:
        cache[name] = load_model(name)
    m = cache[name]
    # the benchmark's own configuration where it differs from the released model (dgxc 405B:
    # 16 query groups, GPT-2 vocabulary)
    over = {"seq_len": seq}
    for k in ("num_kv_heads", "vocab_size"):
        if dims[k] is not None and float(dims[k]) != float(getattr(m.spec, k)):
            over[k] = dims[k]
    return with_overrides(m, **over), ""


def _measured_seconds(row: pd.Series, m: Model) -> tuple[float | None, str]:
    gbs, gpus = int(_cell(row, "global_batch_size")), int(_cell(row, "num_gpus"))
    seq = int(_cell(row, "seq_len"))
    t = _cell(row, "step_time_s")
    if t is not None:
        return float(t), "step_time_s"
    tps = _cell(row, "tokens_per_s_per_gpu")
    if tps is not None:
        return gbs * seq / (float(tps) * gpus), "tokens_per_s_per_gpu"
    tf = _cell(row, "tflops_per_gpu")
    conv = str(_cell(row, "flop_convention") or "")
    kind = next((v for k, v in FLOP_CONVENTIONS.items() if conv.startswith(k)), None)
    if tf is None or kind is None:
        return None, f"no step time, tokens/s or TFLOP/s of a known convention ({conv[:40]!r})"
    return megatron_flops(m, gbs) / (float(tf) * 1e12 * gpus), "tflops_per_gpu (megatron formula)"


def _strategy(row: pd.Series, hw: Hardware) -> Strategy:
    fw = str(_cell(row, "framework"))
    megatron = fw in _MEGATRON
    notes = str(_cell(row, "notes") or "")
    dp, tp, pp, cp = (_int(row, k, 1) for k in ("dp", "tp", "pp", "cp"))
    gbs = int(_cell(row, "global_batch_size"))
    local = gbs // dp
    mbs = _cell(row, "micro_batch_size")
    if mbs is None:
        # torchtitan splits the local batch into as many microbatches as pipeline stages
        # unless told otherwise (pipelining_utils: pipeline_parallel_microbatches or pp)
        mbs = 1 if megatron else max(local // pp, 1)
    mbs = int(mbs)
    interleave = _int(row, "interleave", 1)
    if not megatron and "Interleaved 1F1B" in notes and interleave == 1:
        interleave = 2
    zero = _int(row, "zero_stage", 1 if megatron else 0)
    shard = _int(row, "shard_size", 0)
    if shard and zero < 3:
        zero = 3  # an FSDP group is ZeRO-3 (Megatron-FSDP in the 25.11 archive)
    if zero == 3 and (shard >= dp * cp or (not megatron and shard == dp)):
        # the whole dp·cp group (torchtitan's FSDP mesh is dp_shard x cp: its published
        # "FSDP degree" is dp, the parameters are sharded over dp·cp)
        shard = 0
    dtype = str(_cell(row, "dtype") or "bf16")
    recompute = str(_cell(row, "recompute") or "none")
    tp_overlap = megatron or "async tp" in notes.lower() or "asynctp" in notes.lower()
    return make_strategy(
        dp=dp,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=_int(row, "ep", 1),
        etp=_int(row, "etp", 1),
        micro_batch_size=mbs,
        num_microbatches=max(local // mbs, 1),
        interleave=interleave,
        schedule="interleaved" if interleave > 1 else "1f1b",
        zero_stage=zero,
        shard_size=shard,
        recompute=recompute,
        recompute_layers=_int(row, "recompute_layers", 0),
        sequence_parallel=tp > 1,
        dtype=dtype,
        dp_overlap=True,
        fused_attention=True,
        gpus_per_node=int(hw.spec.gpus_per_node),
        tp_overlap=bool(tp_overlap and tp > 1),
        # Megatron-Bridge's MoE performance recipes overlap the EP all-to-all with the other
        # microbatch's compute (``overlap_moe_expert_parallel_comm``, 1F1B A2A overlap), as do
        # rows whose notes say "1f1b overlap"
        moe_overlap=(fw == "megatron-bridge" or "1f1b overlap" in notes.lower())
        and _int(row, "ep", 1) > 1,
        # DeepSeek-V3 recipes dispatch with DeepEP (``moe_token_dispatcher_type: flex``), as do
        # rows whose notes name DeepEP
        moe_dispatch="flex"
        if str(_cell(row, "model")) == "deepseek-v3" or "deepep" in notes.lower()
        else "alltoall",
        # the NeMo launcher's Apex distributed_fused_adam reduces gradients in bf16
        # (``grad_sync_dtype: bf16``), and every Megatron-Bridge performance recipe sets
        # ``grad_reduce_in_fp32 = False`` (scripts/performance/configs/*/*_llm_pretrain.py,
        # 25.11 and 26.04); Megatron-Core's DDP default is fp32
        grad_reduce_fp32=None if fw not in ("nemo", "megatron-bridge") else dtype == "fp32",
        # NeMo's Apex DistributedFusedAdam stores fp32 master weights as 16-bit remainders of
        # bf16 weights (MegatronBaseModel.setup_optimization: store_param_remainders when the
        # optimizer state is fp32 and the weights bf16, unless fp8_params)
        param_remainders="distributed_fused_adam" in notes.lower() and dtype == "bf16",
        # Megatron-Core's fine-grained selective recomputation, as the row's recipe names it;
        # torchtitan's "selective" is per-op SAC (``selective_ac_option = "op"`` in its
        # llama3 train configs)
        recompute_modules=_recompute_modules(notes)
        or ("per_op" if fw == "torchtitan" and recompute == "selective" else ""),
        # torchtitan's loss is an unfused fp32 cross-entropy (train.py ``loss_fn``:
        # ``cross_entropy(pred.flatten(0, 1).float(), ...)``): 12 bytes per logit at its peak;
        # the ``logit_bytes`` column where a row's source sets another (16: PyTorch's
        # ``loss_parallel`` under TP, run uncompiled)
        logit_bytes=_float(row, "logit_bytes") or (12.0 if fw == "torchtitan" else 4.0),
        # torchtitan with PP: FSDP2 does not reshard after forward (``apply_fsdp``:
        # reshard_after_forward = False when pp_enabled) and the pipelining schedule holds
        # parameters and gradients unsharded until the last microbatch's backward
        fsdp_reshard=not (fw == "torchtitan" and pp > 1 and zero == 3),
        fsdp_step_gather=fw == "torchtitan" and pp > 1 and zero == 3,
        # the ``eager`` column: PyTorch eager mode without torch.compile (torchtitan's
        # ``compile = false``), its norms, RoPE, SwiGLU and residual adds unfused
        eager=_int(row, "eager", 0) == 1,
        # torchtitan calls PyTorch's SDPA, whose flash backend is FlashAttention-2 (under CP
        # restricted to flash/efficient: ``get_train_context`` at 9dec370; without CP flash
        # first, ``ScaledDotProductAttention.backends`` at 2887250); Transformer Engine prefers
        # cuDNN's fused attention on Hopper (``get_attention_backend``)
        attention_kernel="fa2" if fw == "torchtitan" else "cudnn",
        # torchtitan's context parallelism is PyTorch's ring attention (``context_parallel``):
        # K/V all-gathered behind the local block, partial outputs and gradients merged in
        # fp32 on the compute stream (perfmodel.torch_ring)
        cp_comm="torch" if fw == "torchtitan" else "p2p",
        # torchtitan shards with FSDP2 (``fully_shard`` with ``MixedPrecisionPolicy(param_dtype=
        # bfloat16, reduce_dtype=float32)``): the sharded parameters stay fp32 and are the
        # optimizer's master weights, cast to bf16 only in the all-gather
        fsdp_fp32_params=fw == "torchtitan" and zero == 3,
    )


_MODULES = re.compile(r"recompute_modules \[([a-z_, ]*)\]")


def _recompute_modules(notes: str) -> str:
    """The ``recompute_modules [a, b]`` a row's notes quote from its recipe (``""``: none)."""
    found = _MODULES.search(notes)
    return found.group(1) if found else ""


# the research note's "Grand Teton" rows (torchtitan S6/S7): H100 with 96 GB HBM2e at 2.4 TB/s
# (Meta's Grand Teton H100 96 GB, as the torchtitan benchmark documents state)
_GRAND_TETON = {"memory_capacity_bytes": 96e9, "memory_bandwidth_bytes_per_s": 2.4e12}


def _hardware_of_row(hw: Hardware, notes: str) -> Hardware:
    """The preset, or the row's documented variant of it (same name, so profiles apply)."""
    if "96 GB HBM2e" not in notes:
        return hw
    spec = dataclasses.replace(
        hw.spec, **{k: jnp.asarray(v, jnp.float32) for k, v in _GRAND_TETON.items()}
    )
    return dataclasses.replace(hw, spec=spec, description=hw.description + " (96 GB HBM2e)")


def _label(row: pd.Series) -> str:
    par = "/".join(str(_int(row, k, 1)) for k in ("tp", "pp", "cp", "ep"))
    name = str(_cell(row, "model"))
    if name == "custom":
        name = f"gpt-h{_int(row, 'hidden_size', 0)}-L{_int(row, 'num_layers', 0)}"
    seq = _int(row, "seq_len", 0) // 1024
    return (
        f"{name} {_cell(row, 'hardware')} x{_int(row, 'num_gpus', 0)} tp/pp/cp/ep={par} "
        f"s{seq}K {_cell(row, 'dtype')} {_cell(row, 'framework')}"
    )


def load_modern_runs(path: str | Path = MAIN_CSV) -> tuple[list[ModernRun], list[tuple[str, str]]]:
    """Every row of a modern-runs CSV as a :class:`ModernRun`, and the skipped rows.

    Returns:
      ``(runs, skipped)``: ``skipped`` holds ``(label, reason)`` for rows without a preset or a
      measured time.
    """
    path = Path(path)
    df = pd.read_csv(path)
    cache: dict[str, Model] = {}
    hws: dict[str, Hardware] = {}
    runs, skipped = [], []
    for i, (_, row) in enumerate(df.iterrows()):
        label = _label(row)
        m, why = _model(row, cache)
        if m is None:
            skipped.append((label, why))
            continue
        secs, source = _measured_seconds(row, m)
        if secs is None:
            skipped.append((label, source))
            continue
        hw_name = str(_cell(row, "hardware"))
        if hw_name not in hws:
            hws[hw_name] = load_hardware(hw_name)
        hw = _hardware_of_row(hws[hw_name], str(_cell(row, "notes") or ""))
        fw = str(_cell(row, "framework"))
        dtype = str(_cell(row, "dtype") or "bf16")
        pair = label.replace(" fp8 ", " * ").replace(" bf16 ", " * ")
        mem = _cell(row, "memory_peak_gib")
        runs.append(
            ModernRun(
                label=label,
                file=path.name,
                row=i + 2,
                model=m,
                hardware=hw,
                strategy=_strategy(row, hw),
                measured_step_s=float(secs),
                measured_memory_gib=float("nan") if mem is None else float(mem),
                framework=fw,
                stack=STACKS.get(fw, fw),
                fp8=dtype == "fp8",
                fp8_pair=pair,
                group="moe" if float(m.spec.num_experts) else "dense",
                seconds_from=source,
                notes=str(_cell(row, "notes") or ""),
                table=_table_of(row),
            )
        )
    return runs, skipped


_TABLE_NAME = re.compile(r"^\s*((?:table|section)\s+(?:'[^']*'|\d+))", re.IGNORECASE)


def _table_of(row: pd.Series) -> str:
    """The published table a row was read from: its source document, plus the table's name
    when ``source_of_value`` starts with one (``Table 6, row ...``, ``table 'Llama3 70b ...'``);
    a document holding a single table (NeMo's long-sequence page) is its own table."""
    doc = str(_cell(row, "source") or "")
    m = _TABLE_NAME.match(str(_cell(row, "source_of_value") or ""))
    return doc + (" | " + m.group(1) if m else "")


_step = jax.jit(step_time)


def predict_run(run: ModernRun, constants: Constants | None = None) -> dict[str, float]:
    """Predicted seconds per step, memory (GiB, with the preset's reserve) and feasibility."""
    c = run.hardware.constants if constants is None else constants
    bd = _step(run.model.spec, run.hardware.spec, c, run.strategy)
    reserve = float(run.hardware.spec.memory_reserve_bytes) / 2**30
    return {
        "predicted_s": float(bd.step_time_s),
        "memory_gib": float(bd.memory_per_device_bytes) / 2**30 + reserve,
        "fits_memory": bool(bd.fits_memory),
        "valid": bool(bd.valid),
        "feasible": bool(bd.feasible),
        "mfu_pct": 100.0 * float(bd.mfu),
    }


def evaluate_runs(
    runs: list[ModernRun], constants: dict[str, Constants] | None = None
) -> pd.DataFrame:
    """One row per run: measured and predicted seconds, error %, memory and feasibility.

    Args:
      runs: from :func:`load_modern_runs`.
      constants: hardware name -> constants (default: each preset's own).
    """
    out = []
    for r in runs:
        c = None if constants is None else constants.get(r.hardware.name)
        p = predict_run(r, c)
        out.append(
            {
                "label": r.label,
                "row": r.row,
                "stack": r.stack,
                "group": r.group,
                "hardware": r.hardware.name,
                "fp8": r.fp8,
                "measured_s": r.measured_step_s,
                **p,
                "error_pct": 100.0 * (p["predicted_s"] / r.measured_step_s - 1.0),
                "measured_memory_gib": r.measured_memory_gib,
            }
        )
    return pd.DataFrame(out)


def fp8_ratios(runs: list[ModernRun], predicted_s: np.ndarray) -> pd.DataFrame:
    """BF16-over-FP8 step-time ratios (the FP8 speed-up) of every pair that differs only in dtype.

    A pair is two runs whose labels are equal but for the dtype, and whose notes agree (so
    torchtitan's eager and compiled BF16 runs pair only with the compiled FP8 one).
    """
    by: dict[str, dict[bool, int]] = {}
    for i, r in enumerate(runs):
        key = r.fp8_pair + "|" + _note_key(r.notes)
        by.setdefault(key, {})[r.fp8] = i
    rows = []
    for key, d in by.items():
        if True in d and False in d:
            b, f = d[False], d[True]
            rows.append(
                {
                    "pair": key.split("|")[0],
                    "measured_speedup": runs[b].measured_step_s / runs[f].measured_step_s,
                    "predicted_speedup": float(predicted_s[b] / predicted_s[f]),
                }
            )
    df = pd.DataFrame(rows)
    if len(df):
        df["error_pct"] = 100.0 * (df.predicted_speedup / df.measured_speedup - 1.0)
    return df


def _note_key(notes: str) -> str:
    """The part of a row's notes that tells twin runs apart (compile mode, TP mode)."""
    n = notes.lower()
    keys = [k for k in ("eager", "async tp", "vanilla tp", "asynctp") if k in n]
    return ",".join(keys)


def fit_stack_profile(
    runs: list[ModernRun], free: list[str], *, stack: str, hardware: str, seed: int = 0
) -> dict[str, Any]:
    """Fits ``free`` to the runs of one stack on one hardware and returns the profile document
    (``aisim.profile/1``, as ``aisim calibrate fit`` writes it) with the runs it names and the
    cross-validated (held-out) error of each.
    """
    import hashlib

    from calibration.fit import fit
    from calibration.parameterization import parse_free
    from calibration.report import profile_document
    from calibration.rows import RowConfig, build_batch

    sel = [r for r in runs if r.stack == stack and r.hardware.name == hardware]
    batch = build_batch(
        [RowConfig(model=r.model, hardware=r.hardware, knobs={}, where=r.label) for r in sel],
        [r.strategy for r in sel],
    )
    measured = np.array([r.measured_step_s for r in sel])
    param = parse_free(free, sel[0].hardware.constants)
    res = fit(param, batch, measured, seed=seed, cross_validate=False)
    loo = leave_one_out_s(param, batch, measured)
    loo_err = 100.0 * (loo / measured - 1.0)
    sha = hashlib.sha256("\n".join(f"{r.label} {r.measured_step_s}" for r in sel).encode())
    doc = profile_document(res, hardware=hardware, data_sha=sha.hexdigest(), seed=seed)
    doc["stack"] = stack
    doc["fit"]["cv_method"] = "leave-one-out"
    doc["fit"]["cv_mape_pct"] = float(np.mean(np.abs(loo_err)))
    doc["fit"]["cv_max_error_pct"] = float(np.max(np.abs(loo_err)))
    doc["fitted_to"] = [
        {
            "run": r.label,
            "csv": f"calibration/data/{r.file}:{r.row}",
            "measured_s": r.measured_step_s,
            "fitted_error_pct": float(e),
            "held_out_error_pct": float(cv),
        }
        for r, e, cv in zip(sel, res.error_pct, loo_err, strict=True)
    ]
    return doc


def leave_one_out_s(param, batch, measured_s: np.ndarray) -> np.ndarray:
    """Each row predicted by the fit of all the others (the fit's own compiled solver with the
    row's weight set to zero), shape ``(n,)``."""
    from calibration.fit import solve
    from calibration.objective import predicted_step_time_s

    n = len(measured_s)
    out = np.empty(n)
    for i in range(n):
        w = np.ones(n, np.float32)
        w[i] = 0.0
        raw, _ = solve(param, batch, measured_s, w)
        out[i] = float(np.asarray(predicted_step_time_s(batch, param.constants(raw)))[i])
    return out


def cp_ratios(runs: list[ModernRun], predicted_s: np.ndarray) -> pd.DataFrame:
    """Tokens/s per GPU across the sequence lengths of one context-parallel series, relative to
    the series' shortest sequence, measured and predicted.

    A series is the runs of one published table (one experiment: its own batch, schedule and
    stack) and one model and hardware whose sequence lengths differ and of which at least one
    runs with cp > 1 (NeMo's Llama 2 7B 4K-1M, torchtitan's Tables 2 and 6, 32K-256K). Runs of
    another table are never its base, even at the same tokens per step.
    """
    series: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(runs):
        tokens = float(r.strategy.global_batch) * float(r.model.spec.seq_len)
        name = f"{r.model.name} {r.hardware.name} {r.framework} {tokens / 2**20:g}M tokens/step"
        series.setdefault((name, r.table), []).append(i)
    rows = []
    for (name, _), idx in series.items():
        seqs = {float(runs[i].model.spec.seq_len) for i in idx}
        if len(seqs) < 3 or not any(float(runs[i].strategy.cp) > 1 for i in idx):
            continue
        idx = sorted(idx, key=lambda i: float(runs[i].model.spec.seq_len))
        # one run per sequence length (the first), so twins of other settings do not mix in
        seen: dict[float, int] = {}
        for i in idx:
            seen.setdefault(float(runs[i].model.spec.seq_len), i)
        idx = list(seen.values())

        def tps(i: int, t: float) -> float:
            r = runs[i]
            tokens = float(r.strategy.global_batch) * float(r.model.spec.seq_len)
            return tokens / (t * float(r.strategy.num_gpus))

        b = idx[0]
        for i in idx[1:]:
            meas = tps(i, runs[i].measured_step_s) / tps(b, runs[b].measured_step_s)
            pred = tps(i, float(predicted_s[i])) / tps(b, float(predicted_s[b]))
            rows.append(
                {
                    "series": name,
                    "seq_len": int(float(runs[i].model.spec.seq_len)),
                    "cp": int(float(runs[i].strategy.cp)),
                    "measured_ratio": meas,
                    "predicted_ratio": pred,
                    "error_pct": 100.0 * (pred / meas - 1.0),
                }
            )
    return pd.DataFrame(rows)
