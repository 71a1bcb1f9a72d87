"""The measurement table's vocabulary: canonical columns, their aliases and cell values.

Contract: :data:`ALIASES` maps each canonical column of DESIGN.md's table to the header spellings
the loader also accepts (Colossal-AI and DistIR names): the table's own columns
(:data:`TABLE_ALIASES`) and every knob of the registry (:mod:`perfmodel.specs.knobs`), under its
name and aliases; :func:`rename_columns` maps a table's headers to canonical names (any letter
case, spaces or dashes), the canonical spelling winning over an alias. The cell readers (:func:`isis_blank`, :func:`as_number`, :func:`as_bool`,
:func:`preset_name`) say what a cell holds; checking the values against them is
``calibration.measurements``' job.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from perfmodel.specs.knobs import KNOBS
from simbase.parse import bool_word

if TYPE_CHECKING:
    import pandas as pd

# the measurement table's own columns (model dimensions, hardware, measured values) -> accepted
# aliases (DESIGN.md, "Measurement / configuration CSV"); every strategy knob of the registry
# (perfmodel.specs.knobs) is a column too, under its name and the registry's aliases
TABLE_ALIASES: dict[str, tuple[str, ...]] = {
    "model": ("model_name", "model_size"),
    "num_layers": (),
    "hidden_size": (),
    "num_heads": ("attention_heads",),
    "seq_len": ("max_length",),
    "vocab_size": ("vocab",),
    "ffn_hidden_size": (),
    "num_kv_heads": (),
    "hardware": ("gpu", "gpu_type"),
    "stack": ("software_stack",),
    "step_time_s": ("latency", "measured_iteration_time_s", "avg_duration"),
    "throughput_samples_per_s": ("throughput", "throughput_samples_s"),
    "tflops_per_gpu": (),
    "flop_convention": (),
    "fp8": (),
    "num_experts": ("num_moe_experts",),
    "experts_per_token": ("moe_router_topk",),
    "moe_ffn_hidden_size": (),
    "shared_experts": (),
    "dense_layers": (),
    "head_dim": ("kv_channels",),
}
ALIASES: dict[str, tuple[str, ...]] = TABLE_ALIASES | {k.name: k.aliases for k in KNOBS}
CANONICAL: tuple[str, ...] = tuple(ALIASES)
KNOB_COLUMNS: tuple[str, ...] = tuple(k.name for k in KNOBS)

# Model-dimension columns holding a positive integer count.
POSITIVE_INT = (
    "num_layers", "hidden_size", "num_heads", "seq_len", "vocab_size", "ffn_hidden_size",
    "num_kv_heads",
)  # fmt: skip
# Model-dimension columns where 0 means "none" (dense, the default head size).
NON_NEGATIVE_INT = (
    "num_experts", "experts_per_token", "moe_ffn_hidden_size", "shared_experts", "dense_layers",
    "head_dim",
)  # fmt: skip
POSITIVE_FLOAT = ("step_time_s", "throughput_samples_per_s", "tflops_per_gpu")
# an ``fp8`` cell: yes/no, or the Transformer Engine scaling recipe the run used (which means yes)
FP8_RECIPES = ("tensorwise", "delayed", "current", "mxfp8", "blockwise", "hybrid", "e4m3")
MEASURED = ("step_time_s", "throughput_samples_per_s")
DIMENSIONS = ("num_layers", "hidden_size")  # the least a 'custom' model must give
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
    import pandas as pd

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
    import pandas as pd

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
    import pandas as pd

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
