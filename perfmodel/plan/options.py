"""The planning options: tokens, price, utilisation, PUE and rankings, read and checked.

Contract: the defaults come from ``profiles/planning.json`` (which cites them); each check raises
an :class:`~simbase.errors.AisimError` whose ``field`` is the option's library name
(``tokens``, ``price_per_gpu_hour_usd``, ``utilisation_factor``, ``pue``, ``rank_by``).
:mod:`perfmodel.plan.training` uses them and re-exports them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

from perfmodel.search.reduce import RANK_KEYS
from perfmodel.specs.hardware import Hardware
from simbase import units
from simbase.errors import bad_value

# rankings of a plan -> the sweep ranking that orders strategies the same way ("energy" has none
# on the device: it re-ranks every feasible strategy on the host)
PLAN_RANKS = {"time": "throughput", "cost": "cost", "energy": None}


def _planning_file() -> Path:
    return Path(str(resources.files("perfmodel") / "profiles" / "planning.json"))


def planning_defaults() -> dict[str, Any]:
    """The shipped planning assumptions (``profiles/planning.json``): ``utilisation_factor``,
    ``pue``, ``hbm_capacity_tiers_gib`` and the ``sources`` that justify them."""
    return json.loads(_planning_file().read_text())


DEFAULTS = planning_defaults()
DEFAULT_UTILISATION = float(DEFAULTS["utilisation_factor"])
DEFAULT_PUE = float(DEFAULTS["pue"])


# a quintillion tokens: a thousand times the largest training sets published by 2025
MAX_TOKENS = 1e18


def parse_tokens(text: str | float | int) -> float:
    """A token count such as ``"15T"``, ``"300B"``, ``"2.5e12"`` (field ``tokens``).

    Raises:
      AisimError: not a positive count (``field="tokens"``).
    """
    try:
        n = units.parse_count(text)
    except ValueError:
        n = math.nan
    if not math.isfinite(n) or n <= 0 or n > MAX_TOKENS:
        raise bad_value(
            None,
            "tokens",
            text,
            f"a token count like 15T, 300B or 2.5e12 (at most {MAX_TOKENS:.0e})",
        )
    return float(n)


def check_plan_options(
    price_per_gpu_hour_usd: float | None = None,
    utilisation_factor: float | None = None,
    pue: float | None = None,
) -> None:
    """Raises an :class:`AisimError` naming the field of a price outside [0, 10,000] USD per
    GPU-hour, a utilisation factor outside (0, 1] or a PUE outside [1, 5] (or any of them not
    finite): no GPU rents for more than a few tens of dollars an hour, and the Uptime Institute's
    surveys report no facility above a PUE of about 3, so values past these bounds are typos."""
    checks = (
        (
            "price_per_gpu_hour_usd",
            price_per_gpu_hour_usd,
            0.0,
            1e4,
            "a price in USD from 0 to 10000",
        ),
        ("utilisation_factor", utilisation_factor, 0.0, 1.0, "a fraction in (0, 1]"),
        ("pue", pue, 1.0, 5.0, "a power usage effectiveness from 1 to 5"),
    )
    for field, v, lo, hi, expected in checks:
        if v is None:
            continue
        ok = math.isfinite(v) and v <= hi and (v >= lo if field != "utilisation_factor" else v > lo)
        if not ok:
            raise bad_value(None, field, v, expected)


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    """A planning question's options, checked (:func:`plan_options`).

    Attributes:
      tokens: tokens to train on (None: no plan).
      price_per_gpu_hour_usd: replaces each hardware's price (None: the preset's).
      utilisation_factor: mean power draw over board power (None: ``planning.json``'s).
      pue: the facility's power usage effectiveness (None: ``planning.json``'s).
    """

    tokens: float | None
    price_per_gpu_hour_usd: float | None
    utilisation_factor: float | None
    pue: float | None

    def power(self) -> dict[str, float | None]:
        """``utilisation_factor`` and ``pue``, as the plan's functions take them."""
        return dict(utilisation_factor=self.utilisation_factor, pue=self.pue)


def plan_options(
    tokens: str | float | None = None,
    price_per_gpu_hour_usd: float | None = None,
    utilisation_factor: float | None = None,
    pue: float | None = None,
) -> PlanOptions:
    """The planning options checked (:func:`check_plan_options`) and the token count parsed
    (:func:`parse_tokens`), before any work.

    Args:
      tokens: a token count such as ``"15T"``, or None.
      price_per_gpu_hour_usd: USD per device-hour, >= 0, or None.
      utilisation_factor: mean power draw over board power, in (0, 1], or None.
      pue: the facility's power usage effectiveness, >= 1, or None.

    Returns:
      The :class:`PlanOptions`.

    Raises:
      AisimError: a bad value, naming its field (``price_per_gpu_hour_usd``,
        ``utilisation_factor``, ``pue``, then ``tokens``).
    """
    check_plan_options(price_per_gpu_hour_usd, utilisation_factor, pue)
    count = None if tokens is None else parse_tokens(tokens)
    return PlanOptions(count, price_per_gpu_hour_usd, utilisation_factor, pue)


def with_price(hw: Hardware, price_per_gpu_hour_usd: float | None) -> Hardware:
    """``hw`` with its price per device-hour replaced (unchanged when None), so that the cost
    per token of every strategy uses it."""
    if price_per_gpu_hour_usd is None:
        return hw
    return hw.replace_spec(price_per_device_hour_usd=float(price_per_gpu_hour_usd))


def check_rank_by(rank_by: str) -> str:
    """The sweep ranking that serves ``rank_by`` (``time`` -> ``throughput``); raises an
    :class:`AisimError` (field ``rank_by``) for an unknown ranking."""
    if rank_by in PLAN_RANKS:
        return PLAN_RANKS[rank_by] or "throughput"
    if rank_by in RANK_KEYS:
        return rank_by
    choices = list(RANK_KEYS) + [k for k in PLAN_RANKS if k not in RANK_KEYS]
    raise bad_value(None, "rank_by", rank_by, "one of " + ", ".join(choices))
