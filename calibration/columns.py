"""The measurement table's vocabulary: canonical columns, their aliases and cell values.

Contract: :data:`ALIASES` maps each canonical column of DESIGN.md's table to the header spellings
the loader also accepts (Colossal-AI and DistIR names); :func:`rename_columns` maps a table's
headers to canonical names (any letter case, spaces or dashes), the canonical spelling winning
over an alias. The cell readers (:func:`isis_blank`, :func:`as_number`, :func:`as_bool`,
:func:`preset_name`) say what a cell holds; checking the values against them is
``calibration.measurements``' job.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from perfmodel.choices import Recompute, ZeroStage
from simbase.parse import bool_word

# canonical name -> accepted aliases (DESIGN.md, "Measurement / configuration CSV").
ALIASES: dict[str, tuple[str, ...]] = {
    "model": ("model_name", "model_size"),
    "num_layers": (),
    "hidden_size": (),
    "num_heads": ("attention_heads",),
    "seq_len": ("max_length",),
    "vocab_size": ("vocab",),
    "ffn_hidden_size": (),
    "num_kv_heads": (),
    "hardware": ("gpu", "gpu_type"),
    "num_gpus": ("world_size",),
    "gpus_per_node": (),
    "dp": ("dp_degree", "dp_size", "data_parallel"),
    "tp": ("hp_degree", "tp_size", "tensor_parallel"),
    "pp": ("pp_degree", "pp_size", "pipeline_parallel"),
    "global_batch_size": ("batch_size",),
    "micro_batch_size": ("microbatch_size", "mbs"),
    "num_microbatches": (),
    "interleave": ("pipeline_interleaving", "num_model_chunks"),
    "recompute": ("recompute_mode", "grad_checkpoint"),
    "sequence_parallel": (),
    "dp_overlap": ("overlap_grad_reduce",),
    "fused_attention": ("flash_attention", "use_flash_attn"),
    "zero_stage": (),
    "dtype": ("precision",),
    "step_time_s": ("latency", "measured_iteration_time_s", "avg_duration"),
    "throughput_samples_per_s": ("throughput", "throughput_samples_s"),
    "tflops_per_gpu": (),
    "flop_convention": (),
    # today's runs (issue 15): context/expert parallelism, HSDP, FP8 and MoE model columns
    "cp": ("context_parallel_size", "cp_size"),
    "ep": ("expert_model_parallel_size", "ep_size"),
    "etp": ("expert_tensor_parallel_size",),
    "shard_size": ("hsdp_shard_size",),
    "fp8": (),
    "recompute_layers": ("recompute_num_layers",),
    "tp_overlap": ("tp_comm_overlap",),
    "num_experts": ("num_moe_experts",),
    "experts_per_token": ("moe_router_topk",),
    "moe_ffn_hidden_size": (),
    "shared_experts": (),
    "dense_layers": (),
    "head_dim": ("kv_channels",),
}
CANONICAL: tuple[str, ...] = tuple(ALIASES)

# Columns holding a positive integer count; zero_stage is checked on its own (0-3).
POSITIVE_INT = (
    "num_layers", "hidden_size", "num_heads", "seq_len", "vocab_size", "ffn_hidden_size",
    "num_kv_heads", "num_gpus", "gpus_per_node", "dp", "tp", "pp", "global_batch_size",
    "micro_batch_size", "num_microbatches", "interleave", "cp", "ep", "etp",
)  # fmt: skip
# Integer columns where 0 means "the default" (all dp·cp ranks, every layer, dense, ...).
NON_NEGATIVE_INT = (
    "shard_size", "recompute_layers", "num_experts", "experts_per_token",
    "moe_ffn_hidden_size", "shared_experts", "dense_layers", "head_dim",
)  # fmt: skip
POSITIVE_FLOAT = ("step_time_s", "throughput_samples_per_s", "tflops_per_gpu")
BOOLEAN = ("sequence_parallel", "dp_overlap", "fused_attention", "tp_overlap")
# an ``fp8`` cell: yes/no, or the Transformer Engine scaling recipe the run used (which means yes)
FP8_RECIPES = ("tensorwise", "delayed", "current", "mxfp8", "blockwise", "hybrid", "e4m3")
MEASURED = ("step_time_s", "throughput_samples_per_s")
DIMENSIONS = ("num_layers", "hidden_size")  # the least a 'custom' model must give

RECOMPUTE = Recompute.labels()
ZERO_STAGES = tuple(int(z) for z in ZeroStage)
DTYPES: dict[str, str] = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "f32": "fp32", "32": "fp32",
    "tf32": "tf32", "tensorfloat32": "tf32",
    "bf16": "bf16", "bfloat16": "bf16", "bf16-mixed": "bf16", "amp_bf16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "f16": "fp16", "16": "fp16",
    "fp16-mixed": "fp16", "amp": "fp16", "amp_fp16": "fp16", "mixed": "fp16",
    "fp8": "fp8", "float8": "fp8", "e4m3": "fp8", "fp8_e4m3": "fp8",
}  # fmt: skip
NOT_MEASURED_KINDS = ("simulated", "simulation", "predicted", "estimated")


def column_key(header: str) -> str:
    """A header as looked up: stripped, lower case, spaces and dashes as underscores."""
    return str(header).strip().lower().replace(" ", "_").replace("-", "_")


ALIAS_OF: dict[str, str] = {}
for _canon, _aliases in ALIASES.items():
    for _name in (_canon, *_aliases):
        ALIAS_OF[column_key(_name)] = _canon


def preset_name(text: str) -> str:
    """Normalises a model or hardware name: ``'A100-80GB (Selene)'`` -> ``'a100-80gb'``."""
    text = str(text).strip()
    if text.endswith(")") and "(" in text:
        text = text[: text.rindex("(")]
    return text.strip().lower().replace(" ", "-").replace("_", "-")


def is_blank(v: Any) -> bool:
    """Whether a cell is empty: ``None``, ``pd.NA``, NaN or only spaces."""
    if v is None or v is pd.NA:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    return isinstance(v, str) and v.strip() == ""


def as_number(v: Any) -> float:
    """A cell as a float; raises ValueError for text that is not a number."""
    if isinstance(v, bool | np.bool_):
        raise ValueError
    if isinstance(v, int | float | np.integer | np.floating):
        return float(v)
    return float(str(v).strip())


def as_bool(v: Any) -> bool:
    """A yes/no cell (``simbase.parse`` words; ``1.0``/``0.0`` as a numeric column writes them)."""
    if isinstance(v, bool | np.bool_):
        return bool(v)
    s = str(v).strip().lower()
    out = bool_word(s[:-2] if s.endswith(".0") else s)
    if out is None:
        raise ValueError
    return out


def as_fp8(v: Any) -> bool:
    """An ``fp8`` cell: a yes/no word, or a scaling recipe (:data:`FP8_RECIPES`: FP8 on)."""
    if str(v).strip().lower() in FP8_RECIPES:
        return True
    return as_bool(v)


def rename_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Maps alias headers to canonical names; coalesces a canonical column with its aliases."""
    groups: dict[str, list[str]] = {}
    for col in df.columns:
        canon = ALIAS_OF.get(column_key(col))
        if canon is not None:
            groups.setdefault(canon, []).append(col)
    out = pd.DataFrame(index=df.index)
    for col in df.columns:
        canon = ALIAS_OF.get(column_key(col))
        if canon is None:
            out[col] = _infer(df[col])
            continue
        if canon in out.columns:
            continue
        # The canonical spelling wins; an alias only fills its blanks.
        cols = sorted(groups[canon], key=lambda c: column_key(c) != canon)
        merged = _column(df, cols[0])
        for other in cols[1:]:
            merged = merged.where(~merged.map(is_blank), _column(df, other))
        out[canon] = merged
    return out


def _infer(col: pd.Series) -> pd.Series:
    """A pass-through column of text becomes numeric when every non-blank cell is a number."""
    if col.dtype != object and not pd.api.types.is_string_dtype(col):
        return col
    filled = col[~col.map(is_blank)]
    try:
        filled.map(as_number)
    except (ValueError, TypeError):
        return col
    return pd.to_numeric(col.where(~col.map(is_blank), np.nan))


def _column(df: pd.DataFrame, col: str) -> pd.Series:
    s = df[col].astype(object)
    if column_key(col) == "grad_checkpoint":
        # A boolean: true means full recomputation, false none.
        def convert(v: Any) -> Any:
            try:
                return v if is_blank(v) else ("full" if as_bool(v) else "none")
            except ValueError:
                return v  # reported by the recompute check

        s = s.map(convert)
    return s
