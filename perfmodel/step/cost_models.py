"""The registry of cost models: name -> one-strategy step function.

Contract: every entry has the signature and result of :func:`perfmodel.step.step_time.step_time`
(``fn(model_spec, hardware_spec, constants, strategy) -> StepBreakdown``; pure, jittable,
vmappable over a :class:`~perfmodel.specs.strategy.Strategy`), so :func:`perfmodel.step.step_time.
evaluate_grid` and the search take any of them as ``step_fn``. This module sits above both
models, so neither imports the other.
"""

from __future__ import annotations

from collections.abc import Callable

from perfmodel.step.breakdown import StepBreakdown
from perfmodel.step.distir import distir_step_time
from perfmodel.step.step_time import step_time
from simbase.errors import bad_value

StepFn = Callable[..., StepBreakdown]

COST_MODELS: dict[str, StepFn] = {
    "aisim": step_time,  # aisim's closed form (Narayanan et al. SC21 §2.2, §3)
    "distir": distir_step_time,  # microsoft/dist-ir's cost model and defaults
}
"""Cost-model name -> step function (iterating gives the names, in the order shown to users)."""


def select_step_fn(cost_model: str = "aisim") -> StepFn:
    """The one-strategy step function of a cost model.

    Args:
      cost_model: a name in :data:`COST_MODELS` (``"aisim"`` or ``"distir"``).

    Returns:
      ``fn(model_spec, hardware_spec, constants, strategy) -> StepBreakdown``.

    Raises:
      AisimError: ``field="cost_model"`` when the name is unknown.
    """
    try:
        return COST_MODELS[cost_model]
    except (KeyError, TypeError):
        raise bad_value(
            None, "cost_model", cost_model, "one of " + ", ".join(COST_MODELS)
        ) from None
