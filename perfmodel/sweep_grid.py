"""The strategies one sweep searches for a (model, hardware): the knob restrictions, checked,
and the cost model's grid over every GPU count and global batch.

Contract: :func:`normalise_knobs` validates the restrictions a caller puts on the grid's axes
(:data:`GRID_KNOBS`) and raises :class:`~simbase.errors.AisimError` data naming the knob;
:func:`pair_grid` builds the :class:`~perfmodel.grid.StrategyGrid` of one pair with aisim's
enumeration (:func:`perfmodel.grid.enumerate_strategies`) or DistIR's own grid
(:func:`distir_grid`). Both are numpy only; nothing here evaluates a strategy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from perfmodel.choices import (
    RECOMPUTE_ALIASES,
    AttentionKernel,
    CpComm,
    Dtype,
    MoeDispatch,
    Recompute,
    Schedule,
    ZeroStage,
)
from perfmodel.estimate import attention_heads, model_limits
from perfmodel.grid import StrategyGrid, concat_grids, enumerate_strategies
from perfmodel.hardware import Hardware
from perfmodel.strategy import KNOBS, with_default_knobs
from perfmodel.workload import Model
from simbase.errors import bad_value

# the knobs a sweep may restrict, by enumerate_strategies's parameter names
GRID_KNOBS = (
    "tp",
    "pp",
    "micro_batch",
    "schedule",
    "interleave",
    "zero",
    "recompute",
    "sequence_parallel",
    "dtype",
    "dp_overlap",
    "fused_attention",
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
    "eager",
    "attention_kernel",
)
# knobs that take integers (>= 1, or >= 0 for the sizes where 0 means "all")
_POSITIVE = ("tp", "pp", "micro_batch", "interleave", "cp", "ep", "etp")
_NON_NEGATIVE = ("shard_size", "recompute_layers")


def positive_list(values: int | Sequence[int], field: str) -> list[int]:
    """One or several positive integers as a list (``field`` names them in errors)."""
    out = [values] if isinstance(values, int | np.integer) else list(values)
    for v in out:
        if int(v) != v or v < 1:
            raise bad_value(None, field, v, "positive integers")
    if not out:
        raise bad_value(None, field, values, "at least one positive integer")
    return [int(v) for v in out]


def normalise_knobs(knobs: dict[str, Sequence[Any] | None]) -> dict[str, list | None]:
    """Validates the grid restrictions (:data:`GRID_KNOBS`) and reads named choices as their
    enum members (:mod:`perfmodel.choices`), so that bad values are reported by knob name."""
    unknown = sorted(set(knobs) - set(GRID_KNOBS))
    if unknown:
        raise TypeError(f"sweep() got unexpected knob(s) {', '.join(unknown)}")
    out: dict[str, list | None] = {k: None for k in GRID_KNOBS}
    for k, values in knobs.items():
        if values is None:
            continue
        values = list(values)
        if k in _POSITIVE:
            values = positive_list(values, k)
        elif k in _NON_NEGATIVE:
            for v in values:
                if int(v) != v or v < 0:
                    raise bad_value(None, k, v, "non-negative integers (0 = the default)")
            values = [int(v) for v in values]
        elif k == "moe_imbalance":
            for v in values:
                if not float(v) >= 1.0:
                    raise bad_value(None, k, v, "ratios of at least 1.0 (1.0 = balanced)")
            values = [float(v) for v in values]
        elif k == "moe_dispatch":
            values = [MoeDispatch.parse(v, k) for v in values]
        elif k == "cp_comm":
            values = [CpComm.parse(v, k) for v in values]
        elif k == "attention_kernel":
            values = [AttentionKernel.parse(v, k) for v in values]
        elif k == "zero":
            for z in values:
                if z not in tuple(ZeroStage):
                    raise bad_value(None, "zero", z, "ZeRO stages among 0, 1, 2, 3")
            values = [ZeroStage(int(z)) for z in values]
        elif k == "schedule":
            values = [Schedule.parse(v, "schedule") for v in values]
        elif k == "recompute":
            values = [Recompute.parse(v, "recompute", aliases=RECOMPUTE_ALIASES) for v in values]
        elif k == "dtype":
            values = [Dtype.parse(v, "dtype") for v in values]
        else:  # sequence_parallel, dp_overlap, fused_attention and the other on/off switches
            values = [bool(v) for v in values]
        out[k] = values or None
    return out


def pair_grid(
    model: Model,
    hw: Hardware,
    num_gpus: list[int],
    global_batch: list[int],
    gpus_per_node: int,
    knobs: dict[str, list | None],
    cost_model: str = "aisim",
    allow_cross_node_tp: bool = False,
) -> StrategyGrid:
    """The strategies searched for one (model, hardware): the cost model's grid over every GPU
    count and global batch, restricted by the knobs (:func:`normalise_knobs`), in the dtypes
    the hardware supports; without a ``fused_attention`` restriction, the model's
    ``fused_attention_default``."""
    if cost_model == "distir":
        return distir_grid(num_gpus, global_batch, knobs, gpus_per_node)
    heads, kv_heads = attention_heads(model)
    supported = [d.label for d in Dtype if float(hw.spec.peak_flops_per_s[int(d)]) > 0]
    if knobs.get("fused_attention") is None:  # the attention kernel the model's runs use
        knobs = {**knobs, "fused_attention": [model.fused_attention_default]}
    return enumerate_strategies(
        **model_limits(model),
        num_layers=int(model.spec.num_layers),
        num_heads=heads,
        num_kv_heads=kv_heads,
        num_gpus=num_gpus,
        global_batch=global_batch,
        gpus_per_node=gpus_per_node,
        allow_cross_node_tp=allow_cross_node_tp,
        supported_dtypes=supported,
        **{k: (None if v is None else [_plain(x) for x in v]) for k, v in knobs.items()},
    )


def _plain(value: Any) -> Any:
    """A named choice as its label (what enumerate_strategies reads), other values unchanged."""
    if isinstance(value, Schedule | Recompute | Dtype | MoeDispatch | CpComm | AttentionKernel):
        return value.label
    return int(value) if isinstance(value, ZeroStage) else value


# the knobs DistIR does not sweep, at their values in its grid
_DISTIR_FIXED = dict(
    interleave=1,
    schedule=Schedule.ONE_F_ONE_B,
    zero_stage=ZeroStage.NONE,
    recompute=Recompute.NONE,
    sequence_parallel=0,
    dtype=Dtype.BF16,
    dp_overlap=1,
    fused_attention=0,
)


def distir_grid(
    num_gpus: list[int], global_batch: list[int], knobs: dict[str, list | None], gpus_per_node: int
) -> StrategyGrid:
    """DistIR's own grid (power-of-two dp·tp·pp = N; one microbatch when pp = 1, else 2..128),
    restricted by the ``tp``, ``pp`` and ``micro_batch`` knobs and crossed with the ``dtype``
    knob; the knobs DistIR does not sweep stay at their defaults."""
    from perfmodel.distir import distir_grid_columns

    # today's knobs (cp, ep, ...) at their defaults: DistIR's grid has none of them
    defaults = with_default_knobs({"dtype": np.asarray([float(Dtype.BF16)], np.float32)})
    fixed = {k: float(v[0]) for k, v in defaults.items()}
    fixed |= {k: float(v) for k, v in _DISTIR_FIXED.items()} | {"gpus_per_node": gpus_per_node}
    parts = []
    for n in num_gpus:
        for b in global_batch:
            cols = {k: np.asarray(v, np.float32) for k, v in distir_grid_columns(n, b).items()}
            rows = len(cols["dp"])
            full = {
                k: np.broadcast_to(cols.get(k, np.float32(fixed.get(k, 0))), (rows,)).astype(
                    np.float32
                )
                for k in KNOBS
            }
            parts.append(StrategyGrid(full, {}))
    g = concat_grids(parts)
    if knobs.get("dtype"):  # cross the grid with the dtypes asked for
        codes = [int(d) for d in dict.fromkeys(knobs["dtype"])]
        g = StrategyGrid({k: np.tile(v, len(codes)) for k, v in g.columns.items()}, {})
        g.columns["dtype"] = np.repeat(np.asarray(codes, np.float32), len(g) // len(codes))
    keep = np.ones(len(g), bool)
    for knob, col in (("tp", "tp"), ("pp", "pp"), ("micro_batch", "micro_batch_size")):
        if knobs.get(knob):
            keep &= np.isin(g.columns[col], knobs[knob])
    return g.take(keep)
