"""A collaboration from the words people type: sizes, link speeds, counts and names.

Contract: :func:`scenario_from_text` turns the textual settings of a collaboration of the
standard MLPs (``"1Gbps"``, ``"64,128"``, ``"a100-80gb,h100-sxm"``) into a validated
:class:`collab.Scenario` (a collab profile applied), and :func:`cross_site_from_text` those of a
real model across sites into a :class:`collab.CrossSite` (the sites' strategy knobs, stack and
calibrated profile as :func:`perfmodel.estimate` takes them); :func:`measure_serde_profile` times
the serialisation formats named as text. Per-site settings take one value (for
every site) or one per site, comma-separated. Every bad setting raises one
:class:`~simbase.errors.AisimError` with ``source=None`` and ``field`` the parameter's name
(``wan_bandwidth``, ``sizes``, ``num_microbatches``; a site's knobs under the registry's names,
its devices as ``num_gpus``); a front end maps the field to its own name for it (the command
line's ``--wan-bandwidth``). Values are checked for range and finiteness before any work.
"""

from __future__ import annotations

import math
from pathlib import Path

from calibration.profile import load_profile_constants, read_profile
from collab.cross_site import CrossSite, check_round
from collab.profile import apply_profile, serde_profile
from collab.scenario import SERDE_DEFAULT_BYTES_PER_S, Scenario
from collab.scenario_model import SERDE_FORMATS, WAN
from collab.serialisation import check_formats, measure_serde, serde_throughputs
from perfmodel import Hardware, load_hardware, load_hardware_file, load_stack, resolve_model
from simbase import read_json, units
from simbase.errors import bad_value
from simbase.parse import split_list

SPEED = "a positive link speed like 1Gbps or 100Mbps, at most 1Pbps"
MAX_SITES = 1024  # sites are stacked on one axis; more is a typo, not a collaboration
MAX_COUNT = 2**31 - 1
MAX_PARAMS = 1e15
MAX_BITS_PER_S = 1e15
# what a site of a real model runs when not told, with its sources (data/site_recipe.json): the
# knobs (perf estimate's defaults differ), and those that apply only where no stack is named
_SITE_RECIPE = read_json(Path(__file__).parent / "data" / "site_recipe.json", "site recipe")
SITE_DEFAULTS: dict = _SITE_RECIPE["knobs"]
NO_STACK_DEFAULTS: dict = _SITE_RECIPE["without_stack"]


def parse_list(text: str | None, field: str) -> list[str]:
    """``"a, b"`` -> ``["a", "b"]``; an empty list is an error naming ``field``."""
    parts = split_list(text)
    if not parts:
        raise bad_value(None, field, text, "a comma-separated list")
    return parts


def parse_sizes(text: str, field: str = "sizes") -> list[str]:
    """Model sizes as typed (``"10M,100M"`` -> ``["10M", "100M"]``), each a count of 8 to 1e15
    parameters (the standard square MLP has 8 layers)."""
    sizes = parse_list(text, field)
    for s in sizes:
        try:
            if not 8 <= units.parse_count(s) <= MAX_PARAMS:
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
        if not 0 < v * units.BITS_PER_BYTE <= MAX_BITS_PER_S:
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
        if not 0 < v <= MAX_COUNT or v != int(v):
            raise bad_value(None, field, p, f"positive integers up to {MAX_COUNT}")
        out.append(int(v))
    return tuple(out)


def parse_seconds(text: str | None, field: str) -> tuple[float, ...] | None:
    """Positive, finite seconds such as ``"40"`` or ``"40,35"``; ``None`` stays ``None``."""
    if text is None:
        return None
    out = []
    for p in parse_list(text, field):
        try:
            v = float(p)
        except ValueError:
            v = -1.0
        if not 0 < v < math.inf:
            raise bad_value(None, field, p, "positive seconds, one value or one per site")
        out.append(v)
    return tuple(out)


def hardware_by_name(name: str) -> Hardware:
    """A hardware preset by name, or a hardware description file when ``name`` ends in .json."""
    if name.lower().endswith(".json"):
        return load_hardware_file(Path(name))
    return load_hardware(name)


