"""The failure model's description: what fails how often, where checkpoints go, what a restart
costs and how unevenly GPUs run, loaded from ``profiles/reliability.json``.

Contract: :func:`failure_model` turns a hardware preset (or a loaded :class:`Hardware`) and a
user's overrides into a validated :class:`FailureModel` in SI units (failures per component and
second, bytes per second, seconds). Each component's rate is the geometric mean of the published
estimates the profile lists for it (failures per component-hour, converted here once); which
estimate came from where is in the profile. :mod:`perfmodel.plan.reliability` holds the formulas
that use the model. Errors are :class:`~simbase.errors.AisimError` data whose ``field`` is the
argument of :func:`failure_model` at fault (``source=None``), or the profile's key.
"""

from __future__ import annotations

import dataclasses
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

from perfmodel.specs.hardware import Hardware
from simbase import units
from simbase.errors import bad_value

# what one unit of each component is: its rate counts failures per GPU, NIC, node or NVLink domain
COMPONENT_UNITS = {
    "gpu": "gpu",
    "gpu_memory": "gpu",
    "nvlink": "nvlink_domain",
    "network": "nic",
    "nic": "nic",
    "host": "node",
    "software": "node",
}
MTBF_SCOPES = ("job", "node", "gpu")
DISTRIBUTIONS = ("lognormal", "normal")
INTERVAL_RULES = ("daly", "young")


@dataclasses.dataclass(frozen=True)
class ComponentRates:
    """Failures per second of one unit of each component (a GPU, a NIC, a node, an NVLink
    domain; see :data:`COMPONENT_UNITS`), and planned interruptions per node and second."""

    gpu_per_s: float
    gpu_memory_per_s: float
    nvlink_per_s: float
    network_per_s: float
    nic_per_s: float
    host_per_s: float
    software_per_s: float
    planned_per_s: float


@dataclasses.dataclass(frozen=True)
class StorageTier:
    """Where checkpoints are written: bandwidth of one node, and of all nodes at once (``inf``:
    no limit beyond the nodes' own)."""

    name: str
    write_bytes_per_s_per_node: float
    read_bytes_per_s_per_node: float
    aggregate_write_bytes_per_s: float = math.inf
    aggregate_read_bytes_per_s: float = math.inf


@dataclasses.dataclass(frozen=True)
class RestartCosts:
    """Seconds a restart after a failure takes besides loading the checkpoint: noticing the
    failure, rescheduling onto healthy nodes, and warming up (communicators, compilation)."""

    detect_s: float
    reschedule_s: float
    warmup_s: float


@dataclasses.dataclass(frozen=True)
class FailureModel:
    """Everything the failure process of a run depends on besides the run itself.

    Attributes:
      hardware: the profile entry used (a preset name, or ``default`` for other hardware).
      rates: failures per component and second (:class:`ComponentRates`).
      gpus_per_node, nics_per_node, gpus_per_nvlink_domain: the shape of a node.
      storage: the checkpoint :class:`StorageTier`.
      restart: the :class:`RestartCosts`.
      async_checkpoint: checkpoints are written in the background (training stalls for
        ``async_blocking_fraction`` of the write).
      async_blocking_fraction: the stall of an asynchronous save over a synchronous one.
      checkpoint_interval_s: compute seconds between checkpoints (None: the optimum of
        ``interval_rule``).
      interval_rule: ``daly`` (Daly 2006, higher order) or ``young`` (Young 1974).
      mtbf_s: a user's mean time between unplanned interruptions, replacing the component
        rates (None: the rates), counted per ``mtbf_per`` (``job``, ``node`` or ``gpu``).
      planned: whether planned interruptions (maintenance) happen.
      straggler_cv: coefficient of variation of one rank's step time.
      straggler_distribution: ``lognormal`` or ``normal``.
    """

    hardware: str
    rates: ComponentRates
    gpus_per_node: int
    nics_per_node: int
    gpus_per_nvlink_domain: int
    storage: StorageTier
    restart: RestartCosts
    async_checkpoint: bool
    async_blocking_fraction: float
    checkpoint_interval_s: float | None = None
    interval_rule: str = "daly"
    mtbf_s: float | None = None
    mtbf_per: str = "job"
    planned: bool = True
    straggler_cv: float = 0.0
    straggler_distribution: str = "lognormal"


