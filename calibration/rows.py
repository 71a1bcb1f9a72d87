"""Rows of a measurement table as model/strategy pytrees, stacked for one ``vmap`` per group.

Contract: :func:`resolve_rows` turns a normalised measurement table (``calibration.measurements``)
into one :class:`RowConfig` per row (the model, the hardware and the knobs; blank knobs stay
``None``); :func:`row_strategy` fills the blanks with defaults and validates the row's strategy
(an error names the file, the row and the column); :func:`build_batch` stacks the rows by
hardware and model kind into a :class:`RowBatch`: rows of different models with the same kind
share one ``vmap``, because :class:`~perfmodel.specs.model.ModelSpec` leaves are arrays.
:func:`measured_step_times` returns the seconds per step that a fit compares against.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from calibration.columns import KNOB_COLUMNS
from perfmodel.search.evaluate import stack_rows
from perfmodel.specs.choices import Schedule
from perfmodel.specs.hardware import Hardware, HardwareSpec, load_hardware
from perfmodel.specs.model import Model, ModelSpec, load_model, model_from_dict, with_overrides
from perfmodel.specs.stack_preset import load_stack
from perfmodel.specs.strategy import Strategy
from perfmodel.specs.validate import strategy_from_knobs
from simbase.errors import AisimError, bad_value

if TYPE_CHECKING:
    import pandas as pd

DIM_COLUMNS = (
    "num_layers",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "ffn_hidden_size",
    "seq_len",
    "vocab_size",
    "num_experts",
    "experts_per_token",
    "moe_ffn_hidden_size",
    "shared_experts",
    "dense_layers",
    "head_dim",
)
# the columns a custom transformer must give, and the MLP columns of `aisim measure --params` rows
_CUSTOM_TRANSFORMER = ("num_layers", "hidden_size", "num_heads", "seq_len")
_MLP_COLUMNS = ("num_layers", "hidden_size", "input_size", "output_size")
# knobs a row may leave blank for `predict` to search, and their defaults otherwise
SEARCHABLE = ("micro_batch_size", "recompute", "zero_stage", "sequence_parallel", "tp", "pp")
_DEFAULT_VOCAB = 51200


@dataclasses.dataclass(frozen=True)
class RowConfig:
    """One row: the model, the hardware, the knobs (``None`` = blank) and where it came from.

    Attributes:
      model, hardware: resolved presets (with the row's dimension overrides).
      knobs: column -> value for each knob of the registry (``None`` when blank).
      where: ``FILE:ROW`` for messages.
      blank: the knobs of :data:`SEARCHABLE` whose column is present but whose cell is blank.
    """

    model: Model
    hardware: Hardware
    knobs: dict[str, Any]
    where: str
    blank: tuple[str, ...] = ()
    stack: Any = None


@dataclasses.dataclass(frozen=True)
class RowGroup:
    """Rows of one model kind on one hardware, stacked (leading axis ``n``)."""

    model: ModelSpec
    hw: HardwareSpec
    strategy: Strategy


jax.tree_util.register_dataclass(RowGroup, data_fields=["model", "hw", "strategy"], meta_fields=[])


@dataclasses.dataclass(frozen=True)
class RowBatch:
    """Every row, grouped for ``vmap``; ``order`` maps the concatenated groups back to rows."""

    groups: tuple[RowGroup, ...]
    order: np.ndarray  # position in the concatenation of the groups, for each row
    strategies: tuple[Strategy, ...]  # one per row, unbatched (for reports)


def cell(row: pd.Series, col: str) -> Any:
    """A cell as a Python value, or ``None`` when the column is absent or the cell blank."""
    import pandas as pd

    if col not in row.index:
        return None
    v = row[col]
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, str) and not v.strip():
        return None
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    if isinstance(v, np.bool_):
        return bool(v)
    return v


def row_source(row: pd.Series, i: int) -> str:
    """``FILE:ROW`` of a row (``source_file`` and ``source_row``, else ``<table>`` and ``i + 1``)."""
    src = cell(row, "source_file") or "<table>"
    return f"{src}:{cell(row, 'source_row') or i + 1}"


def _custom_model(row: pd.Series, dims: dict[str, Any], where: str) -> Model:
    """A ``custom`` row: a square MLP (``model_kind`` mlp) or a transformer from its columns."""
    if cell(row, "model_kind") == "mlp":  # rows that `aisim measure --params` writes
        doc = {k: cell(row, k) for k in _MLP_COLUMNS}
        doc = {k: v for k, v in doc.items() if v is not None}
        return model_from_dict({**doc, "kind": "mlp", "name": "custom"}, where)
    missing = [c for c in _CUSTOM_TRANSFORMER if dims[c] is None]
    if missing:
        raise AisimError(
            f"{where}: model 'custom' needs the columns {', '.join(missing)}",
            source=where,
            field="model",
            value="custom",
            expected="'custom' with the columns " + ", ".join(missing),
        )
    doc = {k: v for k, v in dims.items() if v is not None}
    doc.setdefault("vocab_size", _DEFAULT_VOCAB)
    doc.update(kind="transformer", name="custom")
    return model_from_dict(doc, where)


def _preset_dims(row: pd.Series, m: Model, dims: dict[str, Any]) -> dict[str, Any]:
    """The dimension overrides of a row over its preset ``m`` (``None`` = keep the preset's)."""
    if m.spec.kind == "mlp":
        # a resized MLP (aisim measure) also records its input and output widths; its layers
        # are square, so the MLP width is the hidden size
        hidden = dims["hidden_size"]
        return {
            "num_layers": dims["num_layers"],
            "hidden_size": hidden,
            "input_size": cell(row, "input_size"),
            "output_size": cell(row, "output_size"),
            "ffn_hidden_size": hidden,
        }
    dims = dict(dims)
    if dims["num_experts"] and dims["moe_ffn_hidden_size"] is None:
        # a row that makes a dense preset MoE: experts of the preset's MLP size unless it says
        if not float(m.spec.moe_ffn_hidden_size):
            dims["moe_ffn_hidden_size"] = dims["ffn_hidden_size"] or int(m.spec.ffn_hidden_size)
    if dims["hidden_size"] is not None and dims["ffn_hidden_size"] is None:
        # a preset with the usual 4h MLP keeps the ratio when only the hidden size changes
        if float(m.spec.ffn_hidden_size) == 4.0 * float(m.spec.hidden_size):
            dims["ffn_hidden_size"] = 4 * dims["hidden_size"]
    return dims


def _model_of(row: pd.Series, where: str, cache: dict[str, Model]) -> Model:
    name = cell(row, "model")
    if name is None:
        raise bad_value(
            where,
            "model",
            "",
            "a model preset name (the cell is blank)",
            hint="or pass a default {model}",
        )
    dims = {c: cell(row, c) for c in DIM_COLUMNS}
    if name == "custom":
        return _custom_model(row, dims, where)
    if name not in cache:
        cache[name] = load_model(name)
    m = cache[name]
    dims = _preset_dims(row, m, dims)
    if any(v is not None for v in dims.values()):
        m = with_overrides(m, **dims)
    return m


def _stack_of(row: pd.Series, hw: Hardware, where: str, cache: dict) -> Any:
    """The row's software stack (its ``stack`` cell: a preset name or a stack file), or None."""
    name = cell(row, "stack")
    if name is None:
        return None
    key = (str(name), hw.name)
    if key not in cache:
        try:
            cache[key] = load_stack(str(name), hw)
        except AisimError as e:
            raise e.relabel(source=where) from None
    return cache[key]


def resolve_rows(df: pd.DataFrame, hardware: str | None = None) -> list[RowConfig]:
    """One :class:`RowConfig` per row; ``hardware`` is used where the row names none.

    Raises:
      AisimError: an unknown model or hardware, or a blank one with no default (``source`` is
        the row, ``field`` the column).
    """
    models: dict[str, Model] = {}
    hws: dict[str, Hardware] = {}
    stacks: dict[tuple[str, str], Any] = {}
    out = []
    for i, (_, row) in enumerate(df.iterrows()):
        where = row_source(row, i)
        hw_name = cell(row, "hardware") or hardware
        if hw_name is None:
            raise bad_value(
                where,
                "hardware",
                "",
                "a hardware preset name (the cell is blank)",
                hint="or pass a default {hardware}",
            )
        if hw_name not in hws:
            hws[hw_name] = load_hardware(hw_name)
        knobs = {k: cell(row, k) for k in KNOB_COLUMNS}
        blank = tuple(k for k in SEARCHABLE if k in row.index and knobs[k] is None)
        model = _model_of(row, where, models)
        stack = _stack_of(row, hws[hw_name], where, stacks)
        out.append(
            RowConfig(model=model, hardware=hws[hw_name], knobs=knobs, where=where, blank=blank,
                      stack=stack)
        )  # fmt: skip
    return out


def default_micro_batch(knobs: dict[str, Any]) -> int:
    """A blank micro-batch size: from the microbatch count, else one microbatch without pipelining."""
    dp = knobs.get("dp") or 1
    gbs = knobs.get("global_batch_size")
    nmb = knobs.get("num_microbatches")
    if gbs is None:
        return 1
    if nmb is not None:
        return max(int(gbs) // (int(dp) * int(nmb)), 1)
    pp = knobs.get("pp") or 1
    return 1 if pp > 1 else max(int(gbs) // int(dp), 1)


def _degrees(k: dict[str, Any]) -> dict[str, Any]:
    """tp, pp, cp, num_gpus and dp of a row's knobs: blanks become 1, ``dp`` follows the others.

    A ``dp`` that no longer matches (a search tried other tp/pp) is dropped and derived again;
    when tp·cp·pp does not divide the GPUs, ``strategy_from_knobs`` reports it.
    """
    tp = int(k["tp"] or 1)
    pp = int(k["pp"] or 1)
    cp = int(k.get("cp") or 1)
    num_gpus = k["num_gpus"]
    dp = k["dp"]
    if num_gpus is None:
        num_gpus = int(dp or 1) * tp * pp * cp
    if dp is not None and int(dp) * tp * pp * cp != int(num_gpus):
        dp = None
    if dp is None and int(num_gpus) % (tp * pp * cp) == 0:
        dp = int(num_gpus) // (tp * pp * cp)
    return {
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "num_gpus": int(num_gpus),
        "dp": None if dp is None else int(dp),
    }


def _schedule(k: dict[str, Any], interleave: int, where: str) -> str:
    """The schedule's label: the row's (a label or a code), else interleaved when v > 1."""
    if k["schedule"] is None:
        return (Schedule.INTERLEAVED if interleave > 1 else Schedule.ONE_F_ONE_B).label
    return Schedule.parse(k["schedule"], "schedule", where=where).label


def _relabel(e: AisimError, where: str) -> AisimError:
    """A knob error of ``strategy_from_knobs`` as seen in the table: the row (the registry's
    knob names are the table's column names)."""
    return e.relabel(source=where)


def row_strategy(rc: RowConfig, **fill: Any) -> Strategy:
    """The validated strategy of a row, with ``fill`` overriding knobs (the values a search tries).

    Raises:
      AisimError: ``source`` the row, ``field`` the column (``tp·pp`` not dividing the world
        size, ...).
    """
    k = {**rc.knobs, **fill}
    k.update(_degrees(k))
    spec = rc.model.spec
    is_tf = spec.kind == "transformer"
    heads = int(spec.num_heads) if is_tf else int(spec.hidden_size)
    kv_heads = int(spec.num_kv_heads) if is_tf else int(spec.hidden_size)
    mbs = k["micro_batch_size"] if k["micro_batch_size"] is not None else default_micro_batch(k)
    gpn = k["gpus_per_node"] if k["gpus_per_node"] is not None else rc.hardware.spec.gpus_per_node
    interleave = int(k["interleave"] or 1)
    nmb = k["num_microbatches"] if fill.get("micro_batch_size") is None else None
    given = {name: v for name, v in k.items() if v is not None and name in KNOB_COLUMNS}
    given.update(
        micro_batch_size=int(mbs),
        num_microbatches=None if nmb is None else int(nmb),
        schedule=_schedule(k, interleave, rc.where),
        interleave=interleave,
        gpus_per_node=int(gpn),
    )
    try:
        return strategy_from_knobs(
            num_layers=int(spec.num_layers),
            num_heads=heads,
            num_kv_heads=kv_heads,
            stack=rc.stack,
            num_experts=int(spec.num_experts),
            seq_len=int(spec.seq_len) if is_tf else None,
            **given,
        )
    except AisimError as e:
        raise _relabel(e, rc.where) from None


def build_batch(rows: list[RowConfig], strategies: list[Strategy] | None = None) -> RowBatch:
    """Stacks rows by what shapes their compiled program (the hardware, the model's static
    structure, the software stack), each group under the union of its rows' scopes;
    ``strategies`` default to :func:`row_strategy`."""
    if strategies is None:
        strategies = [row_strategy(rc) for rc in rows]
    keys: dict[tuple, list[int]] = {}
    for i, rc in enumerate(rows):
        spec, st = rc.model.spec, strategies[i]
        # the hardware by name and description: a row's documented variant of a preset (the
        # 96 GB H100 of torchtitan's Grand Teton rows) is a program of its own
        hw = (rc.hardware.name, rc.hardware.description)
        keys.setdefault((hw, spec.kind, spec.moe, spec.mla, st.stack), []).append(i)
    groups = []
    order = np.zeros(len(rows), np.int64)
    pos = 0
    for idx in keys.values():
        scope = functools.reduce(lambda a, b: a | b, (strategies[i].scope for i in idx))
        groups.append(
            RowGroup(
                model=stack_rows([rows[i].model.spec for i in idx]),
                hw=rows[idx[0]].hardware.spec,
                strategy=stack_rows([dataclasses.replace(strategies[i], scope=scope) for i in idx]),
            )
        )
        for i in idx:
            order[i] = pos
            pos += 1
    return RowBatch(groups=tuple(groups), order=order, strategies=tuple(strategies))


def measured_step_times(df: pd.DataFrame, source: str | None = None) -> np.ndarray:
    """The measured seconds per step of every row (each must have one), shape ``(n,)``.

    Args:
      df: a normalised table (``measured_step_time_s`` and ``has_measurement`` columns).
      source: the table's name in messages (default: its ``source_file``).

    Raises:
      AisimError: no row has a measured value, or one is not a positive number of seconds.
    """
    if "has_measurement" not in df.columns or not df["has_measurement"].any():
        if source is None and "source_file" in df.columns and len(df):
            source = str(df["source_file"].iloc[0])
        raise AisimError(
            source=source or "<table>",
            field="measured_step_time_s",
            expected="a row with a measured step time or throughput: nothing to fit",
            hint="rows without one can only be predicted",
        )
    t = df["measured_step_time_s"].to_numpy(float)
    bad = ~np.isfinite(t) | (t <= 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise bad_value(
            row_source(df.iloc[i], i),
            "measured_step_time_s",
            t[i],
            "a positive number of seconds",
        )
    return t
