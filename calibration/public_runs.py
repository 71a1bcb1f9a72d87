"""Published measurements of training runs (``calibration/data/published_runs*.csv``) as
model inputs.

Contract: :func:`load_published_runs` reads one :class:`PublishedRun` per row: the
:class:`~perfmodel.specs.model.Model`, the hardware preset, the
:class:`~perfmodel.specs.strategy.Strategy`, the measured seconds per step and peak memory. A row
is described the way a planner describes a run: its **stack** (``megatron-core@nemo``,
``torchtitan@2024-12``, ``deepspeed@megatron-deepspeed``, ...) and the facts its source prints
(model, GPUs, parallel layout, batch, sequence length, precision, and the framework settings
the source states, such as "Async TP" or "eager mode"). Everything else is what the stack preset
(``perfmodel/profiles/stacks``) does by default, and a knob the stack leaves to ``auto``
(recomputation, the ZeRO stage where the recipe picks it) takes the least that fits in memory, as
:func:`perfmodel.plan.estimate.estimate` chooses it. The loader adds nothing of its own.

A row whose model has no preset (and whose dimensions the table cannot describe alone) is
returned in ``skipped`` with the reason. :func:`evaluate_runs` predicts every row with the
constants given (the stack's, per hardware, when none).

Measured seconds per step (``measured_step_s``), by what the row publishes:

- ``step_time_s``: as published, or derived by the research note from tokens/s
  (``global_batch · seq_len / (tokens_per_s_per_gpu · num_gpus)``, see its ``derivation``);
- ``tokens_per_s_per_gpu`` only: the same formula here;
- ``tflops_per_gpu`` only: seconds = model FLOPs per step / (TFLOP/s · GPUs), with the FLOPs of
  the row's own convention (:data:`FLOP_CONVENTIONS`). The two documents that publish only
  TFLOP/s (Megatron-LM's weak-scaling table and NeMo 24.03's long-sequence table) both use
  Megatron's ``num_floating_point_operations`` (:func:`megatron_flops`): forward + backward,
  attention scores over the full (non-causal) s², recomputation not counted.

How the printed numbers are read: an FSDP group printed beside a stack that shards with it makes
the run ZeRO-3 (Megatron-FSDP's "FSDP = 8"); a group of all the dp·cp ranks is plain ZeRO-3
(torchtitan prints its "FSDP degree" as dp while sharding over dp·cp).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from perfmodel.plan.estimate import attention_heads, least_that_fits_many, model_limits
from perfmodel.plan.stack_constants import stack_constants
from perfmodel.search.evaluate import fast_jit, padded_to_power_of_two, stack_rows
from perfmodel.specs.choices import Dtype
from perfmodel.specs.constants import Constants
from perfmodel.specs.hardware import Hardware, load_hardware
from perfmodel.specs.knobs import KNOBS
from perfmodel.specs.model import (
    Model,
    load_model,
    model_from_dict,
    model_preset_name,
    with_overrides,
)
from perfmodel.specs.stack_preset import StackPreset, load_stack, program_key, shared_program
from perfmodel.specs.strategy import Strategy, leaves_of
from perfmodel.specs.validate import strategy_candidates
from perfmodel.step.step_time import step_time
from simbase.errors import AisimError

DATA_DIR = Path(__file__).parent / "data"
MAIN_CSV = DATA_DIR / "published_runs.csv"
HOLDOUT_CSV = DATA_DIR / "published_runs_holdout.csv"

# flop_convention prefixes -> how seconds per step follow from TFLOP/s (only rows that publish
# neither a step time nor tokens/s need one)
FLOP_CONVENTIONS = {
    "Megatron-LM num_floating_point_operations": "megatron",
    # NeMo 24.03's logged TFLOPS come from the same Megatron formula (NeMo's llama2 model FLOPs:
    # 12·(1 + g/n + s/h) + 18·ffn/h + 6·V/(L·h), per B·s·L·h², the full s² attention term)
    "NeMo 'TFLOPS / GPU' (model FLOPs of the NeMo 24.03 container)": "megatron",
}

# models whose benchmark configuration differs from the released model in what the table
# columns cannot carry, so the rows describe them by their columns: the flags besides them
_TABLE_MODELS = {
    # Grok-1 as NVIDIA's dgxc grok1_314b.yaml runs it: GeGLU experts (gated), 8 experts top-2,
    # RoPE, no dropout, and untied embeddings (share_embeddings_and_output_weights false), where
    # the released model (the grok-1 preset) ties them
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
class PublishedRun:
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
    source_id: str = ""
    auto: dict = dataclasses.field(default_factory=dict)


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
        # benchmark variants of _TABLE_MODELS: the CSV's columns, untied embeddings, RoPE, no bias
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
    if model_preset_name(name) is None:
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


# the printed facts a row may carry, by registry name (blank cells are not facts)
_FACTS = tuple(
    k.name for k in KNOBS if k.home is not None or k.name in ("num_gpus", "global_batch_size")
)


def _facts(row: pd.Series, stack_name: str) -> dict[str, Any]:
    """The knobs a row's source prints (its non-blank knob columns), read by the registry,
    with the printed numbers as the framework means them: an FSDP group makes the run ZeRO-3
    (Megatron-FSDP's ``FSDP = 8``), and a group of all the dp·cp ranks is plain ZeRO-3
    (torchtitan prints its "FSDP degree" as dp, the parameters being sharded over dp·cp)."""
    facts = {k: _cell(row, k) for k in _FACTS}
    facts = {k: v for k, v in facts.items() if v is not None}
    facts.pop("gpus_per_node", None)  # the hardware preset's (see _candidates)
    dp, cp = _int(row, "dp", 1), _int(row, "cp", 1)
    shard = _int(row, "shard_size", 0)
    if shard and _cell(row, "zero_stage") is None:
        facts["zero_stage"] = 3
    if shard and _int(row, "zero_stage", 3) < 3:
        # FSDP's SHARD_GRAD_OP over the group: ZeRO-2, no parameter shards
        facts.pop("shard_size", None)
    elif shard >= dp * cp or (stack_name.startswith("torchtitan") and shard == dp):
        facts["shard_size"] = 0
    return facts


def _candidates(row: pd.Series, m: Model, hw: Hardware, stack) -> list[tuple[dict, Strategy]]:
    """The run's candidate strategies from its stack and its printed facts alone: the stack's
    recipe defaults and behaviours fill the rest, one candidate per value an ``auto`` choice
    tries (``(chosen values, strategy)`` in order of preference; the least that fits is taken
    for all runs at once)."""
    heads, kv = attention_heads(m)
    facts = _facts(row, stack.name)
    # the scale-up domain is the hardware preset's: an NVL72 rack's sources print its 4 GPUs
    # per compute tray, but all 72 share NVLink
    gpn = int(hw.spec.gpus_per_node)
    try:
        cands = strategy_candidates(
            num_layers=int(m.spec.num_layers), num_heads=heads, num_kv_heads=kv, stack=stack,
            gpus_per_node=gpn, **model_limits(m), **facts,
        )  # fmt: skip
    except AisimError as e:
        raise e.relabel(source=_label(row)) from None
    return cands


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
    seq = _int(row, "seq_len", 0)
    seq_text = f"{seq // 1024}K" if seq >= 1024 else str(seq)
    dtype = _cell(row, "dtype") or "dtype?"
    return (
        f"{name} {_cell(row, 'hardware')} x{_int(row, 'num_gpus', 0)} tp/pp/cp/ep={par} "
        f"s{seq_text} {dtype} {_cell(row, 'framework')}"
    )


def load_published_runs(
    path: str | Path = MAIN_CSV,
) -> tuple[list[PublishedRun], list[tuple[str, str]]]:
    """Every row of a published-runs CSV as a :class:`PublishedRun`, and the skipped rows.

    Returns:
      ``(runs, skipped)``: ``skipped`` holds ``(label, reason)`` for rows without a preset or a
      measured time.

    A file is read once per process while it is unchanged (same path, size and modification
    time): reading one means choosing each run's recomputation (a compiled memory check per
    shape), and the validation tables, the fits and the tests read the shipped files many times.
    """
    path = Path(path)
    try:
        full = path.resolve()
        st = full.stat()
        key = (str(full), st.st_size, st.st_mtime_ns)
    except OSError:
        return _read_published_runs(path)  # raises what reading it raises
    if key not in _READ:
        _READ[key] = _read_published_runs(path)
    runs, skipped = _READ[key]
    return list(runs), list(skipped)


_READ: dict[tuple, tuple[list[PublishedRun], list[tuple[str, str]]]] = {}


def _read_published_runs(path: Path) -> tuple[list[PublishedRun], list[tuple[str, str]]]:
    df = pd.read_csv(path)
    cache: dict[str, Model] = {}
    hws: dict[str, Hardware] = {}
    stacks: dict[str, Any] = {}
    read, skipped = [], []
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
        stack_name = str(_cell(row, "stack"))
        if stack_name not in stacks:
            stacks[stack_name] = load_stack(stack_name, hw)
        try:
            cands = _candidates(row, m, hw, stacks[stack_name])
        except AisimError as e:  # the printed layout breaks a rule (a misprint in the source)
            skipped.append((label, str(e)))
            continue
        read.append((i, row, label, m, hw, secs, source, cands))
    picks = least_that_fits_many(
        [(m, hw, [c[1] for c in cands]) for *_, m, hw, _, _, cands in read]
    )
    runs = [
        _run(path, i, row, label, m, hw, secs, source, *cands[k])
        for (i, row, label, m, hw, secs, source, cands), k in zip(read, picks, strict=True)
    ]
    return runs, skipped


def _run(path, i, row, label, m, hw, secs, source, chosen, strategy) -> PublishedRun:
    """One run, its strategy ``strategy`` chosen with the ``auto`` values ``chosen``."""
    dtype = Dtype(int(strategy.memory.dtype)).label
    pair = label.replace(" fp8 ", " * ").replace(" bf16 ", " * ")
    mem = _cell(row, "memory_peak_gib")
    return PublishedRun(
        label=label,
        file=path.name,
        row=i + 2,
        model=m,
        hardware=hw,
        strategy=strategy,
        measured_step_s=float(secs),
        measured_memory_gib=float("nan") if mem is None else float(mem),
        framework=str(_cell(row, "framework")),
        stack=str(_cell(row, "stack")),
        source_id=str(_cell(row, "source_id")),
        auto={k: str(getattr(v, "label", v)) for k, v in chosen.items()},
        fp8=dtype == "fp8",
        fp8_pair=pair,
        group="moe" if float(m.spec.num_experts) else "dense",
        seconds_from=source,
        notes=str(_cell(row, "notes") or ""),
        table=_table_of(row),
    )


_TABLE_NAME = re.compile(r"^\s*((?:table|section)\s+(?:'[^']*'|\d+))", re.IGNORECASE)


def _table_of(row: pd.Series) -> str:
    """The published table a row was read from: its source document, plus the table's name
    when ``source_of_value`` starts with one (``Table 6, row ...``, ``table 'Llama3 70b ...'``);
    a document holding a single table (NeMo's long-sequence page) is its own table."""
    doc = str(_cell(row, "source") or "")
    m = _TABLE_NAME.match(str(_cell(row, "source_of_value") or ""))
    return doc + (" | " + m.group(1) if m else "")


_step = fast_jit(step_time)  # one run: compiled for a fast start


def shipped_constants(run: PublishedRun) -> Constants:
    """The constants a planner gets for the run: its stack's on its hardware
    (:func:`perfmodel.plan.stack_constants.stack_constants`: fitted, carried over or the
    preset's)."""
    key = (run.stack, run.hardware.name, run.hardware.description)
    if key not in _SHIPPED:
        _SHIPPED[key] = stack_constants(load_stack(run.stack), run.hardware).constants
    return _SHIPPED[key]


_SHIPPED: dict[tuple, Constants] = {}


def predict_run(run: PublishedRun, constants: Constants | None = None) -> dict[str, float]:
    """Predicted seconds per step, memory (GiB, with the preset's reserve) and feasibility,
    with ``constants`` (default: :func:`shipped_constants`)."""
    c = shipped_constants(run) if constants is None else constants
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
    runs: list[PublishedRun], constants: dict[str, Constants] | None = None
) -> pd.DataFrame:
    """One row per run: measured and predicted seconds, error %, memory and feasibility.

    Args:
      runs: from :func:`load_published_runs`.
      constants: hardware name -> constants (default: each run's :func:`shipped_constants`).
    """
    preds = predict_runs(runs, constants)
    out = []
    for r, p in zip(runs, preds, strict=True):
        out.append(
            {
                "label": r.label,
                "row": r.row,
                "source": r.source_id,
                "stack": r.stack,
                "group": r.group,
                "hardware": r.hardware.name,
                "fp8": r.fp8,
                "auto": ", ".join(f"{k} {v}" for k, v in r.auto.items()),
                "measured_s": r.measured_step_s,
                **p,
                "error_pct": 100.0 * (p["predicted_s"] / r.measured_step_s - 1.0),
                "measured_memory_gib": r.measured_memory_gib,
            }
        )
    return pd.DataFrame(out)


