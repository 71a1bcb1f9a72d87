"""The strategies one sweep searches for a (model, hardware): the knob restrictions, checked,
and the cost model's grid over every GPU count and global batch.

Contract: :func:`grid_lists` reads the restrictions as people type them (``64,128,...,1024``,
``on,off``); :func:`normalise_knobs` validates the restrictions a caller puts on the grid's axes
(:data:`GRID_KNOBS`, from the knob registry) and raises :class:`~simbase.errors.AisimError` data
naming the knob; :func:`pair_grid` builds the :class:`~perfmodel.search.grid.StrategyGrid` of
one pair with aisim's enumeration (:func:`perfmodel.search.grid.enumerate_strategies`) or
DistIR's own grid (:func:`distir_grid`). Both are numpy only; nothing here evaluates a strategy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from perfmodel.plan.estimate import attention_heads, model_limits
from perfmodel.search.grid import StrategyGrid, concat_grids, enumerate_strategies, parse_lists
from perfmodel.specs.choices import Dtype
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.knobs import BY_NAME, KNOBS, model_defaults
from perfmodel.specs.model import Model
from perfmodel.specs.stack import Stack
from perfmodel.specs.stack_preset import load_stack
from perfmodel.specs.strategy import leaf_codes
from perfmodel.step.distir import DISTIR_STACK
from simbase.errors import bad_value
from simbase.parse import bool_word, parse_int_list, split_list

# the knobs a grid can cross: not those it derives, nor the scale-up domain (one per hardware)
GRID_KNOBS = tuple(
    k.name
    for k in KNOBS
    if k.home is not None and k.grid != "derived" and k.name != "gpus_per_node"
)


def positive_list(values: int | Sequence[int], field: str) -> list[int]:
    """One or several positive integers as a list (``field`` names them in errors)."""
    out = [values] if isinstance(values, int | np.integer) else list(values)
    for v in out:
        if isinstance(v, bool) or int(v) != v or v < 1 or v >= 2**31:
            raise bad_value(None, field, v, "positive integers")
    if not out:
        raise bad_value(None, field, values, "at least one positive integer")
    return [int(v) for v in out]


def grid_lists(knobs: dict[str, str | list[str]]) -> dict[str, list]:
    """A grid's restrictions as people type them, as lists of values.

    Args:
      knobs: registry knob name -> its text (``"1,2,4"``), or several texts (a repeated
        option); integers may continue a series (``64,128,...,1024``), a switch takes ``on``,
        ``off`` or ``both``, any other knob its words.

    Returns:
      Knob name -> its values (integers, booleans, or the words as typed); a knob whose text
      lists nothing is left out.

    Raises:
      AisimError: an integer or a switch that does not parse (field: the knob's name).
    """
    out: dict[str, list] = {}
    for name, raw in knobs.items():
        knob = BY_NAME[name]
        parts = split_list(raw if isinstance(raw, list) else [str(raw)])
        if parts is None:
            continue
        if knob.kind is int:
            minimum = 0 if knob.minimum == 0 else 1
            out[name] = parse_int_list(",".join(parts), name, minimum=minimum)
        elif knob.kind is bool:
            values: list[bool] = []
            for p in parts:
                word = None if p.lower() == "both" else bool_word(p)
                if p.lower() != "both" and word is None:
                    raise bad_value(None, name, p, "on, off or both")
                values += [False, True] if word is None else [word]
            out[name] = values
        else:
            out[name] = parts
    return out


def normalise_knobs(knobs: dict[str, Sequence[Any] | None]) -> dict[str, list | None]:
    """Validates the grid restrictions (any registry spelling of :data:`GRID_KNOBS`) and parses
    their values with the registry, so that bad values are reported by knob name."""
    parsed = parse_lists(knobs)
    unknown = sorted(set(parsed) - set(GRID_KNOBS))
    if unknown:
        raise bad_value(None, unknown[0], parsed[unknown[0]], "a knob a grid can sweep")
    return {k: parsed.get(k) for k in GRID_KNOBS}


def pair_grid(
    model: Model,
    hw: Hardware,
    num_gpus: list[int],
    global_batch: list[int],
    gpus_per_node: int,
    knobs: dict[str, list | None],
    cost_model: str = "aisim",
    allow_cross_node_tp: bool = False,
    stack=None,
) -> StrategyGrid:
    """The strategies searched for one (model, hardware): the cost model's grid over every GPU
    count and global batch, restricted by the knobs (:func:`normalise_knobs`), in the dtypes
    the hardware supports; without a ``stack``, the knobs a model preset sets
    (:func:`~perfmodel.specs.knobs.model_defaults`) take the model's values where the knobs do
    not restrict them."""
    if cost_model == "distir":
        return distir_grid(num_gpus, global_batch, knobs, gpus_per_node)
    heads, kv_heads = attention_heads(model)
    peak = np.asarray(hw.spec.peak_flops_per_s)  # on the host: indexing the device array compiles
    supported = [d.label for d in Dtype if float(peak[int(d)]) > 0]
    base = Stack() if stack is None else stack
    if stack is None:  # the attention kernel the model's runs use, unless the knobs choose
        given = {k: v for k, v in model_defaults(model).items() if knobs.get(k) is None}
        base = dataclasses.replace(base, **given)
    base = load_stack(base)
    return enumerate_strategies(
        **model_limits(model),
        num_layers=int(model.spec.num_layers),
        num_heads=heads,
        num_kv_heads=kv_heads,
        num_gpus=num_gpus,
        global_batch_size=global_batch,
        gpus_per_node=gpus_per_node,
        allow_cross_node_tp=allow_cross_node_tp,
        supported_dtypes=supported,
        stack=base,
        **{k: v for k, v in knobs.items() if v is not None},
    )


# the knobs DistIR does not sweep, at their values in its grid
_DISTIR_FIXED = dict(
    interleave=1,
    schedule="1f1b",
    zero_stage=0,
    recompute="none",
    sequence_parallel=False,
    dtype="bf16",
)


def distir_grid(
    num_gpus: list[int], global_batch: list[int], knobs: dict[str, list | None], gpus_per_node: int
) -> StrategyGrid:
    """DistIR's own grid (power-of-two dp·tp·pp = N; one microbatch when pp = 1, else 2..128),
    restricted by the ``tp``, ``pp`` and ``micro_batch_size`` knobs and crossed with the
    ``dtype`` knob; the knobs DistIR does not sweep stay at their defaults, under DistIR's
    stack (no DP overlap, no fused attention)."""
    from perfmodel.step.distir import distir_grid_columns

    fixed = leaf_codes(_DISTIR_FIXED | {"gpus_per_node": gpus_per_node})
    parts = []
    for n in num_gpus:
        for b in global_batch:
            cols = {k: np.asarray(v, np.float32) for k, v in distir_grid_columns(n, b).items()}
            rows = len(cols["dp"])
            full = {
                k: np.broadcast_to(cols.get(k, np.float32(x)), (rows,)).astype(np.float32)
                for k, x in fixed.items()
            }
            parts.append(StrategyGrid(full, {}, stacks=(DISTIR_STACK,)))
    g = concat_grids(parts)
    if knobs.get("dtype"):  # cross the grid with the dtypes asked for
        codes = [int(d) for d in dict.fromkeys(knobs["dtype"])]
        cols = {k: np.tile(v, len(codes)) for k, v in g.columns.items()}
        cols["dtype"] = np.repeat(np.asarray(codes, np.float32), len(g))
        g = dataclasses.replace(g, columns=cols)
    keep = np.ones(len(g), bool)
    for knob in ("tp", "pp", "micro_batch_size"):
        if knobs.get(knob):
            keep &= np.isin(g.columns[knob], knobs[knob])
    return g.take(keep)
