"""The planning options of `aisim perf estimate` and `aisim perf grid` (time, cost and energy to
train; prediction intervals), and the lines that print them.

A thin shell over :mod:`perfmodel.planning` and :mod:`perfmodel.uncertainty`: the options are
declared once here and shared by both commands; errors are the libraries' (fields
``tokens``, ``price_per_gpu_hour_usd``, ``utilisation_factor``, ``pue``), which
:data:`PLAN_FLAGS` maps to these options.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer

from aisim.common import resolve_constants
from aisim.console import console
from calibration.profile import load_profile_covariance
from perfmodel import Estimate, Hardware, resolve_hardware, select_step_fn
from perfmodel.planning import (
    DEFAULT_PUE,
    DEFAULT_UTILISATION,
    PLAN_KEYS,
    check_plan_options,
    parse_tokens,
    plan_for,
    reported_rows,
    with_price,
)
from perfmodel.sweep import SweepResult
from perfmodel.uncertainty import interval_fields, prediction_intervals, row_intervals
from simbase.units import format_count

TokensOpt = Annotated[
    str | None,
    typer.Option(
        "--tokens",
        help="Tokens to train on, e.g. 15T or 300B: adds days, GPU-hours, dollars and MWh.",
    ),
]
PriceOpt = Annotated[
    float | None,
    typer.Option(
        "--price-per-gpu-hour",
        help="USD per GPU-hour for the cost (default: the hardware preset's price).",
    ),
]
UtilisationOpt = Annotated[
    float | None,
    typer.Option(
        "--utilisation",
        help=f"Average power draw as a fraction of the board power (default {DEFAULT_UTILISATION}).",
    ),
]
PueOpt = Annotated[
    float | None,
    typer.Option(
        "--pue", help=f"The facility's power usage effectiveness (default {DEFAULT_PUE})."
    ),
]

# library field -> option, where the option is not --<name-with-dashes>
PLAN_FLAGS = {
    "price_per_gpu_hour_usd": "--price-per-gpu-hour",
    "utilisation_factor": "--utilisation",
}


@dataclasses.dataclass
class PlanOptions:
    """The planning options of one command, validated (a bad value raises at construction)."""

    tokens: str | None = None
    price_per_gpu_hour_usd: float | None = None
    utilisation_factor: float | None = None
    pue: float | None = None
    profile: Path | None = None

    def __post_init__(self) -> None:
        check_plan_options(self.price_per_gpu_hour_usd, self.utilisation_factor, self.pue)
        self.token_count = None if self.tokens is None else parse_tokens(self.tokens)

    def hardware(self, hardware: str | None, hardware_file: Path | None) -> Hardware:
        """The hardware with ``--price-per-gpu-hour`` as its price."""
        return with_price(resolve_hardware(hardware, hardware_file), self.price_per_gpu_hour_usd)

    def annotate(self, doc: dict[str, Any], est: Estimate) -> None:
        """Adds the prediction intervals (with a ``--profile`` that carries a covariance) and
        the plan (with ``--tokens``) to an estimate's document."""
        cov = None if self.profile is None else load_profile_covariance(self.profile)
        if cov is not None:
            intervals = prediction_intervals(
                est.model.spec,
                est.hardware.spec,
                resolve_constants(est.hardware, self.profile),
                est.strategy,
                cov,
                step_fn=select_step_fn(est.cost_model),
            )
            doc.update(interval_fields(intervals))
        if self.token_count is not None:
            add_plan(doc, est.hardware, self)


def annotate_sweep(options: PlanOptions, result: SweepResult, cost_model: str) -> None:
    """Adds the prediction intervals of a profile with a covariance (``--profile``) to every
    strategy a sweep reports, and the bounds of their plans (``--tokens``)."""
    cov = None if options.profile is None else load_profile_covariance(options.profile)
    if cov is None:
        return
    pairs = {(p.model.name, p.hardware.name): p for p in result.searches}
    step_fn = select_step_fn(cost_model)
    for row in reported_rows(result):
        pair = pairs[(row["model"], row["hardware"])]
        hw = with_price(pair.hardware, options.price_per_gpu_hour_usd)
        consts = resolve_constants(hw, options.profile)
        intervals = row_intervals(pair.model.spec, hw.spec, consts, row, cov, step_fn=step_fn)
        row.update(interval_fields(intervals))
        if options.token_count is not None:
            add_plan(row, hw, options)


