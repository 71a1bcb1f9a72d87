"""Prediction intervals: a calibrated profile's uncertainty, propagated to every prediction.

Contract: a fit (:func:`calibration.fit`) leaves a :class:`ConstantsCovariance`: the covariance
``Σ`` of its fitted constants (entries ``field`` or ``field.tier`` of
:class:`~perfmodel.specs.constants.Constants`, SI units) and the residual variance ``σ²`` of its
log step times (``dof`` = rows − free constants). A prediction's interval for a *new*
measurement is, in log space (the fit is on log step time), by linearisation:

    var(log t) = g Σ gᵀ + σ²,    g = ∂ log t / ∂ x   (``jax.jacfwd`` through the step function)
    log t ± q · sqrt(var),       q = Student-t quantile of ``(1 + level) / 2`` with ``dof``

The parameter part ``g Σ gᵀ`` is the constants' uncertainty, ``σ²`` the scatter of one run
around the model. Throughput, tokens per second, MFU and time to train are monotone in the step
time: their gradients come from the same ``jacfwd``, and their bounds are the exponentials of the
same kind of interval. Nothing here imports ``calibration``: the covariance comes in as data.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from perfmodel.search.evaluate import fast_jit, padded_to_power_of_two, stack_rows
from perfmodel.specs.constants import TIER_KEYS, Constants
from perfmodel.step.step_time import step_time
from simbase.errors import bad_value

DEFAULT_LEVEL = 0.9
# the predictions that get an interval: StepBreakdown fields (all positive); the rates are
# (a constant of the model and strategy) / step time, so their log gradient is minus its
INTERVAL_KEYS = ("step_time_s", "tokens_per_s", "throughput_samples_per_s", "mfu")
RATE_KEYS = INTERVAL_KEYS[1:]


@dataclasses.dataclass(frozen=True)
class ConstantsCovariance:
    """The uncertainty of a calibrated profile.

    Attributes:
      entries: the covaried constants, ``field`` or ``field.tier`` (``link_latency_s.inter_node``).
      covariance: ``(p, p)`` covariance of their values in SI units.
      residual_variance: ``σ²`` of log(measured / predicted) step time over the fitted rows.
      dof: residual degrees of freedom (fitted rows − free constants), for the t quantile.
    """

    entries: tuple[str, ...]
    covariance: np.ndarray
    residual_variance: float
    dof: int

    def to_dict(self) -> dict[str, Any]:
        """The profile's ``covariance`` block."""
        return {
            "entries": list(self.entries),
            "matrix": np.asarray(self.covariance, float).tolist(),
            "residual_variance_log": float(self.residual_variance),
            "dof": int(self.dof),
        }


def covariance_from_dict(doc: Any, where: str = "profile") -> ConstantsCovariance:
    """Validates a profile's ``covariance`` block (see :meth:`ConstantsCovariance.to_dict`).

    Raises:
      AisimError: a field that is missing or malformed (``source`` ``where``).
    """
    if not isinstance(doc, dict):
        raise bad_value(where, "covariance", doc, "an object with entries and matrix")
    entries = doc.get("entries")
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise bad_value(where, "covariance.entries", entries, "a list of constant names")
    for e in entries:
        field, _, tier = e.partition(".")
        if field not in Constants.__dataclass_fields__ or (tier and tier not in TIER_KEYS):
            raise bad_value(where, "covariance.entries", e, "a constant name (field or field.tier)")
    p = len(entries)
    try:
        mat = np.asarray(doc.get("matrix"), float)
    except (TypeError, ValueError):
        mat = np.zeros((0,))
    if mat.shape != (p, p) or not np.all(np.isfinite(mat)):
        raise bad_value(where, "covariance.matrix", doc.get("matrix"), f"a {p}x{p} finite matrix")
    var = doc.get("residual_variance_log")
    dof = doc.get("dof")
    if isinstance(var, bool) or not isinstance(var, int | float) or not var >= 0:
        raise bad_value(where, "covariance.residual_variance_log", var, "a number >= 0")
    if isinstance(dof, bool) or not isinstance(dof, int) or dof < 1:
        raise bad_value(where, "covariance.dof", dof, "a positive integer")
    return ConstantsCovariance(tuple(entries), 0.5 * (mat + mat.T), float(var), int(dof))


def _split(entry: str) -> tuple[str, int | None]:
    field, _, tier = entry.partition(".")
    return field, (TIER_KEYS.index(tier) if tier else None)


def entry_values(c: Constants, entries: tuple[str, ...]) -> Float[Array, " p"]:
    """The values of ``entries`` in ``c`` (SI units)."""
    vals = []
    for e in entries:
        field, tier = _split(e)
        v = jnp.asarray(getattr(c, field), jnp.float32)
        vals.append(v if tier is None else v[tier])
    return jnp.stack(vals) if vals else jnp.zeros((0,), jnp.float32)


def with_entries(c: Constants, entries: tuple[str, ...], x: Float[Array, " p"]) -> Constants:
    """``c`` with ``entries`` set to ``x`` (differentiable in ``x``)."""
    values = {f: jnp.asarray(getattr(c, f), jnp.float32) for f in Constants.__dataclass_fields__}
    for i, e in enumerate(entries):
        field, tier = _split(e)
        values[field] = x[i] if tier is None else values[field].at[tier].set(x[i])
    return Constants(**values)