def _per_site(values: tuple | None, text, field: str, clients: int) -> tuple | None:
    if values is not None and len(values) not in (1, clients):
        raise bad_value(None, field, text, f"1 value or one per client ({clients})")
    return values


def _parse_per_site(specs, clients: int) -> dict[str, tuple | None]:
    """Each ``(field, text, parse)`` of ``specs`` parsed and checked to hold one value or one
    per site."""
    return {f: _per_site(parse(text, f), text, f, clients) for f, text, parse in specs}


def _sites(clients, client_hardware: str) -> list[Hardware]:
    """The sites' hardware (one name for all, or one per site)."""
    if isinstance(clients, bool) or not isinstance(clients, int) or not 1 <= clients <= MAX_SITES:
        raise bad_value(None, "clients", clients, f"1 to {MAX_SITES} participants")
    names = parse_list(client_hardware, "client_hardware")
    if len(names) not in (1, clients):
        raise bad_value(None, "client_hardware", client_hardware, f"one name or {clients} names")
    return [hardware_by_name(n) for n in names] * (clients if len(names) == 1 else 1)


def _number(value, field: str, ok, expected: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad_value(None, field, value, expected)
    if not ok(value):
        raise bad_value(None, field, value, expected)
    return float(value)


def _latency_s(wan_latency_ms: float | None) -> float | None:
    if wan_latency_ms is None:
        return None
    # an hour is far beyond any link's round trip (a geostationary hop is 0.6 s)
    ms = _number(
        wan_latency_ms, "wan_latency_ms", lambda x: 0 <= x <= 3.6e6, "milliseconds from 0 to 3.6e6"
    )
    return ms * units.MS


def _scenario_serde_rates(serde_format: str) -> tuple[float, float]:
    """The default (serialise, deserialise) bytes per second of one of :data:`SERDE_FORMATS`."""
    if serde_format not in SERDE_FORMATS:
        raise bad_value(None, "serde_format", serde_format, "one of " + ", ".join(SERDE_FORMATS))
    return SERDE_DEFAULT_BYTES_PER_S[serde_format]


def _scenario_sites(
    clients, devices, batch_size, local_samples, local_steps, wan_bandwidth, wan_up, wan_down
) -> dict:
    """The per-site settings of :func:`scenario_from_text` as :class:`collab.Scenario` fields,
    each one value or one per site (the WAN's up and down rates default to ``wan_bandwidth``)."""
    v = _parse_per_site(
        (
            ("devices", devices, parse_counts),
            ("batch_size", batch_size, parse_counts),
            ("local_samples", local_samples, parse_counts),
            ("local_steps", local_steps, parse_counts),
            ("wan_bandwidth", wan_bandwidth, parse_rates),
            ("wan_up", wan_up, parse_rates),
            ("wan_down", wan_down, parse_rates),
        ),
        clients,
    )
    return dict(
        devices=v["devices"],
        micro_batch_size=v["batch_size"],
        local_samples=v["local_samples"],
        local_steps=v["local_steps"],
        up_bytes_per_s=v["wan_up"] or v["wan_bandwidth"],
        down_bytes_per_s=v["wan_down"] or v["wan_bandwidth"],
    )


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
    profile: str | Path | None = None,
) -> Scenario:
    """A validated :class:`collab.Scenario` of the standard MLPs from textual settings.

    Args:
      clients: participants (sites), 1 to :data:`MAX_SITES`.
      client_hardware: hardware preset names (or ``.json`` files) per client.
      devices: devices per client, positive integers.
      batch_size: samples per device per local step, positive integers.
      local_samples: training samples per client, positive integers (``60k``).
      local_steps: optimiser steps per round; ``None``: one epoch of ``local_samples``.
      wan_bandwidth: WAN line rate per client, both ways (``1Gbps``).
      wan_up, wan_down: WAN rates towards and from the aggregator; ``None``: ``wan_bandwidth``.
      wan_latency_ms: one-way WAN latency (milliseconds); ``None``: the preset's (or profile's).
      mode: ``fedavg``, ``data-parallel`` or ``pipeline``.
      topology: ``server`` or ``ring``.
      compression: ``none``, ``fp16``, ``int8`` or ``topk`` (of the exchanged values).
      topk_fraction: the fraction of values kept by ``topk``.
      num_microbatches: microbatches per step in ``pipeline`` mode.
      aggregator_hardware: the parameter server's preset.
      dtype: compute dtype at the sites.
      serde_format: one of :data:`collab.SERDE_FORMATS` (its default throughputs).
      profile: a collab profile (``aisim collab fit`` or ``measure-serde``) applied on top.

    Raises:
      AisimError: the first bad setting, ``source=None`` and ``field`` the parameter's name.
    """
    hws = _sites(clients, client_hardware)
    ser, deser = _scenario_serde_rates(serde_format)
    latency = _latency_s(wan_latency_ms)
    sites = _scenario_sites(
        clients, devices, batch_size, local_samples, local_steps, wan_bandwidth, wan_up, wan_down
    )
    sc = Scenario(
        hardware=tuple(hws),
        aggregator=hardware_by_name(aggregator_hardware),
        latency_s=latency,
        serialize_bytes_per_s=ser,
        deserialize_bytes_per_s=deser,
        mode=mode,
        topology=topology,
        compression=compression,
        topk_fraction=topk_fraction,
        num_microbatches=num_microbatches,
        dtype=dtype,
        **sites,
    )
    if profile is not None:
        sc = apply_profile(sc, profile, serde_format, keep_latency=latency is not None)
    return sc