def _profile_file() -> Path:
    return Path(str(resources.files("perfmodel") / "profiles" / "reliability.json"))


def reliability_profile() -> dict[str, Any]:
    """The shipped profile (``profiles/reliability.json``): estimates, node shapes, storage
    tiers, restart costs, the straggler spread, the published checks and the ``sources``."""
    return json.loads(_profile_file().read_text())


PROFILE = reliability_profile()


def storage_names() -> list[str]:
    """The storage tiers of the profile (``local-nvme``, ``pfs``, ``object-store``)."""
    return sorted(PROFILE["storage"])


def pooled_rate(estimates: list[dict[str, Any]]) -> float:
    """The geometric mean of a component's published estimates (``value`` of each, in failures
    per component-hour): rates from different fleets spread by factors, so they are averaged in
    log space. 0 when any estimate is 0 (a component that does not exist)."""
    values = [float(e["value"]) for e in estimates]
    if not values or min(values) <= 0.0:
        return 0.0
    return math.exp(sum(math.log(v) for v in values) / len(values))


def component_rates(name: str, hbm_gb: float | None = None) -> tuple[ComponentRates, dict]:
    """The failure rates of a hardware entry of the profile, per second.

    Args:
      name: a key of the profile's ``hardware`` (a preset name) or ``default``.
      hbm_gb: GPU memory in GB (default: the entry's ``hbm_gb``); memory failures scale with it.

    Returns:
      (:class:`ComponentRates`, the entry with its node shape).
    """
    entry = PROFILE["hardware"].get(name) or PROFILE["default_hardware"]
    family = PROFILE["families"][entry["family"]]
    fleet = PROFILE["fleet"]
    gb = float(entry.get("hbm_gb", 0.0) if hbm_gb is None else hbm_gb)
    per_hour = {
        "gpu": pooled_rate(family["gpu_per_gpu_hour"]),
        "gpu_memory": pooled_rate(family["gpu_memory_per_gb_hour"]) * gb,
        "nvlink": pooled_rate(fleet["nvlink_per_domain_hour"]),
        "network": pooled_rate(fleet["network_per_nic_hour"]),
        "nic": pooled_rate(fleet["nic_per_nic_hour"]),
        "host": pooled_rate(fleet["host_per_node_hour"]),
        "software": pooled_rate(fleet["software_per_node_hour"]),
        "planned": pooled_rate(fleet["planned_per_node_hour"]),
    }
    rates = ComponentRates(**{f"{k}_per_s": v / units.HOUR_S for k, v in per_hour.items()})
    return rates, entry


def storage_tier(name: str) -> StorageTier:
    """A storage tier of the profile by name, in bytes per second.

    Raises:
      AisimError: an unknown name (field ``storage``).
    """
    doc = PROFILE["storage"].get(name)
    if doc is None:
        raise bad_value(None, "storage", name, "one of " + ", ".join(storage_names()))

    def bw(key: str) -> float:
        v = doc[key]
        return math.inf if v is None else float(v) * units.GIGA

    return StorageTier(
        name=name,
        write_bytes_per_s_per_node=bw("write_gb_per_s_per_node"),
        read_bytes_per_s_per_node=bw("read_gb_per_s_per_node"),
        aggregate_write_bytes_per_s=bw("aggregate_write_gb_per_s"),
        aggregate_read_bytes_per_s=bw("aggregate_read_gb_per_s"),
    )


def _positive(field: str, v: float | None, expected: str, *, zero_ok: bool = False) -> None:
    if v is None:
        return
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or v < 0 or (v == 0 and not zero_ok):
        raise bad_value(None, field, v, expected)


def _hardware_rates(hardware: str | Hardware | None) -> tuple[str, ComponentRates, dict]:
    """(profile entry name, rates, entry) of a preset name or a loaded :class:`Hardware`; other
    hardware gets the ``default`` entry with its own memory capacity."""
    name = hardware.name if isinstance(hardware, Hardware) else (hardware or "h100-sxm").lower()
    if name in PROFILE["hardware"]:
        return (name, *component_rates(name))
    if not isinstance(hardware, Hardware):
        expected = "one of " + ", ".join(sorted(PROFILE["hardware"]))
        raise bad_value(None, "hardware", hardware, expected)
    hbm_gb = float(hardware.spec.memory_capacity_bytes) / units.GIGA
    return ("default", *component_rates("default", hbm_gb))


