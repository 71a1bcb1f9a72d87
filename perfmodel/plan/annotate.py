"""What a planning question adds to a result document: intervals, the plan, the sensitivity.

Contract: each function takes a result document (an estimate's or a sweep row's dict, as
``--json`` prints it) and adds fields to it in place: :func:`add_intervals` the prediction
intervals of a profile's covariance (:mod:`perfmodel.plan.uncertainty`), :func:`add_plan` the
time, cost and energy to train (:mod:`perfmodel.plan.training`), with their bounds when the
document carries intervals, :func:`annotate_sweep` both for every strategy a sweep reports. A
calibrated profile comes in as ``constants_for(hardware)`` and ``covariance``; nothing here
reads a file or prints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from perfmodel.plan.estimate import Estimate
from perfmodel.plan.reliability import train_days_bounds
from perfmodel.plan.training import PLAN_KEYS, plan_for, reported_rows, with_price
from perfmodel.plan.uncertainty import (
    DEFAULT_LEVEL,
    ConstantsCovariance,
    interval_fields,
    prediction_intervals,
    strategies_intervals,
)
from perfmodel.search.sweep import SweepResult, search_of
from perfmodel.specs.constants import Constants
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.strategy import strategy_from_row
from perfmodel.step.cost_models import select_step_fn
from simbase.io import significant


def add_intervals(
    doc: dict[str, Any], est: Estimate, constants: Constants, cov: ConstantsCovariance | None
) -> None:
    """The estimate's prediction intervals (``step_time_s_lo`` ...), when ``cov`` is given."""
    if cov is None:
        return
    intervals = prediction_intervals(
        est.model.spec,
        est.hardware.spec,
        constants,
        est.strategy,
        cov,
        step_fn=select_step_fn(est.cost_model),
    )
    doc.update(interval_fields(intervals))


def add_plan(
    doc: dict[str, Any],
    hw: Hardware,
    tokens: float,
    *,
    utilisation_factor: float | None = None,
    pue: float | None = None,
    failures=None,
    dof: int | None = None,
) -> None:
    """The plan's fields (:func:`perfmodel.plan.training.plan_for`, with ``failures``: a
    failure model or a function of the hardware that makes one) and the bounds of each plan
    quantity (``train_days_lo`` ...): with failures, the interval of both the step time's
    spread (``step_time_sd_log``, when the document has intervals) and the failure process's
    (:func:`perfmodel.plan.reliability.train_days_bounds`, ``dof`` the constants' degrees of
    freedom); without, from ``tokens_per_s_lo``/``_hi`` (the plan scales as 1/tokens_per_s).
    The document holds each of them to 7 significant digits (:func:`simbase.io.significant`)."""
    plan = plan_for(
        doc, hw, tokens, utilisation_factor=utilisation_factor, pue=pue, failures=failures
    ).to_dict()
    doc.update(significant(plan))
    if plan.get("failures") is not None:
        level = doc.get("interval_level", DEFAULT_LEVEL)
        lo, hi = train_days_bounds(
            plan["train_days"],
            step_sd_log=doc.get("step_time_sd_log") or 0.0,
            failure_sd_log=plan["failures"]["failure_sd_log"],
            level=level,
            dof=dof,
        )
        doc["interval_level"] = level
        lo_f, hi_f = lo / plan["train_days"], hi / plan["train_days"]
    elif doc.get("tokens_per_s_lo") and doc.get("tokens_per_s_hi"):
        lo_f = doc["tokens_per_s"] / doc["tokens_per_s_hi"]
        hi_f = doc["tokens_per_s"] / doc["tokens_per_s_lo"]
    else:
        return
    for k in PLAN_KEYS:
        if plan[k] is not None:
            doc[f"{k}_lo"], doc[f"{k}_hi"] = significant((plan[k] * lo_f, plan[k] * hi_f))


def annotate_sweep(
    result: SweepResult,
    cost_model: str,
    *,
    constants_for: Callable[..., Constants],
    cov_for: Callable[..., ConstantsCovariance | None],
    tokens: float | None = None,
    price_per_gpu_hour_usd: float | None = None,
    utilisation_factor: float | None = None,
    pue: float | None = None,
    failures=None,
) -> None:
    """Adds the prediction intervals (where ``cov_for`` gives a hardware's covariance) and
    their plan bounds (with ``tokens``) to every strategy a sweep reports. With several stacks,
    ``constants_for`` and ``cov_for`` also get the row's stack."""
    several = result.several_stacks
    step_fn = select_step_fn(cost_model)
    # the rows of one pair whose stacks share a program (StrategyGrid.program_of) get their
    # intervals from one compiled program
    groups: dict[tuple, list] = {}
    for row in reported_rows(result):
        pair = search_of(result, row)
        s = strategy_from_row(row)
        s = dataclasses.replace(s, stack=pair.result.grid.program_of(s.stack))
        groups.setdefault((id(pair), s.stack, s.scope), []).append((pair, row, s))
    for members in groups.values():
        pair = members[0][0]
        hw = with_price(pair.hardware, price_per_gpu_hour_usd)
        under = (pair.stack,) if several else ()
        cov = cov_for(hw, *under)
        if cov is None:
            continue
        consts = constants_for(hw, *under)
        strategies = [s for _, _, s in members]
        each = strategies_intervals(
            pair.model.spec, hw.spec, consts, strategies, cov, step_fn=step_fn
        )
        for (_, row, _), intervals in zip(members, each, strict=True):
            row.update(interval_fields(intervals))
            if tokens is not None:
                add_plan(
                    row, hw, tokens, utilisation_factor=utilisation_factor, pue=pue,
                    failures=failures, dof=cov.dof,
                )  # fmt: skip