def _site_constants(hws: list[Hardware], profile) -> list | None:
    """Per-site constants of a calibrated profile, or None."""
    if profile is None:
        return None
    doc = read_profile(profile)
    if "collab" in doc and "constants" not in doc:
        raise bad_value(
            str(profile), "collab", "a collab profile",
            "a calibrated profile (constants of the step model) with a real model",
            hint="collab fit/measure-serde profiles apply to the model sizes ({sizes})",
        )  # fmt: skip
    return [load_profile_constants(profile, h.name, h.constants) for h in hws]


def _serde_rates(serde_format: str | None) -> tuple[float, float]:
    fmt = serde_format or "none"
    if fmt == "none":
        return math.inf, math.inf
    if fmt not in SERDE_DEFAULT_BYTES_PER_S:
        expected = "none or one of " + ", ".join(SERDE_DEFAULT_BYTES_PER_S)
        raise bad_value(None, "serde_format", fmt, expected)
    return SERDE_DEFAULT_BYTES_PER_S[fmt]


def _window_bytes(tcp_window: str | None) -> float:
    if tcp_window is None:
        return math.inf
    try:
        window = units.parse_bytes(tcp_window)
    except ValueError:
        window = -1.0
    if not (math.isfinite(window) and window > 0):
        raise bad_value(None, "tcp_window_bytes", tcp_window, "a size like 6MiB or 4MB")
    return window


def _site_batch(knobs: dict | None, batch_size: str | None) -> tuple[dict, str | None]:
    """The sites' knobs that are set, and the batch per site: ``batch_size`` or the registry's
    name for it among the knobs (``global_batch_size``), not both."""
    knobs = {k: v for k, v in (knobs or {}).items() if v is not None}
    if "global_batch_size" in knobs:  # the registry's name for a site's batch
        if batch_size is not None:
            raise bad_value(None, "global_batch_size", knobs["global_batch_size"],
                            "one batch per site",
                            hint="pass {batch_size} or {global_batch_size}, not both")  # fmt: skip
        batch_size = str(knobs.pop("global_batch_size"))
    return knobs, batch_size


def _real_model(model: str, layers: int | None, seq_len: int | None):
    """A model preset, or a model ``.json`` file, with ``layers`` and ``seq_len`` overriding it."""
    is_file = model.lower().endswith(".json")
    return resolve_model(
        None if is_file else model, model_file=Path(model) if is_file else None,
        num_layers=layers, seq_len=seq_len,
    )  # fmt: skip


