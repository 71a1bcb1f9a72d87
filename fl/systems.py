"""Systems heterogeneity: device presets, per-client device draws and client round time.

Contract: presets are JSON files in ``fl/profiles`` whose every value cites a source
(``{"value": ..., "source": ...}``); :func:`load_profile` converts them to SI once.
:func:`draw_systems` gives every client of a population a device (a mix of presets, with a
lognormal spread) as population-wide arrays. :func:`client_time_s` is the time of one client in
one round, written for one client: download + deserialise + local compute + serialise + upload,
with the transfers timed by ``perfmodel.step.collectives.p2p_s`` (``α + n/β``).
"""

from __future__ import annotations

import dataclasses
import json
from importlib import resources

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from fl.choices import unknown_name
from perfmodel.step.collectives import p2p_s
from simbase.errors import AisimError, bad_value
from simbase.parse import split_list
from simbase.units import parse_bitrate

# fl/profiles/trace_*.json describe trace generators (fl.traces), not devices.
TRACE_PREFIX = "trace_"

_FIELDS = (
    "flops_per_s",
    "downlink",
    "uplink",
    "latency_s",
    "availability",
    "serialize_bytes_per_s",
    "spread_sigma",
)


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """One device preset in SI units."""

    name: str
    flops_per_s: float
    downlink_bytes_per_s: float
    uplink_bytes_per_s: float
    latency_s: float
    availability: float
    serialize_bytes_per_s: float
    spread_sigma: float


def profile_names() -> list[str]:
    """Names of the shipped device presets."""
    files = resources.files("fl") / "profiles"
    names = (p.name[:-5] for p in files.iterdir() if p.name.endswith(".json"))
    return sorted(n for n in names if not n.startswith(TRACE_PREFIX))


def load_profile(name: str) -> DeviceProfile:
    """Loads a shipped preset by name and converts it to SI (bit rates to bytes/s).

    Raises:
      AisimError: an unknown name (``field`` ``devices``), or a preset file that lacks a value
        or its source.
    """
    names = profile_names()
    if name not in names:
        raise unknown_name("devices", name, names, "device preset")
    where = f"fl/profiles/{name}.json"
    raw = json.loads((resources.files("fl") / "profiles" / f"{name}.json").read_text())
    vals = {}
    for f in _FIELDS:
        entry = raw.get(f)
        if not isinstance(entry, dict) or "value" not in entry or not entry.get("source"):
            raise bad_value(where, f, entry, '{"value": ..., "source": "..."}', usage=False)
        vals[f] = entry["value"]
    try:
        down = parse_bitrate(vals["downlink"])
        up = parse_bitrate(vals["uplink"])
    except ValueError as e:
        raise AisimError(f"{where}: {e}", usage=False) from None
    return DeviceProfile(
        name=name,
        flops_per_s=float(vals["flops_per_s"]),
        downlink_bytes_per_s=down,
        uplink_bytes_per_s=up,
        latency_s=float(vals["latency_s"]),
        availability=float(vals["availability"]),
        serialize_bytes_per_s=float(vals["serialize_bytes_per_s"]),
        spread_sigma=float(vals["spread_sigma"]),
    )


def parse_mix(text: str) -> dict[str, float]:
    """Parses ``"phone:0.7,laptop:0.3"`` (or ``"phone"``) into preset weights summing to 1.

    Raises:
      AisimError: ``field`` ``devices`` (``source`` ``None``): an unknown preset, a weight that
        is not a non-negative number, or weights that sum to zero.
    """
    mix: dict[str, float] = {}
    for item in split_list(text) or [""]:
        name, _, w = item.partition(":")
        load_profile(name)
        try:
            weight = float(w) if w else 1.0
        except ValueError:
            raise bad_value(None, "devices", item, "weights such as phone:0.7") from None
        if not weight >= 0:
            raise bad_value(None, "devices", item, "non-negative weights such as phone:0.7")
        mix[name] = mix.get(name, 0.0) + weight
    total = sum(mix.values())
    if total <= 0:
        raise bad_value(None, "devices", text, "weights with a positive sum")
    return {k: v / total for k, v in mix.items()}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Systems:
    """Per-client device properties for a whole population (all ``[clients]``, SI).

    ``hourly_availability`` (``[clients, 24]``, from a trace, :mod:`fl.traces`) is the chance
    that a client can train in each UTC hour of the simulated day; ``None``: ``availability``,
    the chance that a sampled client answers, holds at all hours.
    """

    flops_per_s: Float[Array, " clients"]
    downlink_bytes_per_s: Float[Array, " clients"]
    uplink_bytes_per_s: Float[Array, " clients"]
    latency_s: Float[Array, " clients"]
    availability: Float[Array, " clients"]
    serialize_bytes_per_s: Float[Array, " clients"]
    hourly_availability: Float[Array, "clients 24"] | None = None


def draw_systems(mix: dict[str, float], num_clients: int, rng: np.random.Generator) -> Systems:
    """Gives each client a preset drawn from ``mix``, with speed and bandwidth multiplied by
    ``lognormal(0, spread_sigma)`` of that preset."""
    profiles = [load_profile(n) for n in mix]
    kind = rng.choice(len(profiles), num_clients, p=np.array(list(mix.values())))

    def field(name, spread):
        base = np.array([getattr(p, name) for p in profiles])[kind]
        if spread:
            sig = np.array([p.spread_sigma for p in profiles])[kind]
            base = base * rng.lognormal(0.0, 1.0, num_clients) ** sig
        return jnp.asarray(base, jnp.float32)

    return Systems(
        flops_per_s=field("flops_per_s", True),
        downlink_bytes_per_s=field("downlink_bytes_per_s", True),
        uplink_bytes_per_s=field("uplink_bytes_per_s", True),
        latency_s=field("latency_s", False),
        availability=field("availability", False),
        serialize_bytes_per_s=field("serialize_bytes_per_s", False),
    )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ClientTime:
    """One client's round time, by term (seconds)."""

    download_s: Float[Array, ""]
    compute_s: Float[Array, ""]
    serialize_s: Float[Array, ""]
    upload_s: Float[Array, ""]

    @property
    def comm_s(self) -> Float[Array, ""]:
        return self.download_s + self.serialize_s + self.upload_s

    @property
    def total_s(self) -> Float[Array, ""]:
        return self.comm_s + self.compute_s


def client_time_s(
    local_flops: ArrayLike,
    down_bytes: ArrayLike,
    up_bytes: ArrayLike,
    flops_per_s: ArrayLike,
    downlink_bytes_per_s: ArrayLike,
    uplink_bytes_per_s: ArrayLike,
    latency_s: ArrayLike,
    serialize_bytes_per_s: ArrayLike,
) -> ClientTime:
    """Round time of one client: ``p2p(down) + (down+up)/ser + F/flops + p2p(up)`` seconds.

    Args:
      local_flops: FLOPs of the client's local training this round.
      down_bytes: bytes of the model (and control variates) sent to the client.
      up_bytes: bytes of the update (and control variates) sent back.
      flops_per_s: the device's training speed.
      downlink_bytes_per_s: the link's rate towards the client (β).
      uplink_bytes_per_s: the link's rate from the client (β).
      latency_s: the link's latency (α).
      serialize_bytes_per_s: the rate of (de)serialising the payload.
    """
    return ClientTime(
        download_s=p2p_s(down_bytes, latency_s, downlink_bytes_per_s),
        compute_s=local_flops / flops_per_s,
        serialize_s=(down_bytes + up_bytes) / serialize_bytes_per_s,
        upload_s=p2p_s(up_bytes, latency_s, uplink_bytes_per_s),
    )
