"""A collaboration scenario from the words people type: sizes, link speeds, counts and names.

Contract: :func:`scenario_from_text` turns the textual settings of a cross-site collaboration
(``"1Gbps"``, ``"64,128"``, ``"a100-80gb,h100-sxm"``) into a validated
:class:`perfmodel.collab_scenario.Scenario`, and :func:`parse_sizes` a list of model sizes. Every bad
setting raises one :class:`~simbase.errors.AisimError` with ``source=None`` and ``field`` =
the parameter's name (``wan_bandwidth``, ``sizes``, ``num_microbatches``); a front end maps the
field to its own name for it (the command line's ``--wan-bandwidth``).
"""

from __future__ import annotations

import math
from pathlib import Path

from perfmodel.collab_model import SERDE_FORMATS
from perfmodel.collab_scenario import SERDE_DEFAULT_BYTES_PER_S, Scenario
from perfmodel.hardware import Hardware, load_hardware, load_hardware_file
from simbase import units
from simbase.errors import bad_value
from simbase.parse import split_list

SPEED = "a positive link speed like 1Gbps or 100Mbps"


def parse_list(text: str, field: str) -> list[str]:
    """``"a, b"`` -> ``["a", "b"]``; an empty list is an error naming ``field``."""
    parts = split_list(text)
    if not parts:
        raise bad_value(None, field, text, "a comma-separated list")
    return parts


def parse_sizes(text: str, field: str = "sizes") -> list[str]:
    """Model sizes as typed (``"10M,100M"`` -> ``["10M", "100M"]``), each a count of at least 8
    parameters (the standard square MLP has 8 layers)."""
    sizes = parse_list(text, field)
    for s in sizes:
        try:
            if units.parse_count(s) < 8:
                raise ValueError
        except ValueError:
            raise bad_value(None, field, s, "parameter counts like 10M,100M or 1.5B") from None
    return sizes


def parse_rates(text: str | None, field: str) -> tuple[float, ...] | None:
    """Link speeds (``"1Gbps,100Mbps"``) in bytes per second; ``None`` stays ``None``."""
    if text is None:
        return None
    out = []
    for p in parse_list(text, field):
        try:
            v = units.parse_bitrate(p)
        except ValueError:
            raise bad_value(None, field, p, SPEED) from None
        if not v > 0:
            raise bad_value(None, field, p, SPEED)
        out.append(v)
    return tuple(out)


def parse_counts(text: str | None, field: str) -> tuple[int, ...] | None:
    """Positive integers such as ``"64"`` or ``"60k,1M"``; ``None`` stays ``None``."""
    if text is None:
        return None
    out = []
    for p in parse_list(text, field):
        try:
            v = units.parse_count(p)
        except ValueError:
            raise bad_value(None, field, p, "positive numbers like 64 or 60k") from None
        if v <= 0 or v != int(v):
            raise bad_value(None, field, p, "positive integers")
        out.append(int(v))
    return tuple(out)


def hardware_by_name(name: str) -> Hardware:
    """A hardware preset by name, or a hardware description file when ``name`` ends in .json."""
    if name.lower().endswith(".json"):
        return load_hardware_file(Path(name))
    return load_hardware(name)


def _check_per_site(text: str | None, values: tuple | None, field: str, clients: int) -> None:
    if values is not None and len(values) not in (1, clients):
        raise bad_value(None, field, text, f"1 value or one per client ({clients})")


