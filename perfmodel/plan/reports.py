"""The planning questions of one run and of a grid, end to end: ``aisim perf estimate`` and
``aisim perf grid`` as library calls.

Contract: :func:`estimate_document` evaluates one strategy and adds what a planner asked for
(prediction intervals, the plan, the elasticities: :mod:`perfmodel.plan.annotate`) to its JSON
document; :func:`plan_grid` searches every strategy (:func:`perfmodel.plan.training.plan_sweep`)
and annotates what it reports the same way. The constants of each hardware come in as
``calibration_for(hardware)`` (``calibration_for(hardware, stack)`` when a grid has several
stacks), a :class:`~perfmodel.plan.stack_constants.StackConstants` (its constants and
covariance), so a calibrated profile read by the caller serves both. Nothing here reads a file
or prints.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perfmodel.plan.annotate import add_intervals, add_plan, annotate_sweep
from perfmodel.plan.sensitivity import elasticities, estimate_or_best, estimate_row
from perfmodel.plan.stack_constants import StackConstants
from perfmodel.plan.training import plan_sweep
from perfmodel.search.sweep import SweepResult, search_of
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model


def estimate_document(
    model: Model,
    hardware: Hardware,
    calibration: StackConstants,
    knobs: dict[str, Any],
    *,
    cost_model: str = "aisim",
    stack=None,
    tokens: float | None = None,
    failures=None,
    sensitivity: bool = False,
    utilisation_factor: float | None = None,
    pue: float | None = None,
    given: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``aisim perf estimate --json`` document of one strategy.

    Args:
      model: the model.
      hardware: the hardware (its price already the one to plan with).
      calibration: the constants to run with, their covariance and where they come from.
      knobs: the strategy's knobs (:func:`perfmodel.estimate`'s, any registry spelling).
      cost_model: ``aisim`` or ``distir``.
      stack: the software stack (a preset, a :class:`~perfmodel.specs.stack.Stack` or None).
      tokens: tokens to train on; adds the plan (time, GPU-hours, cost and energy to train).
      failures: with ``tokens``, a failure model or a function of the hardware that makes one.
      sensitivity: add the step time's elasticities and what bounds the run.
      utilisation_factor: mean power draw over board power (default: ``planning.json``'s).
      pue: the facility's power usage effectiveness (default: ``planning.json``'s).
      given: the knobs the user gave, when ``knobs`` adds a caller's defaults to them (None:
        every knob is the user's). Where the defaults' layout cannot be this model's on this
        many GPUs (``aisim perf estimate``'s GPT-3 run: tp 8, pp 8) and the user gave no
        layout, the strategy is the fastest feasible one with ``given`` fixed, as
        ``aisim perf grid`` finds it, and ``auto`` names what the search chose.

    Returns:
      :meth:`perfmodel.plan.estimate.Estimate.to_dict` with ``constants`` (status, reason),
      the prediction intervals when the calibration has a covariance, the plan's fields with
      ``tokens``, and ``elasticities``/``bound_by``/``bound_by_text`` with ``sensitivity``.

    Raises:
      AisimError: a bad knob or option (:func:`perfmodel.estimate`'s and the plan's fields).
    """
    consts, cov = calibration.constants, calibration.covariance
    est, _ = estimate_or_best(
        model, hardware, consts, knobs, given, cost_model=cost_model, stack=stack
    )
    doc = est.to_dict()
    doc["constants"] = calibration.to_dict()
    add_intervals(doc, est, consts, cov)
    if tokens is not None:
        dof = None if cov is None else cov.dof
        add_plan(
            doc, hardware, tokens, failures=failures, dof=dof,
            utilisation_factor=utilisation_factor, pue=pue,
        )  # fmt: skip
    if sensitivity:
        doc.update(elasticities(model, hardware, consts, est.strategy, cost_model).to_dict())
    return doc


def plan_grid(
    models: list[Model],
    hardware: list[Hardware],
    *,
    calibration_for: Callable[..., StackConstants],
    cost_model: str = "aisim",
    tokens: float | None = None,
    failures=None,
    sensitivity: bool = False,
    price_per_gpu_hour_usd: float | None = None,
    utilisation_factor: float | None = None,
    pue: float | None = None,
    **sweep_args: Any,
) -> SweepResult:
    """Every strategy of the models on the hardware, ranked, each reported one annotated.

    Args:
      models: the models (:func:`perfmodel.search.sweep` pairs each with every hardware).
      hardware: the hardware, each with its price to plan with.
      calibration_for: the constants of a hardware, with their covariance (with several
        stacks in ``stack``, of a hardware and a stack).
      cost_model: ``aisim`` or ``distir``.
      tokens: tokens to train on; adds each reported strategy's plan.
      failures: with ``tokens``, a failure model or a function of the hardware that makes one.
      sensitivity: add the elasticities of the best strategy to ``result.best``.
      price_per_gpu_hour_usd: replaces each hardware's price (None: the preset's).
      utilisation_factor: mean power draw over board power (default: ``planning.json``'s).
      pue: the facility's power usage effectiveness (default: ``planning.json``'s).
      **sweep_args: :func:`perfmodel.plan.training.plan_sweep`'s other arguments (``rank_by``,
        ``top``, ``num_gpus``, ``global_batch``, ``stack``, knob restrictions ...).

    Returns:
      The :class:`~perfmodel.search.sweep.SweepResult`, its reported rows with prediction
      intervals where the calibration has a covariance (and the plan's bounds with
      ``tokens``).

    Raises:
      AisimError: whatever :func:`~perfmodel.plan.training.plan_sweep` raises.
    """

    def constants_for(hw: Hardware, *stack):
        return calibration_for(hw, *stack).constants

    plan = dict(utilisation_factor=utilisation_factor, pue=pue)
    result = plan_sweep(
        models, hardware, tokens=tokens, price_per_gpu_hour_usd=price_per_gpu_hour_usd,
        constants=constants_for, cost_model=cost_model,
        failures=failures if tokens else None, **plan, **sweep_args,
    )  # fmt: skip
    annotate_sweep(
        result, cost_model, constants_for=constants_for,
        cov_for=lambda hw, *stack: calibration_for(hw, *stack).covariance, tokens=tokens,
        price_per_gpu_hour_usd=price_per_gpu_hour_usd, failures=failures, **plan,
    )  # fmt: skip
    if sensitivity:
        best = result.best
        pair = search_of(result, best)
        consts = constants_for(pair.hardware, *((pair.stack,) if result.several_stacks else ()))
        est = estimate_row(best, pair.model, pair.hardware, consts)
        best.update(
            elasticities(pair.model, pair.hardware, consts, est.strategy, cost_model).to_dict()
        )
    return result
