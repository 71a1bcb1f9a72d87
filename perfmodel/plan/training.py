"""Time, cost and energy to train: what a step time means for a whole training run.

Contract: a run of ``tokens`` tokens at ``tokens_per_s`` on ``num_gpus`` devices takes

    wall_s     = tokens / tokens_per_s
    gpu_hours  = num_gpus · wall_s / 3600
    cost_usd   = gpu_hours · price_per_gpu_hour_usd
    energy_J   = num_gpus · (board_power_w + host_power_w) · utilisation_factor · pue · wall_s

(``energy_mwh = energy_J / 3.6e9``). The board power is each hardware preset's data-sheet
maximum (``board_power_w``, cited in its ``sources.power``) and the host power its share of the
rest of the system's maximum input (``host_power_w = system_power_w / system_gpus -
board_power_w``: CPUs, memory, NICs, switches and fans; ``sources.system_power``), so a device
draws its node's rated power per GPU at full load; the average-utilisation factor (the mean draw
while training as a fraction of that maximum: Newkirk, Latif et al. measured 8-GPU H100 nodes at
76% of the 10.2 kW node rating) and the facility's PUE default to the values in
``profiles/planning.json``, which cites them. A quantity whose input is unknown (no
price, no board power) is ``None``, never 0. :func:`plan_sweep` ranks a sweep by time, cost or
energy to train and tags every strategy it reports with its plan. Nothing here prints.

With a failure model (``failures``, :mod:`perfmodel.plan.failure_model`) ``wall_s`` is the wall
time of :func:`perfmodel.plan.reliability.failure_plan` (interruptions, checkpoints, restarts and
stragglers) and the plan carries its ``failures`` fields; ``failures=None`` leaves every output
as it is without one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from perfmodel.plan.failure_model import FailureModel
from perfmodel.plan.goodput import (
    FRAME_KEYS,
    Failures,
    checkpoint_bytes_of,
    failures_for,
    frame_failure_plans,
    goodput_order,
)
from perfmodel.plan.options import (
    DEFAULT_PUE,
    DEFAULT_UTILISATION,
    DEFAULTS,
    PLAN_RANKS,
    check_plan_options,
    check_rank_by,
    parse_tokens,
    planning_defaults,
    with_price,
)
from perfmodel.plan.reliability import failure_plan
from perfmodel.search.report import row_to_result
from perfmodel.search.sweep import SweepResult, sweep
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from simbase import units
from simbase.errors import bad_value

if TYPE_CHECKING:
    import pandas as pd

# the planning options live in perfmodel.plan.options; importers of this module still find them here
__all__ = [
    "DEFAULTS",
    "DEFAULT_PUE",
    "DEFAULT_UTILISATION",
    "JOULES_PER_MWH",
    "PLAN_KEYS",
    "PLAN_RANKS",
    "SECONDS_PER_DAY",
    "TrainingPlan",
    "check_plan_options",
    "check_rank_by",
    "parse_tokens",
    "plan_for",
    "plan_frame",
    "plan_sweep",
    "plan_training",
    "planning_defaults",
    "reported_rows",
    "with_price",
]

SECONDS_PER_DAY = 86400.0
JOULES_PER_MWH = 3.6e9
PLAN_KEYS = ("train_days", "gpu_hours", "cost_usd", "energy_mwh")


@dataclasses.dataclass(frozen=True)
class TrainingPlan:
    """Time, cost and energy to train one strategy on ``tokens`` tokens.

    Attributes:
      tokens: tokens to train on.
      train_days: wall-clock days.
      gpu_hours: device-hours (``num_gpus`` × wall-clock hours).
      cost_usd: dollars (None without a price).
      energy_mwh: facility energy in MWh (None without a board power).
      price_per_gpu_hour_usd, board_power_w: the inputs used (None when unknown).
      host_power_w: the system's power per device beyond its board (None when unknown: the
        energy then counts the boards alone).
      utilisation_factor, pue: the energy assumptions used.
      failures: the :class:`~perfmodel.plan.reliability.FailurePlan` as a dict when failures
        were modelled (absent from :meth:`to_dict` when they were not).
    """

    tokens: float
    train_days: float
    gpu_hours: float
    cost_usd: float | None
    energy_mwh: float | None
    price_per_gpu_hour_usd: float | None
    board_power_w: float | None
    utilisation_factor: float
    pue: float
    failures: dict[str, Any] | None = None
    host_power_w: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The plan's fields as a JSON-ready dict (no ``failures`` key without failures)."""
        doc = dataclasses.asdict(self)
        if doc["failures"] is None:
            del doc["failures"]
        return doc