def add_plan(doc: dict[str, Any], hw: Hardware, options: PlanOptions) -> None:
    """Adds the plan's fields to a result document; with ``tokens_per_s_lo``/``_hi`` in it,
    also the bounds of each plan quantity (``train_days_lo`` ...), which scale as 1/tokens_per_s."""
    plan = plan_for(
        doc,
        hw,
        options.token_count,
        utilisation_factor=options.utilisation_factor,
        pue=options.pue,
    ).to_dict()
    doc.update(plan)
    lo_rate, hi_rate = doc.get("tokens_per_s_lo"), doc.get("tokens_per_s_hi")
    if lo_rate and hi_rate:
        rate = doc["tokens_per_s"]
        for k in PLAN_KEYS:
            if plan[k] is not None:
                doc[f"{k}_lo"] = plan[k] * rate / hi_rate
                doc[f"{k}_hi"] = plan[k] * rate / lo_rate


def money(v: float | None) -> str:
    """Dollars in a few characters (``$65M``); unknown says why."""
    if v is None:
        return "unknown cost (no price: pass --price-per-gpu-hour)"
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"${v / scale:.3g}{suffix}"
    return f"${v:.3g}"


def _energy(v: float | None) -> str:
    if v is None:
        return "unknown energy (no board power for this hardware)"
    return f"{v / 1000:.3g} GWh" if v >= 1000 else f"{v:.3g} MWh"


def _num(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def _days(doc: dict, key: str = "train_days") -> str:
    d = doc[key]
    lo, hi = doc.get(f"{key}_lo"), doc.get(f"{key}_hi")
    text = f"{_num(d)} days" if d >= 1 else f"{24 * d:.3g} hours"
    if lo is not None and hi is not None:
        text += f" ({_num(lo)}-{_num(hi)} days, {doc.get('interval_level', 0.9):.0%})"
    return text


def plan_line(doc: dict) -> str:
    """One line: the time, GPU-hours, cost and energy to train of a result document."""
    return (
        f"to train {format_count(doc['tokens'])} tokens: {_days(doc)}, "
        f"{format_count(doc['gpu_hours'])} GPU-hours, "
        f"{money(doc['cost_usd'])}, {_energy(doc['energy_mwh'])} "
        f"(utilisation {doc['utilisation_factor']:g}, PUE {doc['pue']:g})"
    )


def interval_line(doc: dict) -> str:
    """``step time 18.2 s ± 0.6 s (90%: 17.6-18.8 s)``: ± is half the interval's width (the
    interval is symmetric in log space; ``--json`` has its exact bounds)."""
    t, lo, hi = doc["step_time_s"], doc["step_time_s_lo"], doc["step_time_s_hi"]
    level = f"{doc['interval_level']:.0%}"
    return (
        f"step time {t:.3g} s ± {(hi - lo) / 2:.2g} s ({level}: {lo:.3g}-{hi:.3g} s); "
        f"tokens/s {doc['tokens_per_s']:.4g} ({doc['tokens_per_s_lo']:.4g}-"
        f"{doc['tokens_per_s_hi']:.4g}); MFU {100 * doc['mfu']:.1f}% "
        f"({100 * doc['mfu_lo']:.1f}-{100 * doc['mfu_hi']:.1f}%)"
    )


def print_plan(doc: dict) -> None:
    """Prints the interval line and :func:`plan_line` when the document carries them."""
    if doc.get("step_time_s_lo") is not None:
        console.print(interval_line(doc), highlight=False)
    if doc.get("train_days") is not None:
        console.print(plan_line(doc), highlight=False)
