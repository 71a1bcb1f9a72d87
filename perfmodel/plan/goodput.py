"""The failure model applied to strategies: one result document, or a results frame of many.

Contract: the bridge between :mod:`perfmodel.plan.reliability` (formulas on numbers) and the plans
of :mod:`perfmodel.plan.training` (result documents and frames with ``num_gpus``,
``tokens_per_s``, ``step_time_s``, ``params``, ``dtype`` and ``hardware``). A failure model is
given either as one :class:`~perfmodel.plan.failure_model.FailureModel` (for every hardware) or as
a function of the :class:`~perfmodel.specs.hardware.Hardware` (one per hardware of a sweep, the
way :func:`perfmodel.search.sweep` takes ``constants``). The time to train with failures is
proportional to the tokens (goodput and the straggler slowdown do not depend on them), so a
strategy's wall time per token ranks it for any token count. Nothing here prints.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from perfmodel.plan.failure_model import FailureModel
from perfmodel.plan.reliability import FailurePlan, checkpoint_bytes, failure_plan
from perfmodel.specs.hardware import Hardware

if TYPE_CHECKING:
    import pandas as pd

Failures = FailureModel | Callable[[Hardware], FailureModel]
# the failure plan's fields a results frame carries, one column each
FRAME_KEYS = (
    "interruptions_per_day",
    "mtbf_hours",
    "checkpoint_interval_s",
    "checkpoint_write_s",
    "goodput",
    "straggler_slowdown",
    "train_days_sd",
)


def failures_for(failures: Failures | None, hw: Hardware) -> FailureModel | None:
    """The failure model of hardware ``hw``: ``failures`` itself, or ``failures(hw)``."""
    if failures is None or isinstance(failures, FailureModel):
        return failures
    return failures(hw)


def checkpoint_bytes_of(params, dtypes) -> np.ndarray | float:
    """The checkpoint bytes of each strategy (:func:`perfmodel.plan.reliability.checkpoint_bytes`)
    from its ``params`` and ``dtype`` label (arrays: one per row)."""
    p, d = np.asarray(params, np.float64), np.asarray(dtypes, dtype=object)
    if d.ndim == 0:
        return checkpoint_bytes(float(p), str(d))
    per_param = {str(k): checkpoint_bytes(1.0, str(k)) for k in np.unique(d.astype(str))}
    return p * np.array([per_param[str(k)] for k in d])


def result_failure_plan(result: dict, fm: FailureModel, useful_s: float) -> FailurePlan:
    """The :class:`~perfmodel.plan.reliability.FailurePlan` of one result document (an estimate's
    or a grid row's) over ``useful_s`` failure-free compute seconds."""
    return failure_plan(
        fm,
        num_gpus=float(result["num_gpus"]),
        useful_s=useful_s,
        checkpoint_bytes=checkpoint_bytes_of(result["params"], result.get("dtype", "bf16")),
        step_time_s=float(result["step_time_s"]),
    )


def frame_failure_plans(
    df: pd.DataFrame, hardware: dict[str, Hardware], failures: Failures, useful_s: np.ndarray
) -> dict[str, np.ndarray]:
    """The failure plans of every row of a results frame, one array per
    :class:`~perfmodel.plan.reliability.FailurePlan` field (``wall_s``, ``goodput`` ...), each
    hardware's rows under its own failure model."""
    import pandas as pd

    names = df["hardware"].to_numpy()
    out: dict[str, np.ndarray] = {}
    for name in pd.unique(names):
        rows = names == name
        sub = df[rows]
        plan = failure_plan(
            failures_for(failures, hardware[name]),
            num_gpus=sub["num_gpus"].to_numpy(np.float64),
            useful_s=np.asarray(useful_s, np.float64)[rows],
            checkpoint_bytes=checkpoint_bytes_of(sub["params"].to_numpy(), sub["dtype"].to_numpy()),
            step_time_s=sub["step_time_s"].to_numpy(np.float64),
        )
        for key in ("wall_s", *FRAME_KEYS):
            col = out.setdefault(key, np.full(len(df), np.nan))
            col[rows] = np.asarray(getattr(plan, key), np.float64)
    return out


def goodput_order(
    df: pd.DataFrame, hardware: dict[str, Hardware], failures: Failures, rank_by: str
) -> np.ndarray:
    """Row order of a results frame by time, cost or energy to train with failures and
    stragglers (best first; rows whose price or power is unknown last): wall time per
    token, times ``num_gpus`` and the price per GPU-hour (``cost``) or the device's power with its share of the
    host (``energy``). A bigger job is faster per step but fails more often and waits for a slower
    straggler, so this order can differ from the throughput's."""
    per_token = 1.0 / df["tokens_per_s"].to_numpy(np.float64)
    wall = frame_failure_plans(df, hardware, failures, per_token)["wall_s"]
    names = df["hardware"].to_numpy()
    gpus = df["num_gpus"].to_numpy(np.float64)
    if rank_by == "time":
        key = wall
    elif rank_by == "cost":
        price = np.array([float(hardware[h].spec.price_per_device_hour_usd) for h in names])
        key = gpus * price * wall
    else:
        power = [hardware[h].device_power_w for h in names]
        key = gpus * np.array([np.nan if p is None else p for p in power]) * wall
    return np.argsort(key, kind="stable")
