"""Rows of a measurement table as stacked model/strategy pytrees, and the fit's objective.

Contract: :func:`resolve_rows` turns a normalised measurement table (``calibration.measurements``)
into one :class:`RowConfig` per row (the model, the hardware and the knobs; blank knobs stay
``None``); :func:`build_batch` fills the blanks with defaults, validates each row's strategy
(naming the file and the row) and stacks the rows by model kind into a :class:`RowBatch`: rows of
different models with the same kind share one ``vmap``, because :class:`ModelSpec` leaves are
arrays. :func:`predicted_step_time_s` evaluates every row at once; :func:`objective` is the
robust loss

    L(θ) = Σ_i w_i · huber(log(t̂_i(θ) / t_i), δ) / Σ_i w_i  +  λ · ‖θ − θ_preset‖²

in the raw (unconstrained) space ``θ`` of a :class:`~calibration.parameterization.Parameterization`;
the weights ``w`` select the rows (held-out rows weigh 0) without recompiling.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd

from calibration.parameterization import Parameterization
from perfmodel.constants import Constants
from perfmodel.hardware import Hardware, HardwareSpec, load_hardware
from perfmodel.step_time import step_time
from perfmodel.strategy import SCHEDULES, Strategy, strategy_from_knobs
from perfmodel.workload import Model, ModelSpec, load_model, model_from_dict, with_overrides
from simbase.errors import AisimError, bad_value

HUBER_DELTA = 0.1  # residuals beyond 10% in log space count linearly (robust to outliers)
PRIOR_WEIGHT = 1e-6  # per raw unit squared: weak, only decides what the data cannot
DIM_COLUMNS = (
    "num_layers",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "ffn_hidden_size",
    "seq_len",
    "vocab_size",
)
# knobs a row may leave blank for `predict` to search, and their defaults otherwise
SEARCHABLE = ("micro_batch_size", "recompute", "zero_stage", "sequence_parallel", "tp", "pp")
_DEFAULT_VOCAB = 51200


@dataclasses.dataclass(frozen=True)
class RowConfig:
    """One row: the model, the hardware, the knobs (``None`` = blank) and where it came from."""

    model: Model
    hardware: Hardware
    knobs: dict[str, Any]
    where: str


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


def _val(row: pd.Series, col: str) -> Any:
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


def _where(row: pd.Series, i: int) -> str:
    src = _val(row, "source_file") or "<table>"
    return f"{src}:{_val(row, 'source_row') or i + 1}"


def _model_of(row: pd.Series, where: str, cache: dict) -> Model:
    name = _val(row, "model")
    if name is None:
        raise AisimError(
            f"{where}: field 'model' is blank: expected a model preset name (or --model)"
        )
    dims = {c: _val(row, c) for c in DIM_COLUMNS}
    if name == "custom" and _val(row, "model_kind") == "mlp":  # `aisim measure --params` rows
        doc = {k: _val(row, k) for k in ("num_layers", "hidden_size", "input_size", "output_size")}
        return model_from_dict(
            {**{k: v for k, v in doc.items() if v is not None}, "kind": "mlp", "name": "custom"},
            where,
        )
    if name == "custom":
        missing = [
            c for c in ("num_layers", "hidden_size", "num_heads", "seq_len") if dims[c] is None
        ]
        if missing:
            raise AisimError(f"{where}: model 'custom' needs the columns {', '.join(missing)}")
        doc = {k: v for k, v in dims.items() if v is not None}
        doc.setdefault("vocab_size", _DEFAULT_VOCAB)
        doc.update(kind="transformer", name="custom")
        return model_from_dict(doc, where)
    if name not in cache:
        cache[name] = load_model(name)
    m = cache[name]
    if m.spec.kind == "mlp":
        # a resized MLP (aisim measure) also records its input and output widths
        dims = {
            "num_layers": dims["num_layers"],
            "hidden_size": dims["hidden_size"],
            "input_size": _val(row, "input_size"),
            "output_size": _val(row, "output_size"),
        }
    if (
        dims.get("hidden_size") is not None
        and dims.get("ffn_hidden_size") is None
        and m.spec.kind == "transformer"
    ):
        if float(m.spec.ffn_hidden_size) == 4.0 * float(m.spec.hidden_size):
            dims["ffn_hidden_size"] = 4 * dims["hidden_size"]
    if m.spec.kind == "mlp" and dims.get("hidden_size") is not None:
        dims["ffn_hidden_size"] = dims["hidden_size"]
    if any(v is not None for v in dims.values()):
        m = with_overrides(m, **dims)
    return m


def resolve_rows(df: pd.DataFrame, hardware: str | None = None) -> list[RowConfig]:
    """One :class:`RowConfig` per row; ``hardware`` is used where the row names none.

    Raises:
      AisimError: an unknown model or hardware, or a blank one with no default.
    """
    models: dict[str, Model] = {}
    hws: dict[str, Hardware] = {}
    out = []
    for i, (_, row) in enumerate(df.iterrows()):
        where = _where(row, i)
        hw_name = _val(row, "hardware") or hardware
        if hw_name is None:
            raise AisimError(
                f"{where}: field 'hardware' is blank: expected a hardware preset (or --hardware)"
            )
        if hw_name not in hws:
            hws[hw_name] = load_hardware(hw_name)
        knobs = {
            k: _val(row, k)
            for k in (
                "dp",
                "tp",
                "pp",
                "num_gpus",
                "global_batch_size",
                "micro_batch_size",
                "num_microbatches",
                "interleave",
                "recompute",
                "sequence_parallel",
                "zero_stage",
                "dtype",
                "gpus_per_node",
                "schedule",
                "dp_overlap",
                "fused_attention",
            )
        }
        knobs["_blank"] = tuple(k for k in SEARCHABLE if k in row.index and knobs[k] is None)
        out.append(
            RowConfig(
                model=_model_of(row, where, models), hardware=hws[hw_name], knobs=knobs, where=where
            )
        )
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


def row_strategy(rc: RowConfig, **fill: Any) -> Strategy:
    """The validated strategy of a row, with ``fill`` overriding knobs (the values a search tries).

    Raises:
      AisimError: naming the row and the knob (``tp·pp`` not dividing the world size, ...).
    """
    k = {key: v for key, v in rc.knobs.items() if key != "_blank"}
    k.update(fill)
    spec = rc.model.spec
    is_tf = spec.kind == "transformer"
    tp = int(k["tp"] or 1)
    pp = int(k["pp"] or 1)
    num_gpus = k["num_gpus"]
    dp = k["dp"]
    if num_gpus is None:
        num_gpus = int(dp or 1) * tp * pp
    if dp is not None and int(dp) * tp * pp != int(num_gpus):
        dp = None  # derived from a search's tp/pp; strategy_from_knobs checks the division
    k.update(tp=tp, pp=pp, dp=dp, num_gpus=num_gpus)
    if k["dp"] is None and int(num_gpus) % (tp * pp) == 0:
        k["dp"] = int(num_gpus) // (tp * pp)
    mbs = k["micro_batch_size"] if k["micro_batch_size"] is not None else default_micro_batch(k)
    gpn = (
        k["gpus_per_node"]
        if k["gpus_per_node"] is not None
        else int(rc.hardware.spec.gpus_per_node)
    )
    interleave = int(k["interleave"] or 1)
    schedule = k["schedule"]
    if schedule is None:
        schedule = "interleaved" if interleave > 1 else "1f1b"
    nmb = k["num_microbatches"] if fill.get("micro_batch_size") is None else None
    return strategy_from_knobs(
        num_layers=int(spec.num_layers),
        num_heads=int(spec.num_heads) if is_tf else int(spec.hidden_size),
        num_kv_heads=int(spec.num_kv_heads) if is_tf else int(spec.hidden_size),
        num_gpus=int(num_gpus),
        tp=tp,
        pp=pp,
        dp=None if k["dp"] is None else int(k["dp"]),
        global_batch=None if k["global_batch_size"] is None else int(k["global_batch_size"]),
        micro_batch_size=int(mbs),
        num_microbatches=None if nmb is None else int(nmb),
        schedule=str(schedule).lower() if not isinstance(schedule, int) else SCHEDULES[schedule],
        interleave=interleave,
        zero_stage=int(k["zero_stage"] or 0),
        recompute=str(k["recompute"] or "none"),
        sequence_parallel=bool(k["sequence_parallel"] or False),
        dtype=str(k["dtype"] or "bf16"),
        dp_overlap=True if k["dp_overlap"] is None else bool(k["dp_overlap"]),
        fused_attention=bool(k["fused_attention"] or False),
        gpus_per_node=int(gpn),
        where=rc.where,
        names={
            "tp": "tp",
            "pp": "pp",
            "num_gpus": "num_gpus",
            "global_batch": "global_batch_size",
            "micro_batch_size": "micro_batch_size",
            "interleave": "interleave",
            "dp": "dp",
            "num_microbatches": "num_microbatches",
            "zero_stage": "zero_stage",
        },
    )


def _stack(trees: list) -> Any:
    return jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x, jnp.float32) for x in xs]), *trees)


def build_batch(rows: list[RowConfig], strategies: list[Strategy] | None = None) -> RowBatch:
    """Stacks rows by (hardware, model kind); ``strategies`` default to :func:`row_strategy`."""
    if strategies is None:
        strategies = [row_strategy(rc) for rc in rows]
    keys: dict[tuple[str, str], list[int]] = {}
    for i, rc in enumerate(rows):
        keys.setdefault((rc.hardware.name, rc.model.spec.kind), []).append(i)
    groups = []
    order = np.zeros(len(rows), np.int64)
    pos = 0
    for (_, _kind), idx in keys.items():
        groups.append(
            RowGroup(
                model=_stack([rows[i].model.spec for i in idx]),
                hw=rows[idx[0]].hardware.spec,
                strategy=_stack([strategies[i] for i in idx]),
            )
        )
        for i in idx:
            order[i] = pos
            pos += 1
    return RowBatch(groups=tuple(groups), order=order, strategies=tuple(strategies))


def _group_times(groups: tuple[RowGroup, ...], order: jax.Array, c: Constants) -> jax.Array:
    times = [
        jax.vmap(step_time, in_axes=(0, None, None, 0))(g.model, g.hw, c, g.strategy).step_time_s
        for g in groups
    ]
    return jnp.concatenate(times)[order]


_group_times_jit = jax.jit(_group_times)


def predicted_step_time_s(batch: RowBatch, c: Constants) -> jax.Array:
    """Predicted seconds per step of every row, in row order (one jitted vmap per group)."""
    return _group_times_jit(batch.groups, jnp.asarray(batch.order), c)


def objective(
    raw: dict[str, jax.Array],
    param: Parameterization,
    groups: tuple[RowGroup, ...],
    order: jax.Array,
    log_measured_s: jax.Array,
    weights: jax.Array,
    prior_weight: float = PRIOR_WEIGHT,
    delta: float = HUBER_DELTA,
) -> jax.Array:
    """The weighted Huber loss on log(predicted / measured) plus the prior (pure; jittable).

    Args:
      raw: the free entries' raw values (see :class:`Parameterization`).
      param: maps raw values to constants; its :meth:`~Parameterization.init` is the prior's centre.
      groups, order: the rows (``RowBatch.groups`` and ``RowBatch.order``).
      log_measured_s: ``log`` of the measured seconds per step, shape ``(n,)``.
      weights: per-row weight, shape ``(n,)`` (0 leaves a row out).
    """
    pred = _group_times(groups, order, param.constants(raw))
    r = jnp.log(pred) - log_measured_s
    per_row = optax.losses.huber_loss(r, jnp.zeros_like(r), delta=delta)
    data = jnp.sum(weights * per_row) / jnp.maximum(jnp.sum(weights), 1.0)
    centre = param.init()
    prior = sum(jnp.sum((raw[k] - centre[k]) ** 2) for k in raw)
    return data + prior_weight * prior


def measured_or_fail(df: pd.DataFrame) -> np.ndarray:
    """The measured step times of the rows that have one (raises when no row has one)."""
    if "has_measurement" not in df.columns or not df["has_measurement"].any():
        raise AisimError(
            "no row has a measured step time or throughput: nothing to fit "
            "(rows without one are for `aisim calibrate predict`)"
        )
    t = df["measured_step_time_s"].to_numpy(float)
    bad = ~np.isfinite(t) | (t <= 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise bad_value(
            _where(df.iloc[i], i), "measured_step_time_s", t[i], "a positive number of seconds"
        )
    return t