# every argument per run: runs on different hardware or constants share a program
_vmapped_step = fast_jit(jax.vmap(step_time))


def predict_runs(
    runs: list[PublishedRun], constants: dict[str, Constants] | None = None
) -> list[dict[str, float]]:
    """:func:`predict_run` of every run, one compiled program per group of runs that share a
    model structure and a stack (what shapes the program: the hardware and the constants are
    arguments of each run; the behaviours a preset's rules chose per run are traced, so the
    runs of one preset share a program: :func:`~perfmodel.specs.stack_preset.program_key`),
    each group padded to a power of two so that subsets of the runs reuse the programs."""
    if not runs:
        return []
    groups: dict[tuple, list[int]] = {}
    rules: dict[str, tuple] = {}
    for i, r in enumerate(runs):
        spec = r.model.spec
        if r.stack not in rules:
            preset = load_stack(r.stack)
            rules[r.stack] = preset.rules if isinstance(preset, StackPreset) else ()
        key = program_key(r.strategy.stack, rules[r.stack], leaves_of(r.strategy))
        groups.setdefault((spec.kind, spec.moe, spec.mla, key), []).append(i)
    flat: dict[int, Any] = {}
    for (*_, key), idx in groups.items():
        padded = padded_to_power_of_two(idx)
        scope = functools.reduce(lambda a, b: a | b, (runs[i].strategy.scope for i in idx))
        program = shared_program(key, [runs[i].strategy.stack for i in idx])
        consts = [
            shipped_constants(runs[i])
            if constants is None
            else constants.get(runs[i].hardware.name, runs[i].hardware.constants)
            for i in padded
        ]
        bd = _vmapped_step(
            stack_rows([runs[i].model.spec for i in padded]),
            stack_rows([runs[i].hardware.spec for i in padded]),
            stack_rows(consts),
            stack_rows(
                [dataclasses.replace(runs[i].strategy, scope=scope, stack=program) for i in padded]
            ),
        )
        bd = jax.tree.map(np.asarray, bd)
        for j, i in enumerate(idx):
            flat[i] = jax.tree.map(lambda x, j=j: x[j], bd)
    out = []
    for i, r in enumerate(runs):
        bd = flat[i]
        reserve = float(r.hardware.spec.memory_reserve_bytes) / 2**30
        out.append(
            {
                "predicted_s": float(bd.step_time_s),
                "memory_gib": float(bd.memory_per_device_bytes) / 2**30 + reserve,
                "fits_memory": bool(bd.fits_memory),
                "valid": bool(bd.valid),
                "feasible": bool(bd.feasible),
                "mfu_pct": 100.0 * float(bd.mfu),
            }
        )
    return out


def fp8_ratios(runs: list[PublishedRun], predicted_s: np.ndarray) -> pd.DataFrame:
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


def cp_ratios(runs: list[PublishedRun], predicted_s: np.ndarray) -> pd.DataFrame:
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
        if len(seqs) < 3 or not any(float(runs[i].strategy.layout.cp) > 1 for i in idx):
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
                    "cp": int(float(runs[i].strategy.layout.cp)),
                    "measured_ratio": meas,
                    "predicted_ratio": pred,
                    "error_pct": 100.0 * (pred / meas - 1.0),
                }
            )
    return pd.DataFrame(rows)