def _log_gradient_and_step(m, hw, c: Constants, s, entries: tuple[str, ...], step_fn):
    """(``∂ log t / ∂ x``, the step's breakdown) of one strategy, from one forward-mode pass."""
    x0 = entry_values(c, entries)

    def log_t(x):
        out = step_fn(m, hw, with_entries(c, entries, x), s)
        return jnp.log(out.step_time_s), out

    return jax.jacfwd(log_t, has_aux=True)(x0)


@functools.partial(jax.jit, static_argnames=("entries", "step_fn"))
def log_step_gradient(m, hw, c: Constants, s, entries: tuple[str, ...], step_fn=step_time):
    """``∂ log t / ∂ x``: the log step time's gradient with respect to the covaried constants
    ``x`` (forward mode, ``jax.jacfwd``, through the cost model's step function).

    Returns:
      shape ``(p,)``, in the order of ``entries``.
    """
    return _log_gradient_and_step(m, hw, c, s, entries, step_fn)[0]


def _batched_gradients(m, hw, c, s, entries, step_fn):
    return jax.vmap(lambda one: _log_gradient_and_step(m, hw, c, one, entries, step_fn))(s)


# a short program over a few rows: compiled for a fast start (perfmodel.search.evaluate)
_gradients = fast_jit(_batched_gradients, static_argnames=("entries", "step_fn"))


def t_quantile(level: float, dof: int) -> float:
    """The two-sided Student-t factor of a ``level`` interval with ``dof`` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.5 * (1.0 + level), dof))


@dataclasses.dataclass(frozen=True)
class Interval:
    """A prediction and its interval for a new measurement.

    Attributes:
      value, lo, hi: the prediction and its bounds (same units).
      level: the interval's probability (0.9).
      sd_log: the total standard deviation in log space; ``param_sd_log`` its parameter part.
    """

    value: float
    lo: float
    hi: float
    level: float
    sd_log: float
    param_sd_log: float


def log_interval(
    value: float, grad: np.ndarray, cov: ConstantsCovariance, level: float = DEFAULT_LEVEL
) -> Interval:
    """The interval of a positive prediction ``value`` whose log has gradient ``grad`` (shape
    ``(p,)``, in the order of ``cov.entries``)."""
    if not 0 < level < 1:
        raise bad_value(None, "level", level, "a probability in (0, 1)")
    g = np.asarray(grad, np.float64)
    param_var = float(max(g @ np.asarray(cov.covariance, np.float64) @ g, 0.0))
    sd = math.sqrt(param_var + cov.residual_variance)
    q = t_quantile(level, cov.dof)
    return Interval(
        value=float(value),
        lo=float(value) * math.exp(-q * sd),
        hi=float(value) * math.exp(q * sd),
        level=level,
        sd_log=sd,
        param_sd_log=math.sqrt(param_var),
    )


def prediction_intervals(
    m, hw, c: Constants, s, cov: ConstantsCovariance, *, level=DEFAULT_LEVEL, step_fn=step_time
) -> dict[str, Interval]:
    """The interval of each prediction in :data:`INTERVAL_KEYS` of one strategy.

    Args:
      m: the model spec.
      hw: the hardware spec.
      c: the profile's constants.
      s: one strategy.
      cov: the profile's :class:`ConstantsCovariance`.
      level: the interval's probability.
      step_fn: the cost model's one-strategy step function.

    Returns:
      ``{key: Interval}``.
    """
    return strategies_intervals(m, hw, c, [s], cov, level=level, step_fn=step_fn)[0]


def strategies_intervals(
    m, hw, c: Constants, strategies: list, cov: ConstantsCovariance, *, level=DEFAULT_LEVEL,
    step_fn=step_time,
) -> list[dict[str, Interval]]:  # fmt: skip
    """:func:`prediction_intervals` of several strategies of one stack and scope (one static
    structure) in one compiled program, padded to a power of two rows so that the program
    serves any similar number of rows."""
    rows = padded_to_power_of_two(list(strategies))
    grads, outs = _gradients(m, hw, c, stack_rows(rows), tuple(cov.entries), step_fn=step_fn)
    grads, outs = np.asarray(grads), jax.tree.map(np.asarray, outs)
    results = []
    for i in range(len(strategies)):
        g = grads[i]
        if not np.all(np.isfinite(g)):
            results.append({})
            continue
        t = log_interval(float(outs.step_time_s[i]), g, cov, level)
        result = {"step_time_s": t}
        for k in RATE_KEYS:
            v = float(getattr(outs, k)[i])
            result[k] = dataclasses.replace(
                t, value=v, lo=v * t.value / t.hi, hi=v * t.value / t.lo
            )
        results.append(result)
    return results


def interval_fields(intervals: dict[str, Interval]) -> dict[str, Any]:
    """``{key_lo, key_hi}`` for each prediction, plus ``interval_level`` and
    ``step_time_sd_log`` (the JSON fields of an estimate)."""
    doc: dict[str, Any] = {}
    if not intervals:
        return doc
    for k, iv in intervals.items():
        doc[f"{k}_lo"], doc[f"{k}_hi"] = iv.lo, iv.hi
    st = intervals["step_time_s"]
    doc["interval_level"] = st.level
    doc["step_time_sd_log"] = st.sd_log
    doc["step_time_param_sd_log"] = st.param_sd_log
    return doc
