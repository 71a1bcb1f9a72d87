"""Hardware (and software stacks) side by side for one training run: each one's best strategy
and its plan.

Contract: :func:`compare_hardware` runs :func:`perfmodel.plan.training.plan_sweep` once per
hardware and stack, so that each gets its own best strategy under the same ranking, GPU count and
batch, and returns the ``aisim perf compare --json`` document. Nothing here prints.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from perfmodel.plan.training import plan_sweep
from perfmodel.search.sweep import strategy_label, sweep_stacks
from perfmodel.specs.constants import Constants
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from simbase.errors import bad_value

if TYPE_CHECKING:
    import pandas as pd

# what each hardware's row carries (and a table of them holds)
COMPARE_KEYS = (
    "hardware",
    "num_gpus",
    "step_time_s",
    "tokens_per_s",
    "mfu",
    "train_days",
    "gpu_hours",
    "cost_usd",
    "energy_mwh",
    "price_per_gpu_hour_usd",
    "board_power_w",
)
RANKINGS = ("time", "cost", "energy")


def compare_hardware(
    model: Model,
    hardware: list[Hardware],
    *,
    tokens: float,
    num_gpus: int = 1024,
    global_batch: int = 1536,
    rank_by: str = "time",
    constants_for: Callable[..., Constants] | None = None,
    stack=None,
    **plan: Any,
) -> dict[str, Any]:
    """The best strategy of each hardware (under each stack) at one GPU count and batch, and
    its plan.

    Args:
      model: the model.
      hardware: the hardware to compare (each searched on its own).
      tokens: tokens to train on.
      num_gpus: devices on each hardware.
      global_batch: samples per optimiser step.
      rank_by: ``time``, ``cost`` or ``energy``: how each hardware's best is chosen.
      constants_for: the constants of a hardware (a calibrated profile); default its preset's.
        With several stacks it also gets the stack: ``constants_for(hw, stack)``.
      stack: the software stack (:func:`perfmodel.sweep`'s), or a list of stacks: every
        hardware is searched under each, one row per pair, hardware first.
      **plan: the plan's options and the grid's knob restrictions (:func:`plan_sweep`'s).

    Returns:
      ``model``, ``tokens``, ``rank_by``, ``num_gpus``, ``global_batch_size`` and ``hardware``:
      one entry per hardware (and stack) with :data:`COMPARE_KEYS`, ``strategy`` (its label),
      ``stack`` (its name, with several stacks) and ``best`` (its whole result document).

    Raises:
      AisimError: an unknown ranking (field ``rank_by``), or a hardware with nothing feasible.
    """
    if rank_by not in RANKINGS:
        raise bad_value(None, "rank_by", rank_by, "one of " + ", ".join(RANKINGS))
    stacks = sweep_stacks(stack)
    several = len(stacks) > 1
    rows = []
    for hw in hardware:
        for one in stacks:
            under = (one,) if several else ()
            consts = None if constants_for is None else constants_for(hw, *under)
            result = plan_sweep(
                [model],
                [hw],
                tokens=tokens,
                rank_by=rank_by,
                num_gpus=[num_gpus],
                global_batch=[global_batch],
                constants=None if consts is None else (lambda _, c=consts: c),
                top=1,
                stack=one,
                **plan,
            )
            best = result.best
            row = {k: best.get(k) for k in COMPARE_KEYS}
            if several:
                row["stack"] = one.name
            row["strategy"] = strategy_label(best)
            row["best"] = best
            rows.append(row)
    return {
        "model": model.name,
        "tokens": tokens,
        "rank_by": rank_by,
        "num_gpus": num_gpus,
        "global_batch_size": global_batch,
        "hardware": rows,
    }


def compare_table(doc: dict[str, Any]) -> pd.DataFrame:
    """A :func:`compare_hardware` document as a table (``aisim perf compare --out``): one row
    per hardware (and stack), the :data:`COMPARE_KEYS`, ``stack`` (with several) and
    ``strategy`` columns."""
    import pandas as pd

    keys = (*COMPARE_KEYS, *(("stack",) if several_stacks(doc) else ()), "strategy")
    return pd.DataFrame([{k: r[k] for k in keys} for r in doc["hardware"]])


def several_stacks(doc: dict[str, Any]) -> bool:
    """Whether a :func:`compare_hardware` document compares several stacks (its rows name
    theirs)."""
    return any("stack" in r for r in doc["hardware"])