def scenario_from_text(
    *,
    clients: int = 2,
    client_hardware: str = "a100-80gb",
    devices: str = "1",
    batch_size: str = "64",
    local_samples: str = "60000",
    local_steps: str | None = None,
    wan_bandwidth: str = "1Gbps",
    wan_up: str | None = None,
    wan_down: str | None = None,
    wan_latency_ms: float | None = None,
    mode: str = "fedavg",
    topology: str = "server",
    compression: str = "none",
    topk_fraction: float = 0.01,
    num_microbatches: int = 8,
    aggregator_hardware: str = "cpu-host",
    dtype: str = "fp32",
    serde_format: str = "msgpack",
) -> Scenario:
    """A validated :class:`perfmodel.collab_scenario.Scenario` from textual settings.

    Per-client settings take one value (for every client) or one per client, comma-separated.

    Args:
      clients: participants (sites).
      client_hardware: hardware preset names (or ``.json`` files) per client.
      devices: devices per client, positive integers.
      batch_size: samples per device per local step, positive integers.
      local_samples: training samples per client, positive integers (``60k``).
      local_steps: optimiser steps per round; ``None``: one epoch of ``local_samples``.
      wan_bandwidth: WAN line rate per client, both ways (``1Gbps``).
      wan_up: WAN rate towards the aggregator; ``None``: ``wan_bandwidth``.
      wan_down: WAN rate from the aggregator; ``None``: ``wan_bandwidth``.
      wan_latency_ms: one-way WAN latency (milliseconds); ``None``: the preset's.
      mode: ``fedavg``, ``data-parallel`` or ``pipeline``.
      topology: ``server`` or ``ring``.
      compression: ``none``, ``fp16``, ``int8`` or ``topk`` (of the exchanged values).
      topk_fraction: the fraction of values kept by ``topk``.
      num_microbatches: microbatches per step in ``pipeline`` mode.
      aggregator_hardware: the parameter server's preset.
      dtype: compute dtype at the sites.
      serde_format: one of :data:`perfmodel.SERDE_FORMATS` (its default throughputs).

    Raises:
      AisimError: the first bad setting, ``source=None`` and ``field`` the parameter's name.
    """
    if isinstance(clients, bool) or not isinstance(clients, int) or clients < 1:
        raise bad_value(None, "clients", clients, "a positive number of participants")
    if serde_format not in SERDE_FORMATS:
        raise bad_value(None, "serde_format", serde_format, "one of " + ", ".join(SERDE_FORMATS))
    names = parse_list(client_hardware, "client_hardware")
    if len(names) not in (1, clients):
        raise bad_value(None, "client_hardware", client_hardware, f"one name or {clients} names")
    hws = [hardware_by_name(n) for n in names] * (clients if len(names) == 1 else 1)
    if wan_latency_ms is not None and not (math.isfinite(wan_latency_ms) and wan_latency_ms >= 0):
        raise bad_value(
            None, "wan_latency_ms", wan_latency_ms, "a non-negative number of milliseconds"
        )
    per_site = {
        "devices": (devices, parse_counts(devices, "devices")),
        "batch_size": (batch_size, parse_counts(batch_size, "batch_size")),
        "local_samples": (local_samples, parse_counts(local_samples, "local_samples")),
        "local_steps": (local_steps, parse_counts(local_steps, "local_steps")),
        "wan_bandwidth": (wan_bandwidth, parse_rates(wan_bandwidth, "wan_bandwidth")),
        "wan_up": (wan_up, parse_rates(wan_up, "wan_up")),
        "wan_down": (wan_down, parse_rates(wan_down, "wan_down")),
    }
    for field, (text, values) in per_site.items():
        _check_per_site(text, values, field, clients)
    v = {k: values for k, (_, values) in per_site.items()}
    ser, deser = SERDE_DEFAULT_BYTES_PER_S[serde_format]
    return Scenario(
        hardware=tuple(hws),
        aggregator=hardware_by_name(aggregator_hardware),
        devices=v["devices"],
        micro_batch_size=v["batch_size"],
        local_samples=v["local_samples"],
        local_steps=v["local_steps"],
        up_bytes_per_s=v["wan_up"] or v["wan_bandwidth"],
        down_bytes_per_s=v["wan_down"] or v["wan_bandwidth"],
        latency_s=None if wan_latency_ms is None else wan_latency_ms * units.MS,
        serialize_bytes_per_s=ser,
        deserialize_bytes_per_s=deser,
        mode=mode,
        topology=topology,
        compression=compression,
        topk_fraction=topk_fraction,
        num_microbatches=num_microbatches,
        dtype=dtype,
    )