def _site_values(clients, devices, batch_size, wan_up, wan_down, inner_step_time) -> dict:
    """The per-site settings of :func:`cross_site_from_text` as :class:`collab.CrossSite`
    fields, each one value or one per site (8 devices and 128 sequences by default; the WAN
    rates and inner-step times None when not given)."""
    per_site = _parse_per_site(
        (
            ("num_gpus", devices or "8", parse_counts),
            ("batch_size", batch_size or "128", parse_counts),
            ("wan_up", wan_up, parse_rates),
            ("wan_down", wan_down, parse_rates),
            ("inner_step_s", inner_step_time, parse_seconds),
        ),
        clients,
    )
    return dict(
        devices=per_site["num_gpus"],
        batch_size=per_site["batch_size"],
        up_bytes_per_s=per_site["wan_up"],
        down_bytes_per_s=per_site["wan_down"],
        inner_step_s=per_site["inner_step_s"],
    )


def _link_fields(
    hws, profile, sites, wan_bandwidth, wan_latency_ms, wan_efficiency, serde_format, server
) -> dict:
    """What the exchange costs on the way, as :class:`collab.CrossSite` fields: each site's up
    and down rates (the per-site ones in ``sites``, else the first of ``wan_bandwidth``), the
    sites' calibrated constants (``profile``), the WAN latency and efficiency (default: the
    first site's constants), the (de)serialisation rates and the server's line rate."""
    rates = parse_rates(wan_bandwidth or "1Gbps", "wan_bandwidth")
    up = sites["up_bytes_per_s"] or rates[:1]
    consts = _site_constants(hws, profile)
    base = consts or [h.constants for h in hws]
    latency = _latency_s(wan_latency_ms)
    if latency is None:
        lat = tuple(float(c.link_latency_s[WAN]) for c in base)
    else:
        lat = (latency,)
    if wan_efficiency is None:
        wan_efficiency = float(base[0].link_bandwidth_efficiency[WAN])
    ser, deser = _serde_rates(serde_format)
    server = None if server is None else parse_rates(server, "server_bandwidth")
    return dict(
        up_bytes_per_s=up,
        down_bytes_per_s=sites["down_bytes_per_s"] or up,
        constants=None if consts is None else tuple(consts),
        latency_s=lat,
        wan_efficiency=wan_efficiency,
        serialize_bytes_per_s=ser,
        deserialize_bytes_per_s=deser,
        server_bytes_per_s=None if server is None else server[0],
    )


def _round_fields(
    mode, topology, compression, topk_fraction, fragments, overlap, churn, deadline, window
) -> dict:
    """The round's settings as :class:`collab.CrossSite` fields (default topology ``ring``,
    compression ``fp32``, no deadline)."""
    return dict(
        mode=mode,
        topology=topology or "ring",
        compression=compression or "fp32",
        overlap=overlap,
        fragments=fragments,
        churn_rate=churn,
        deadline_s=0.0 if deadline is None else deadline,
        topk_fraction=topk_fraction,
        window_s=window,
    )


def _site_software(knobs: dict, stack: str | None, hw: Hardware) -> dict:
    """The sites' knobs over :data:`SITE_DEFAULTS` (and :data:`NO_STACK_DEFAULTS` unless a
    ``stack`` is given) and their software stack, as :class:`collab.CrossSite` fields."""
    site_knobs = SITE_DEFAULTS | ({} if stack else NO_STACK_DEFAULTS) | knobs
    return dict(knobs=site_knobs, stack=load_stack(stack, hw))


