"""Plain-Python views of step-model results: one strategy as a dict, a grid as a DataFrame.

These are the shapes front ends print and write (JSON documents, result tables); notebooks use
them too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from perfmodel.specs.choices import RecomputeModule
from perfmodel.specs.knobs import KNOBS, LEAF_KNOBS, STACK_KNOBS
from perfmodel.specs.strategy import Strategy, leaves_of
from perfmodel.step.breakdown import BREAKDOWN_TERMS, StepBreakdown

if TYPE_CHECKING:
    import pandas as pd

SCALAR_KEYS = (
    "step_time_s",
    "throughput_samples_per_s",
    "tokens_per_s",
    "mfu",
    "hfu",
    "model_tflops_per_gpu",
    "hardware_tflops_per_gpu",
    "dp_comm_total_s",
    "cost_per_million_tokens_usd",
    "memory_per_device_bytes",
)
MEMORY_KEYS = ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes")


def breakdown_columns(out: StepBreakdown) -> dict[str, np.ndarray]:
    """Flat numpy columns of a (possibly batched) breakdown."""
    cols = {k: np.asarray(getattr(out, k)) for k in SCALAR_KEYS + BREAKDOWN_TERMS}
    for k in MEMORY_KEYS:
        cols[f"memory_{k}"] = np.asarray(getattr(out.memory, k))
    for k in ("fits_memory", "valid", "feasible"):
        cols[k] = np.asarray(getattr(out, k)).astype(bool)
    return cols


def _leaf_column(knob, codes: np.ndarray) -> np.ndarray:
    """A leaf knob's codes as reports show them: labels for choices, ints, floats, booleans."""
    if knob.is_choice:
        if knob.numeric:  # a ZeRO stage is a number
            return codes.astype(np.int64)
        return np.asarray(knob.kind.labels(), dtype=object)[codes.astype(int)]
    if knob.kind is bool:
        return codes.astype(bool)
    return codes.astype(np.int64 if knob.kind is int else np.float64)


def strategy_columns(s: Strategy) -> dict[str, np.ndarray]:
    """One column per registry knob (choices by label, switches as booleans), the stack's name,
    and the job's ``global_batch_size`` and ``num_gpus``; a stack knob is the same in every
    row, and an automatic stack knob as the registry derives it from the row."""
    leaves = {k: np.asarray(v) for k, v in leaves_of(s).items()}
    n = np.atleast_1d(leaves["dp"]).shape
    out: dict[str, np.ndarray] = {k.name: _leaf_column(k, leaves[k.name]) for k in LEAF_KNOBS}
    for k in STACK_KNOBS:
        value = k.label(getattr(s.stack, k.name))
        if value is None and k.derive is not None:  # automatic: as the registry derives it
            out[k.name] = np.asarray(k.derive(leaves), bool).reshape(np.shape(leaves["dp"]))
        elif k.kind is RecomputeModule:
            out[k.name] = np.full(n, value, dtype=object).reshape(np.shape(leaves["dp"]))
        else:
            out[k.name] = np.full(n, value).reshape(np.shape(leaves["dp"]))
    out["stack"] = np.full(n, s.stack.name, dtype=object).reshape(np.shape(leaves["dp"]))
    lv = leaves
    out["global_batch_size"] = (lv["dp"] * lv["micro_batch_size"] * lv["num_microbatches"]).astype(
        np.int64
    )
    out["num_gpus"] = (lv["dp"] * lv["tp"] * lv["pp"] * lv["cp"]).astype(np.int64)
    return out


# the knob keys of a result document: every registry knob, the stack, and the job's size
RESULT_KNOB_KEYS = tuple(k.name for k in KNOBS) + ("stack",)


def results_frame(s: Strategy, out: StepBreakdown) -> pd.DataFrame:
    """One row per strategy: knobs, then every result column.

    Args:
      s: strategies with leaves of shape ``(n,)`` (or scalars for one).
      out: their :class:`~perfmodel.step.step_time.StepBreakdown`, same shape.

    Returns:
      A DataFrame with the knob columns (choices by label, switches as booleans) and every
      result column (seconds, bytes, FLOPs; ``memory_*`` for the memory parts).
    """
    import pandas as pd

    s_cols = strategy_columns(s)
    n = len(np.atleast_1d(s_cols["dp"]))
    data = {k: np.atleast_1d(v) for k, v in s_cols.items()}
    data.update(
        {k: np.broadcast_to(np.atleast_1d(v), (n,)) for k, v in breakdown_columns(out).items()}
    )
    return pd.DataFrame(data)


def row_to_result(row: pd.Series | dict) -> dict:
    """The JSON document of one strategy (a row of a results frame) with plain Python values."""
    r = dict(row)
    doc = {k: _py(r[k]) for k in SCALAR_KEYS}
    doc["feasible"] = bool(r["feasible"])
    doc["fits_memory"] = bool(r["fits_memory"])
    doc["valid"] = bool(r["valid"])
    doc["breakdown"] = {k: _py(r[k]) for k in BREAKDOWN_TERMS}
    doc["breakdown"]["step_time_s"] = _py(r["step_time_s"])
    doc["memory"] = {k: _py(r[f"memory_{k}"]) for k in MEMORY_KEYS}
    doc["memory"]["total_bytes"] = _py(r["memory_per_device_bytes"])
    for k in RESULT_KNOB_KEYS:
        if k in r:
            doc[k] = _py(r[k])
    return doc


def _py(v):
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not np.isfinite(v):
        return None
    return v
