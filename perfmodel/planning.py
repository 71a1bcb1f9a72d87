"""Time, cost and energy to train: what a step time means for a whole training run.

Contract: a run of ``tokens`` tokens at ``tokens_per_s`` on ``num_gpus`` devices takes

    wall_s     = tokens / tokens_per_s
    gpu_hours  = num_gpus · wall_s / 3600
    cost_usd   = gpu_hours · price_per_gpu_hour_usd
    energy_J   = num_gpus · board_power_w · utilisation_factor · pue · wall_s

(``energy_mwh = energy_J / 3.6e9``). The board power is each hardware preset's data-sheet
maximum (``board_power_w``, cited in its ``sources.power``); the average-utilisation factor (the
mean draw while training as a fraction of that maximum) and the facility's PUE default to the
values in ``profiles/planning.json``, which cites them. A quantity whose input is unknown (no
price, no board power) is ``None``, never 0. :func:`plan_sweep` ranks a sweep by time, cost or
energy to train and tags every strategy it reports with its plan. Nothing here prints.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfmodel.hardware import Hardware
from perfmodel.report import row_to_result
from perfmodel.search import RANK_KEYS
from perfmodel.sweep import SweepResult, sweep
from perfmodel.workload import Model
from simbase import units
from simbase.errors import bad_value

SECONDS_PER_DAY = 86400.0
JOULES_PER_MWH = 3.6e9
# rankings of a plan -> the sweep ranking that orders strategies the same way ("energy" has none
# on the device: it re-ranks every feasible strategy on the host)
PLAN_RANKS = {"time": "throughput", "cost": "cost", "energy": None}
PLAN_KEYS = ("train_days", "gpu_hours", "cost_usd", "energy_mwh")


def _planning_file() -> Path:
    return Path(str(resources.files("perfmodel") / "profiles" / "planning.json"))


def planning_defaults() -> dict[str, Any]:
    """The shipped planning assumptions (``profiles/planning.json``): ``utilisation_factor``,
    ``pue``, ``hbm_capacity_tiers_gib`` and the ``sources`` that justify them."""
    return json.loads(_planning_file().read_text())


DEFAULTS = planning_defaults()
DEFAULT_UTILISATION = float(DEFAULTS["utilisation_factor"])
DEFAULT_PUE = float(DEFAULTS["pue"])


def parse_tokens(text: str | float | int) -> float:
    """A token count such as ``"15T"``, ``"300B"``, ``"2.5e12"`` (field ``tokens``).

    Raises:
      AisimError: not a positive count (``field="tokens"``).
    """
    try:
        n = units.parse_count(text)
    except ValueError:
        n = math.nan
    if not math.isfinite(n) or n <= 0:
        raise bad_value(None, "tokens", text, "a positive token count like 15T, 300B or 2.5e12")
    return float(n)


def check_plan_options(
    price_per_gpu_hour_usd: float | None = None,
    utilisation_factor: float | None = None,
    pue: float | None = None,
) -> None:
    """Raises an :class:`AisimError` naming the field of a price below 0, a utilisation factor
    outside (0, 1] or a PUE below 1 (or any of them not finite)."""
    checks = (
        ("price_per_gpu_hour_usd", price_per_gpu_hour_usd, 0.0, math.inf, "a price >= 0 in USD"),
        ("utilisation_factor", utilisation_factor, 0.0, 1.0, "a fraction in (0, 1]"),
        ("pue", pue, 1.0, math.inf, "a power usage effectiveness >= 1"),
    )
    for field, v, lo, hi, expected in checks:
        if v is None:
            continue
        ok = math.isfinite(v) and v <= hi and (v >= lo if field != "utilisation_factor" else v > lo)
        if not ok:
            raise bad_value(None, field, v, expected)


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
      utilisation_factor, pue: the energy assumptions used.
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

    def to_dict(self) -> dict[str, Any]:
        """The plan's fields as a JSON-ready dict."""
        return dataclasses.asdict(self)


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

    Returns:
      A :class:`TrainingPlan` (formulas in the module docstring).
    """
    u = DEFAULT_UTILISATION if utilisation_factor is None else float(utilisation_factor)
    p = DEFAULT_PUE if pue is None else float(pue)
    check_plan_options(None, u, p)
    wall_s = float(tokens) / float(tokens_per_s) if tokens_per_s > 0 else math.inf
    gpu_hours = float(num_gpus) * wall_s / units.HOUR_S
    price = _known(price_per_gpu_hour_usd)
    power = _known(board_power_w)
    energy = None if power is None else num_gpus * power * u * p * wall_s / JOULES_PER_MWH
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
    )


def with_price(hw: Hardware, price_per_gpu_hour_usd: float | None) -> Hardware:
    """``hw`` with its price per device-hour replaced (unchanged when None), so that the cost
    per token of every strategy uses it."""
    if price_per_gpu_hour_usd is None:
        return hw
    return hw.replace_spec(price_per_device_hour_usd=float(price_per_gpu_hour_usd))


def plan_for(
    result: dict,
    hw: Hardware,
    tokens: float,
    *,
    utilisation_factor: float | None = None,
    pue: float | None = None,
) -> TrainingPlan:
    """The plan of one result document (an estimate's or a grid row's: ``tokens_per_s`` and
    ``num_gpus``) on hardware ``hw`` (its price and board power)."""
    return plan_training(
        tokens=tokens,
        tokens_per_s=float(result["tokens_per_s"]),
        num_gpus=float(result["num_gpus"]),
        price_per_gpu_hour_usd=float(hw.spec.price_per_device_hour_usd),
        board_power_w=hw.board_power_w,
        utilisation_factor=utilisation_factor,
        pue=pue,
    )


def check_rank_by(rank_by: str) -> str:
    """The sweep ranking that serves ``rank_by`` (``time`` -> ``throughput``); raises an
    :class:`AisimError` (field ``rank_by``) for an unknown ranking."""
    if rank_by in PLAN_RANKS:
        return PLAN_RANKS[rank_by] or "throughput"
    if rank_by in RANK_KEYS:
        return rank_by
    choices = list(RANK_KEYS) + [k for k in PLAN_RANKS if k not in RANK_KEYS]
    raise bad_value(None, "rank_by", rank_by, "one of " + ", ".join(choices))


def _energy_per_token(df: pd.DataFrame, power_w: dict[str, float | None]) -> np.ndarray:
    """Board joules per token of each row (NaN where the hardware's board power is unknown)."""
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
    **sweep_args: Any,
) -> SweepResult:
    """:func:`perfmodel.sweep`, ranked by time, cost or energy to train, every reported strategy
    tagged with its :class:`TrainingPlan` (the keys of :data:`PLAN_KEYS` plus ``tokens``).

    ``rank_by="time"`` ranks as ``throughput`` (the time to train a fixed number of tokens is
    ``tokens / tokens_per_s``) and ``cost`` as the cost per token; ``energy`` ranks every
    feasible strategy by board energy per token (``num_gpus · board_power_w / tokens_per_s``;
    strategies on hardware without a board power rank last). The points, Pareto fronts and
    cheapest hardware are :func:`perfmodel.sweep`'s.

    Args:
      models: model presets or :class:`Model` s, as for :func:`perfmodel.sweep`.
      hardware: hardware presets or :class:`Hardware`, as for :func:`perfmodel.sweep`.
      tokens: tokens to train on (None: rank only, no plan fields).
      rank_by: ``time``, ``cost``, ``energy``, or a ranking of :func:`perfmodel.sweep`.
      price_per_gpu_hour_usd: replaces every hardware's price (default: each preset's).
      utilisation_factor: average power drawn while training over the board rating, in
        (0, 1] (default in ``profiles/planning.json``).
      pue: the data centre's power usage effectiveness, >= 1 (default in
        ``profiles/planning.json``).
      top: how many of the best strategies to keep (:func:`perfmodel.sweep`).
      keep_all: also return every feasible strategy (:func:`perfmodel.sweep`).
      **sweep_args: passed to :func:`perfmodel.sweep`.

    Raises:
      AisimError: a bad option (field ``rank_by``, ``tokens``, ``price_per_gpu_hour_usd``,
        ``utilisation_factor``, ``pue``) or whatever :func:`perfmodel.sweep` raises.
    """
    from perfmodel.estimate import resolve_hardware

    search_rank = check_rank_by(rank_by)
    check_plan_options(price_per_gpu_hour_usd, utilisation_factor, pue)
    if tokens is not None:
        tokens = parse_tokens(tokens)
    hws = hardware if isinstance(hardware, list | tuple) else [hardware]
    devices = [with_price(resolve_hardware(h), price_per_gpu_hour_usd) for h in hws]
    energy = rank_by == "energy"
    result = sweep(
        models,
        devices,
        rank_by=search_rank,
        top=top,
        keep_all=keep_all or energy,
        **sweep_args,
    )
    by_name = {hw.name: hw for hw in devices}
    if energy:
        df = result.all_feasible
        order = np.argsort(_energy_per_token(df, {k: v.board_power_w for k, v in by_name.items()}))
        top_rows = _rows(df.iloc[order[:top]])
        result = dataclasses.replace(
            result,
            best=top_rows[0],
            top=top_rows,
            all_feasible=result.all_feasible if keep_all else None,
        )
    if tokens is not None and result.all_feasible is not None:
        result = dataclasses.replace(
            result,
            all_feasible=plan_frame(
                result.all_feasible, by_name, tokens, utilisation_factor=utilisation_factor, pue=pue
            ),
        )
    if tokens is not None:
        for row in reported_rows(result):
            plan = plan_for(
                row,
                by_name[row["hardware"]],
                tokens,
                utilisation_factor=utilisation_factor,
                pue=pue,
            )
            row.update(plan.to_dict())
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
) -> pd.DataFrame:
    """A results frame (one strategy per row, with ``hardware``, ``num_gpus`` and
    ``tokens_per_s`` columns) with the plan's columns added (:data:`PLAN_KEYS`; NaN where
    unknown), vectorised with the formulas of :func:`plan_training`."""
    u = DEFAULT_UTILISATION if utilisation_factor is None else float(utilisation_factor)
    p = DEFAULT_PUE if pue is None else float(pue)
    names = df["hardware"].to_numpy()
    price = np.array([float(hardware[h].spec.price_per_device_hour_usd) for h in names])
    power = np.array(
        [np.nan if hardware[h].board_power_w is None else hardware[h].board_power_w for h in names]
    )
    gpus = df["num_gpus"].to_numpy(float)
    wall_s = float(tokens) / df["tokens_per_s"].to_numpy(float)
    out = df.copy()
    out["train_days"] = wall_s / SECONDS_PER_DAY
    out["gpu_hours"] = gpus * wall_s / units.HOUR_S
    out["cost_usd"] = out["gpu_hours"].to_numpy() * price
    out["energy_mwh"] = gpus * power * u * p * wall_s / JOULES_PER_MWH
    return out