def _known(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else float(x)


def plan_training(
    *,
    tokens: float,
    tokens_per_s: float,
    num_gpus: float,
    price_per_gpu_hour_usd: float | None = None,
    board_power_w: float | None = None,
    utilisation_factor: float | None = None,
    pue: float | None = None,
    failures: FailureModel | None = None,
    checkpoint_bytes: float | None = None,
    step_time_s: float | None = None,
    host_power_w: float | None = None,
) -> TrainingPlan:
    """The time, cost and energy to train on ``tokens`` tokens at ``tokens_per_s``.

    Args:
      tokens: tokens to train on.
      tokens_per_s: the strategy's throughput (global tokens per second).
      num_gpus: devices.
      price_per_gpu_hour_usd: USD per device-hour (None or NaN: cost unknown).
      board_power_w: data-sheet maximum board power per device (None: energy unknown).
      utilisation_factor: average draw as a fraction of the board power (default
        :data:`DEFAULT_UTILISATION`).
      pue: the facility's power usage effectiveness (default :data:`DEFAULT_PUE`).
      failures: a :class:`~perfmodel.plan.failure_model.FailureModel` (None: no failures, every
        field as without one).
      checkpoint_bytes: one checkpoint of the job (required with ``failures``;
        :func:`perfmodel.plan.reliability.checkpoint_bytes`).
      step_time_s: seconds per step (the checkpoint interval's floor).
      host_power_w: maximum power per device beyond its board (the system's CPUs, memory,
        NICs, switches and fans: :attr:`perfmodel.specs.hardware.Hardware.host_power_w`; None:
        the boards alone).

    Returns:
      A :class:`TrainingPlan` (formulas in the module docstring).

    Raises:
      AisimError: a bad option, or ``failures`` without ``checkpoint_bytes``.
    """
    u = DEFAULT_UTILISATION if utilisation_factor is None else float(utilisation_factor)
    p = DEFAULT_PUE if pue is None else float(pue)
    check_plan_options(None, u, p)
    wall_s = float(tokens) / float(tokens_per_s) if tokens_per_s > 0 else math.inf
    failed = None
    if failures is not None:
        if checkpoint_bytes is None or not checkpoint_bytes >= 0:
            raise bad_value(
                None, "checkpoint_bytes", checkpoint_bytes, "the checkpoint's size in bytes"
            )
        fp = failure_plan(
            failures,
            num_gpus=float(num_gpus),
            useful_s=wall_s,
            checkpoint_bytes=float(checkpoint_bytes),
            step_time_s=step_time_s,
        )
        wall_s, failed = float(fp.wall_s), fp.to_dict()
    gpu_hours = float(num_gpus) * wall_s / units.HOUR_S
    price = _known(price_per_gpu_hour_usd)
    power = _known(board_power_w)
    host = _known(host_power_w)
    node = None if power is None else power + (host or 0.0)
    energy = None if node is None else num_gpus * node * u * p * wall_s / JOULES_PER_MWH
    return TrainingPlan(
        tokens=float(tokens),
        train_days=wall_s / SECONDS_PER_DAY,
        gpu_hours=gpu_hours,
        cost_usd=None if price is None else gpu_hours * price,
        energy_mwh=None if energy is None else float(energy),
        price_per_gpu_hour_usd=price,
        board_power_w=power,
        utilisation_factor=u,
        pue=p,
        failures=failed,
        host_power_w=host,
    )


def plan_for(
    result: dict,
    hw: Hardware,
    tokens: float,
    *,
    utilisation_factor: float | None = None,
    pue: float | None = None,
    failures: Failures | None = None,
) -> TrainingPlan:
    """The plan of one result document (an estimate's or a grid row's: ``tokens_per_s`` and
    ``num_gpus``; with ``failures`` also ``params``, ``dtype`` and ``step_time_s``) on hardware
    ``hw`` (its price, board and host power); ``failures`` is a failure model or a function of the
    hardware that makes one (None: no failures)."""
    fm = failures_for(failures, hw)
    extra: dict[str, Any] = {}
    if fm is not None:
        extra = dict(
            failures=fm,
            checkpoint_bytes=checkpoint_bytes_of(result["params"], result.get("dtype", "bf16")),
            step_time_s=float(result["step_time_s"]),
        )
    return plan_training(
        tokens=tokens,
        tokens_per_s=float(result["tokens_per_s"]),
        num_gpus=float(result["num_gpus"]),
        price_per_gpu_hour_usd=float(hw.spec.price_per_device_hour_usd),
        board_power_w=hw.board_power_w,
        host_power_w=hw.host_power_w,
        utilisation_factor=utilisation_factor,
        pue=pue,
        **extra,
    )


def _energy_per_token(df: pd.DataFrame, power_w: dict[str, float | None]) -> np.ndarray:
    """Joules per token of each row at the devices' maximum power (board and host share; NaN
    where the hardware's board power is unknown)."""
    p = np.array([np.nan if power_w.get(h) is None else power_w[h] for h in df["hardware"]])
    return df["num_gpus"].to_numpy(float) * p / df["tokens_per_s"].to_numpy(float)


def _rows(df: pd.DataFrame) -> list[dict]:
    out = []
    for _, row in df.iterrows():
        doc = row_to_result(row)
        for k in ("model", "hardware", "cost_model", "params"):
            doc[k] = row[k].item() if hasattr(row[k], "item") else row[k]
        out.append(doc)
    return out


def plan_sweep(
    models: str | Model | Sequence[str | Model] | None = None,
    hardware: str | Hardware | Sequence[str | Hardware] | None = None,
    *,
    tokens: float | None = None,
    rank_by: str = "throughput",
    price_per_gpu_hour_usd: float | None = None,
    utilisation_factor: float | None = None,
    pue: float | None = None,
    top: int = 10,
    keep_all: bool = False,
    failures: Failures | None = None,
    **sweep_args: Any,
) -> SweepResult:
    """:func:`perfmodel.search.sweep`, ranked by time, cost or energy to train, every reported strategy
    tagged with its :class:`TrainingPlan` (the keys of :data:`PLAN_KEYS` plus ``tokens``).

    ``rank_by="time"`` ranks as ``throughput`` (the time to train a fixed number of tokens is
    ``tokens / tokens_per_s``) and ``cost`` as the cost per token; ``energy`` ranks every
    feasible strategy by energy per token (``num_gpus · (board_power_w + host_power_w) /
    tokens_per_s``;
    strategies on hardware without a board power rank last). With ``failures`` the three rank
    every feasible strategy by its time, cost or energy with failures, checkpoints, restarts and
    stragglers (:func:`perfmodel.plan.goodput.goodput_order`: a bigger job is faster per step but
    fails more often), and every plan includes them. The points, Pareto fronts and cheapest
    hardware are :func:`perfmodel.search.sweep`'s.

    Args:
      models: model presets or :class:`Model` s, as for :func:`perfmodel.search.sweep`.
      hardware: hardware presets or :class:`Hardware`, as for :func:`perfmodel.search.sweep`.
      tokens: tokens to train on (None: rank only, no plan fields).
      rank_by: ``time``, ``cost``, ``energy``, or a ranking of :func:`perfmodel.search.sweep`.
      price_per_gpu_hour_usd: replaces every hardware's price (default: each preset's).
      utilisation_factor: average power drawn while training over the board rating, in
        (0, 1] (default in ``profiles/planning.json``).
      pue: the data centre's power usage effectiveness, >= 1 (default in
        ``profiles/planning.json``).
      top: how many of the best strategies to keep (:func:`perfmodel.search.sweep`).
      keep_all: also return every feasible strategy (:func:`perfmodel.search.sweep`).
      failures: a failure model, or a function of the hardware that makes one
        (:func:`perfmodel.plan.failure_model.failure_model`); None: no failures.
      **sweep_args: passed to :func:`perfmodel.search.sweep`.

    Raises:
      AisimError: a bad option (field ``rank_by``, ``tokens``, ``price_per_gpu_hour_usd``,
        ``utilisation_factor``, ``pue``) or whatever :func:`perfmodel.search.sweep` raises.
    """
    from perfmodel.plan.estimate import resolve_hardware

    search_rank = check_rank_by(rank_by)
    check_plan_options(price_per_gpu_hour_usd, utilisation_factor, pue)
    if tokens is not None:
        tokens = parse_tokens(tokens)
    hws = hardware if isinstance(hardware, list | tuple) else [hardware]
    devices = [with_price(resolve_hardware(h), price_per_gpu_hour_usd) for h in hws]
    energy = rank_by == "energy"
    by_goodput = failures is not None and rank_by in PLAN_RANKS
    result = sweep(
        models,
        devices,
        rank_by=search_rank,
        top=top,
        keep_all=keep_all or energy or by_goodput,
        **sweep_args,
    )
    by_name = {hw.name: hw for hw in devices}
    if energy or by_goodput:
        result = _rerank(result, by_name, rank_by, failures if by_goodput else None, top, keep_all)
    if tokens is not None:
        plan_args = dict(utilisation_factor=utilisation_factor, pue=pue, failures=failures)
        result = _with_plans(result, by_name, tokens, plan_args)
    return result


def _rerank(
    result: SweepResult,
    by_name: dict[str, Hardware],
    rank_by: str,
    failures: Failures | None,
    top: int,
    keep_all: bool,
) -> SweepResult:
    """``result`` with its best strategies re-ranked on the host over every feasible one: by
    time, cost or energy with failures (:func:`perfmodel.plan.goodput.goodput_order`) when
    ``failures`` is given, else by energy per token at the devices' maximum power."""
    df = result.all_feasible
    if failures is not None:
        order = goodput_order(df, by_name, failures, rank_by)
    else:
        order = np.argsort(_energy_per_token(df, {k: v.device_power_w for k, v in by_name.items()}))
    top_rows = _rows(df.iloc[order[:top]])
    return dataclasses.replace(
        result, best=top_rows[0], top=top_rows, all_feasible=df if keep_all else None
    )


def _with_plans(
    result: SweepResult, by_name: dict[str, Hardware], tokens: float, plan_args: dict[str, Any]
) -> SweepResult:
    """``result`` with every reported strategy, and every row of ``all_feasible``, tagged with
    its plan (:func:`plan_for`, :func:`plan_frame`)."""
    if result.all_feasible is not None:
        frame = plan_frame(result.all_feasible, by_name, tokens, **plan_args)
        result = dataclasses.replace(result, all_feasible=frame)
    for row in reported_rows(result):
        row.update(plan_for(row, by_name[row["hardware"]], tokens, **plan_args).to_dict())
    return result


def reported_rows(result: SweepResult) -> list[dict]:
    """Every strategy dict a sweep reports, each once (``best`` is ``top[0]``)."""
    rows = [*result.top, *result.best_per_point, *result.cost_by_hardware]
    if result.best is not result.top[0]:
        rows.append(result.best)
    seen: set[int] = set()
    return [r for r in rows if not (id(r) in seen or seen.add(id(r)))]


def plan_frame(
    df: pd.DataFrame,
    hardware: dict[str, Hardware],
    tokens: float,
    *,
    utilisation_factor: float | None = None,
    pue: float | None = None,
    failures: Failures | None = None,
) -> pd.DataFrame:
    """A results frame (one strategy per row, with ``hardware``, ``num_gpus`` and
    ``tokens_per_s`` columns) with the plan's columns added (:data:`PLAN_KEYS`; NaN where
    unknown), vectorised with the formulas of :func:`plan_training`. With ``failures`` (the
    frame then also needs ``params``, ``dtype`` and ``step_time_s``) the wall time includes
    them and the failure plan's :data:`~perfmodel.plan.goodput.FRAME_KEYS` are columns too."""
    u = DEFAULT_UTILISATION if utilisation_factor is None else float(utilisation_factor)
    p = DEFAULT_PUE if pue is None else float(pue)
    names = df["hardware"].to_numpy()
    price = np.array([float(hardware[h].spec.price_per_device_hour_usd) for h in names])
    power = np.array(
        [
            np.nan if hardware[h].device_power_w is None else hardware[h].device_power_w
            for h in names
        ]
    )
    gpus = df["num_gpus"].to_numpy(float)
    wall_s = float(tokens) / df["tokens_per_s"].to_numpy(float)
    out = df.copy()
    if failures is not None:
        cols = frame_failure_plans(df, hardware, failures, wall_s)
        wall_s = cols["wall_s"]
        for k in FRAME_KEYS:
            out[k] = cols[k]
    out["train_days"] = wall_s / SECONDS_PER_DAY
    out["gpu_hours"] = gpus * wall_s / units.HOUR_S
    out["cost_usd"] = out["gpu_hours"].to_numpy() * price
    out["energy_mwh"] = gpus * power * u * p * wall_s / JOULES_PER_MWH
    return out
