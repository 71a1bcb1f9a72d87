"""Plain-Python views of step-model results: one strategy as a dict, a grid as a DataFrame.

These are the shapes front ends print and write (JSON documents, result tables); notebooks use
them too.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfmodel.breakdown import BREAKDOWN_TERMS, StepBreakdown
from perfmodel.choices import (
    AttentionKernel,
    CpComm,
    Dtype,
    MoeDispatch,
    Recompute,
    RecomputeModule,
    Schedule,
)
from perfmodel.strategy import KNOBS, Strategy

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


def strategy_columns(s: Strategy) -> dict[str, np.ndarray]:
    """Knob columns with names for the coded choices (schedule, recompute, dtype)."""
    cols = {k: np.asarray(getattr(s, k)) for k in KNOBS}
    out: dict[str, np.ndarray] = {}
    for k in (
        "dp",
        "tp",
        "pp",
        "micro_batch_size",
        "num_microbatches",
        "interleave",
        "zero_stage",
        "gpus_per_node",
        "cp",
        "ep",
        "etp",
        "shard_size",
        "recompute_layers",
    ):
        out[k] = cols[k].astype(np.int64)
    out["schedule"] = np.asarray(Schedule.labels(), dtype=object)[cols["schedule"].astype(int)]
    out["recompute"] = np.asarray(Recompute.labels(), dtype=object)[cols["recompute"].astype(int)]
    out["sequence_parallel"] = cols["sequence_parallel"].astype(bool)
    out["dtype"] = np.asarray(Dtype.labels(), dtype=object)[cols["dtype"].astype(int)]
    out["dp_overlap"] = cols["dp_overlap"].astype(bool)
    out["fused_attention"] = cols["fused_attention"].astype(bool)
    for k in (
        "tp_overlap",
        "grad_reduce_fp32",
        "moe_overlap",
        "fsdp_reshard",
        "param_remainders",
        "fsdp_step_gather",
        "eager",
        "fsdp_fp32_params",
    ):
        out[k] = cols[k].astype(bool)
    out["logit_bytes"] = cols["logit_bytes"].astype(np.float64)
    out["moe_imbalance"] = cols["moe_imbalance"].astype(np.float64)
    out["moe_dispatch"] = np.asarray(MoeDispatch.labels(), dtype=object)[
        cols["moe_dispatch"].astype(int)
    ]
    out["cp_comm"] = np.asarray(CpComm.labels(), dtype=object)[cols["cp_comm"].astype(int)]
    out["attention_kernel"] = np.asarray(AttentionKernel.labels(), dtype=object)[
        cols["attention_kernel"].astype(int)
    ]
    out["recompute_modules"] = np.vectorize(RecomputeModule.label_of, otypes=[object])(
        cols["recompute_modules"]
    )
    out["global_batch_size"] = (
        cols["dp"] * cols["micro_batch_size"] * cols["num_microbatches"]
    ).astype(np.int64)
    out["num_gpus"] = (cols["dp"] * cols["tp"] * cols["pp"] * cols["cp"]).astype(np.int64)
    return out


def results_frame(s: Strategy, out: StepBreakdown) -> pd.DataFrame:
    """One row per strategy: knobs, then every result column.

    Args:
      s: strategies with leaves of shape ``(n,)`` (or scalars for one).
      out: their :class:`~perfmodel.step_time.StepBreakdown`, same shape.

    Returns:
      A DataFrame with the knob columns (choices by label, switches as booleans) and every
      result column (seconds, bytes, FLOPs; ``memory_*`` for the memory parts).
    """
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
    for k in (
        "dp",
        "tp",
        "pp",
        "micro_batch_size",
        "num_microbatches",
        "interleave",
        "schedule",
        "zero_stage",
        "recompute",
        "sequence_parallel",
        "dtype",
        "dp_overlap",
        "fused_attention",
        "global_batch_size",
        "num_gpus",
        "gpus_per_node",
        "cp",
        "ep",
        "etp",
        "shard_size",
        "recompute_layers",
        "tp_overlap",
        "grad_reduce_fp32",
        "moe_imbalance",
        "moe_dispatch",
        "moe_overlap",
        "cp_comm",
        "fsdp_reshard",
        "param_remainders",
        "recompute_modules",
        "logit_bytes",
        "fsdp_step_gather",
        "eager",
        "attention_kernel",
        "fsdp_fp32_params",
    ):
        if k in r:
            doc[k] = _py(r[k])
    return doc


def _py(v):
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not np.isfinite(v):
        return None
    return v