def cross_site_from_text(
    *,
    model: str,
    layers: int | None = None,
    seq_len: int | None = None,
    clients: int = 2,
    client_hardware: str = "a100-80gb",
    devices: str | None = None,
    batch_size: str | None = None,
    wan_bandwidth: str | None = None,
    wan_up: str | None = None,
    wan_down: str | None = None,
    wan_latency_ms: float | None = None,
    wan_efficiency: float | None = None,
    mode: str = "diloco",
    topology: str | None = None,
    compression: str | None = None,
    topk_fraction: float = 0.01,
    fragments: int = 1,
    overlap: bool = False,
    churn: float = 0.0,
    deadline: float | None = None,
    round_window: float = 0.0,
    inner_step_time: str | None = None,
    server_bandwidth: str | None = None,
    tcp_window: str | None = None,
    serde_format: str | None = None,
    profile: str | Path | None = None,
    knobs: dict | None = None,
    stack: str | None = None,
) -> CrossSite:
    """A validated :class:`collab.CrossSite` of a real model from textual settings.

    Args:
      model: a model preset or a model ``.json`` file; ``layers``, ``seq_len`` override it.
      clients, client_hardware: the sites and their hardware (one name or one per site).
      devices: devices per site (default 8); batch_size: sequences per site per inner step
        (default 128).
      wan_bandwidth: the sites' line rate both ways (the first of a list; a sweep tries each);
        wan_up, wan_down: per-site rates instead; wan_latency_ms: one-way latency (default: the
        preset's); wan_efficiency: achieved fraction of the line rate (default: the preset's).
      mode, topology, compression, topk_fraction, fragments, overlap: the round (defaults
        ``diloco``, ``ring``, ``fp32``).
      churn: fraction of sites replaced per round; deadline: seconds of inner steps after which
        a site is dropped; round_window: the round's fixed length in seconds (0: none).
      inner_step_time: measured seconds per inner step, one value or one per site.
      server_bandwidth: the parameter server's line rate (default: the fastest site's).
      tcp_window: bytes a link keeps in flight, e.g. ``6MiB`` (default: no cap).
      serde_format: ``none`` (tensors sent as they are, the default) or a format.
      profile: a calibrated profile applied to each site's constants.
      knobs: the sites' strategy knobs, as :func:`perfmodel.estimate` takes them (over
        :data:`SITE_DEFAULTS`, and :data:`NO_STACK_DEFAULTS` unless a ``stack`` is given).
      stack: a software stack preset or file.

    Raises:
      AisimError: the first bad setting, ``source=None`` and ``field`` the parameter's name.
    """
    hws = _sites(clients, client_hardware)
    knobs, batch_size = _site_batch(knobs, batch_size)
    m = _real_model(model, layers, seq_len)
    sites = _site_values(clients, devices, batch_size, wan_up, wan_down, inner_step_time)
    links = _link_fields(
        hws, profile, sites, wan_bandwidth, wan_latency_ms, wan_efficiency, serde_format,
        server_bandwidth,
    )  # fmt: skip
    rounds = _round_fields(
        mode, topology, compression, topk_fraction, fragments, overlap, churn, deadline,
        round_window,
    )  # fmt: skip
    software = _site_software(knobs, stack, hws[0])
    cs = CrossSite(
        model=m,
        hardware=tuple(hws),
        tcp_window_bytes=_window_bytes(tcp_window),
        **(sites | links | rounds | software),
    )
    check_round(cs)
    return cs


def measure_serde_profile(
    params: str, formats: str, repeats: int, quick: bool = False
) -> tuple[dict, int]:
    """``aisim collab measure-serde``: times the formats (comma-separated) on the standard MLPs
    of ``params`` (:func:`collab.serialisation.measure_serde`) and returns the profile document
    (:func:`serde_profile`) and the repeats used. ``quick`` caps the sizes at 2M parameters
    and the repeats at 2 (for tests).

    Raises:
      AisimError: a bad size (field ``sizes``), format (``formats``) or ``repeats``.
    """
    sizes = parse_sizes(params)
    fmts = check_formats(parse_list(formats, "formats"))
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= 1000:
        raise bad_value(None, "repeats", repeats, "a positive integer up to 1000")
    if quick:
        sizes = [s if units.parse_count(s) <= 2e6 else "2M" for s in sizes]
        repeats = min(repeats, 2)
    measured = measure_serde(sizes, fmts, repeats)
    return serde_profile(serde_throughputs(measured), [m.to_dict() for m in measured]), repeats