def _check_numbers(interval_s, mtbf_hours, restart_s, cv) -> None:
    _positive("checkpoint_interval_s", interval_s, "a positive number of seconds")
    _positive("mtbf_hours", mtbf_hours, "a positive number of hours")
    _positive("restart_overhead_s", restart_s, "seconds >= 0", zero_ok=True)
    _positive("straggler_cv", cv, "a coefficient of variation >= 0", zero_ok=True)


def _choice(field: str, v: str, choices: tuple[str, ...]) -> str:
    if v not in choices:
        raise bad_value(None, field, v, "one of " + ", ".join(choices))
    return v


def failure_model(
    hardware: str | Hardware | None = None,
    *,
    storage: str | StorageTier | None = None,
    async_checkpoint: bool | None = None,
    checkpoint_interval_s: float | None = None,
    interval_rule: str = "daly",
    mtbf_hours: float | None = None,
    mtbf_per: str = "job",
    planned: bool = True,
    restart_overhead_s: float | None = None,
    straggler_cv: float | None = None,
    straggler_distribution: str | None = None,
) -> FailureModel:
    """The failure model of a hardware preset with a user's overrides, validated.

    Args:
      hardware: a preset name or a loaded :class:`Hardware` (default ``h100-sxm``); hardware
        without an entry in the profile gets the ``default`` entry (Hopper's rates) with its own
        memory capacity.
      storage: a tier name (:func:`storage_names`; default the profile's ``pfs``) or a
        :class:`StorageTier`.
      async_checkpoint: save in the background (default: the profile's, true).
      checkpoint_interval_s: compute seconds between checkpoints (default: the optimum).
      interval_rule: ``daly`` or ``young``, for the optimum.
      mtbf_hours: the user's mean time between unplanned interruptions in hours, replacing
        the component rates; per ``mtbf_per``: ``job`` (this job, whatever its size), ``node``
        or ``gpu`` (a fleet statistic, divided by the job's nodes or GPUs).
      planned: count planned interruptions (maintenance).
      restart_overhead_s: seconds to detect, reschedule and warm up after a failure, replacing
        the profile's three (loading the checkpoint is timed from the storage tier).
      straggler_cv: the coefficient of variation of one rank's step time (0: no stragglers;
        default the profile's).
      straggler_distribution: ``lognormal`` or ``normal`` (default the profile's).

    Returns:
      A :class:`FailureModel` in SI units.

    Raises:
      AisimError: a bad argument (``field`` = its name).
    """
    name, rates, entry = _hardware_rates(hardware)
    _check_numbers(checkpoint_interval_s, mtbf_hours, restart_overhead_s, straggler_cv)
    _choice("interval_rule", interval_rule, INTERVAL_RULES)
    _choice("mtbf_per", mtbf_per, MTBF_SCOPES)
    strag = PROFILE["straggler"]
    dist = _choice(
        "straggler_distribution", straggler_distribution or strag["distribution"], DISTRIBUTIONS
    )
    tier = (
        storage
        if isinstance(storage, StorageTier)
        else storage_tier(storage or PROFILE["default_storage"])
    )
    r = PROFILE["restart"]
    restart = RestartCosts(float(r["detect_s"]), float(r["reschedule_s"]), float(r["warmup_s"]))
    if restart_overhead_s is not None:
        restart = RestartCosts(0.0, float(restart_overhead_s), 0.0)
    ckpt = PROFILE["checkpoint"]
    return FailureModel(
        hardware=name,
        rates=rates,
        gpus_per_node=int(entry["gpus_per_node"]),
        nics_per_node=int(entry["nics_per_node"]),
        gpus_per_nvlink_domain=int(entry["gpus_per_nvlink_domain"]),
        storage=tier,
        restart=restart,
        async_checkpoint=bool(ckpt["async"] if async_checkpoint is None else async_checkpoint),
        async_blocking_fraction=float(ckpt["async_blocking_fraction"]),
        checkpoint_interval_s=None
        if checkpoint_interval_s is None
        else float(checkpoint_interval_s),
        interval_rule=interval_rule,
        mtbf_s=None if mtbf_hours is None else float(mtbf_hours) * units.HOUR_S,
        mtbf_per=mtbf_per,
        planned=bool(planned),
        straggler_cv=float(strag["cv"] if straggler_cv is None else straggler_cv),
        straggler_distribution=dist,
    )
