"""The constants a software stack runs with on a hardware preset, and how sure they are.

Contract: a stack preset's ``constants`` block (written by :mod:`calibration.stacks`) holds, per
hardware preset, the entries fitted to the published runs of that stack on that hardware, with
their covariance and the error measured by leaving each published source out::

    "constants": {
      "h100-sxm": {"status": "fitted", "values": {<entry>: SI value},
                   "covariance": {...}, "runs": 50, "sources": ["dgxc-2411", ...],
                   "error_pct": {"uncalibrated": ..., "leave_one_row_out": ...,
                                 "leave_one_source_out": ...}},
      "carried_over": {"residual_variance_log": ..., "measured_by": "..."}
    }

:func:`stack_constants` gives every hardware preset its constants:

- **fitted**: the hardware preset's constants with the fitted entries over them; the interval
  adds the constants' covariance to the *between-source* scatter (the leave-one-source-out log
  residuals), so that it holds for a run of another cluster or year, not only for the source's
  own rows;
- **carried over** (no published run of the stack on this hardware): the hardware preset's
  device efficiencies with the stack's host-side costs (:data:`HOST_ENTRIES`, the geometric
  mean of its fits elsewhere): the host loop and launches are the software's, the GEMM and
  attention efficiencies the device's. The interval is the wider scatter measured by
  predicting each fitted hardware of the stack this way (``carried_over``);
- **preset**: a stack without any fit, or no stack: the hardware preset's own constants and no
  interval.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from perfmodel.plan.uncertainty import ConstantsCovariance, covariance_from_dict
from perfmodel.specs.constants import TIER_KEYS, Constants, constants_from_si_dict
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.stack_preset import CARRIED, StackPreset, load_stack, stack_names
from simbase.errors import bad_value

# what a stack carries to hardware it has no runs on: the costs of its host loop and launches,
# which are the software's (the GEMM and attention efficiencies are the device's: a stack's fit
# on one GPU generation moved another's predictions further from the measurements than the
# hardware preset's values, when whole sources were left out; docs/validation.md)
HOST_ENTRIES = ("kernel_overhead_s", "step_overhead_s", "moe_layer_overhead_s")
# the constants that are fractions in (0, 1): shifted in logit space (the rest in log space)
FRACTION_FIELDS = (
    "matmul_efficiency_max", "memory_efficiency_max", "link_bandwidth_efficiency",
    "dp_overlap_fraction", "fp8_matmul_efficiency_ratio", "attention_efficiency_ratio",
    "tp_overlap_fraction", "fp8_block_scaled_gemm_ratio", "fp4_matmul_efficiency_ratio",
)  # fmt: skip


# a host cost (per kernel, microbatch, layer or step) or a latency past a minute is a typo
MAX_SECONDS = 60.0
# any other constant (FLOPs or bytes of a half-efficiency size, a factor) past this is one too
MAX_OTHER = 1e15


def check_constant(where: str, field: str, entry: str, value: Any) -> float:
    """``value`` as a float when it is a value the constant ``entry`` (``name`` or
    ``name.tier``; the file's ``field``) can have: a fraction in
    (0, 1] for an efficiency or overlap, seconds up to :data:`MAX_SECONDS` for a ``..._s``
    cost, otherwise a number from 0 to :data:`MAX_OTHER`; else one error naming ``field``.
    Profiles and stack files are checked with it when they are read."""
    name = entry.partition(".")[0]
    fraction = name in FRACTION_FIELDS
    if fraction:
        hi, expected = 1.0, "a fraction in (0, 1]"
    elif name.endswith("_s"):
        hi, expected = MAX_SECONDS, f"seconds from 0 to {MAX_SECONDS:g}"
    else:
        hi, expected = MAX_OTHER, f"a number from 0 to {MAX_OTHER:g}"
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (number and (0 < value <= hi if fraction else 0 <= value <= hi)):
        raise bad_value(where, field, value, expected)  # NaN and inf fail the comparisons too
    return float(value)


@dataclasses.dataclass(frozen=True)
class StackConstants:
    """The constants of one stack on one hardware preset.

    Attributes:
      constants: what the step model reads.
      covariance: their uncertainty for prediction intervals (``None``: no interval).
      status: ``fitted``, ``carried over`` or ``preset``.
      reason: one sentence a report prints: where the constants come from.
    """

    constants: Constants
    covariance: ConstantsCovariance | None
    status: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """The ``constants`` block of a JSON report."""
        return {"status": self.status, "reason": self.reason}


def _inverse(field: str, y: float) -> float:
    if field in FRACTION_FIELDS:
        return 1.0 / (1.0 + math.exp(-y))
    return math.exp(y)


def _entry(c: Constants, entry: str) -> float:
    field, _, tier = entry.partition(".")
    v = np.asarray(getattr(c, field), float)
    return float(v if not tier else v[_tier_index(tier)])


def _tier_index(tier: str) -> int:
    return TIER_KEYS.index(tier)


def _set(values: dict[str, Any], base: Constants, entry: str, x: float) -> None:
    field, _, tier = entry.partition(".")
    if not tier:
        values[field] = x
        return
    cur = values.get(field, np.asarray(getattr(base, field), float).tolist())
    cur[_tier_index(tier)] = x
    values[field] = cur


def _describe_fit(name: str, hw: str, entry: dict) -> str:
    err = entry.get("error_pct", {}).get("leave_one_source_out")
    sources = entry.get("sources") or []
    held = f"; {err:.1f}% mean error on a source left out" if err is not None else ""
    return (
        f"{name} on {hw}: fitted to {entry.get('runs', '?')} published runs of "
        f"{len(sources)} source{'s' if len(sources) != 1 else ''}{held}"
    )


def shipped_fits() -> dict[str, dict[str, dict[str, float]]]:
    """Every shipped stack's fitted entries: stack name -> hardware -> entry -> SI value."""
    if not _SHIPPED:
        for name in stack_names():
            if "@" in name:
                continue
            preset = load_stack(name)
            _SHIPPED[name] = {
                hw: e.get("values", {}) for hw, e in preset.fitted_constants().items()
            }
    return _SHIPPED


_SHIPPED: dict[str, dict[str, dict[str, float]]] = {}


def stack_constants(
    preset: StackPreset | None, hw: Hardware, fits: dict | None = None
) -> StackConstants:
    """The constants of ``preset`` on ``hw`` (module docstring), fitted, carried over or the
    hardware preset's own.

    Args:
      preset: the stack (``None``: the hardware preset's constants).
      hw: the hardware.
      fits: every stack's fitted entries (:func:`shipped_fits`' form) that a carry-over may
        use; default the shipped ones, with ``preset``'s own.

    Raises:
      AisimError: a malformed constants block (naming the stack file and the entry).
    """
    if preset is None or not isinstance(preset, StackPreset):
        return StackConstants(hw.constants, None, "preset", f"the {hw.name} preset's constants")
    own = preset.fitted_constants()
    name = preset.name.partition("@")[0]
    where = preset.where
    if hw.name in own:
        entry = own[hw.name]
        values = entry.get("values")
        if not isinstance(values, dict):
            raise bad_value(where, f"constants.{hw.name}.values", values, "an object of SI values")
        base = hw.constants
        si: dict[str, Any] = {}
        for k, v in values.items():
            _set(si, base, k, check_constant(where, f"constants.{hw.name}.values.{k}", k, v))
        cov = entry.get("covariance")
        cov = None if cov is None else covariance_from_dict(cov, where)
        return StackConstants(
            constants_from_si_dict(si, base), cov, "fitted",
            _describe_fit(preset.name, hw.name, entry),
        )  # fmt: skip
    fits = dict(shipped_fits() if fits is None else fits)
    fits[name] = fits.get(name, {}) | {k: e.get("values", {}) for k, e in own.items()}
    carried = _carried(name, fits, hw)
    if carried is None:
        return StackConstants(
            hw.constants, None, "preset",
            f"the {hw.name} preset's constants (no published run to fit or carry over)",
        )  # fmt: skip
    si, others, shifted = carried
    var = (preset.constants.get(CARRIED) or {}).get("residual_variance_log")
    cov = None
    if var is not None:
        dof = int((preset.constants.get(CARRIED) or {}).get("dof", 30))
        cov = ConstantsCovariance((), np.zeros((0, 0)), float(var), dof)
    del others
    sd = f"; intervals widened to its {100 * math.sqrt(var):.0f}% scatter" if var else ""
    reason = (
        f"{name} on {hw.name}: no published run to fit; the {hw.name} preset's efficiencies "
        f"with {name}'s host costs fitted on {', '.join(shifted)}{sd}"
    )
    return StackConstants(constants_from_si_dict(si, hw.constants), cov, "carried over", reason)


def _carried(name: str, fits: dict, hw: Hardware):
    """The stack's host-side costs (:data:`HOST_ENTRIES`: the geometric mean of its fits on
    other hardware) over the hardware preset's device efficiencies; None when the stack has no
    fit to carry."""
    own = fits.get(name, {})
    si: dict[str, Any] = {}
    for e in HOST_ENTRIES:
        vals = [float(v[e]) for v in own.values() if e in v]
        if vals:
            _set(si, hw.constants, e, float(np.exp(np.mean(np.log(np.maximum(vals, 1e-30))))))
    if not si:
        return None
    return si, [], sorted(own)
