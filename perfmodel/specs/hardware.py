"""Hardware descriptions: datasheet numbers as a pytree, loaded from JSON presets or user files.

A preset (``profiles/hardware/*.json``) gives peak FLOP/s per dtype, HBM bandwidth and capacity,
three link tiers (intra-node, inter-node per GPU, WAN between sites) with bandwidth, latency and
devices per tier, an optional price per device-hour, an optional data-sheet board power
(``board_power_w``) and system power (``system_power_w`` for ``system_gpus`` devices), for the
energy to train (:mod:`perfmodel.plan.training`), the SM count and GEMM tile of wave
quantization, the leaf-group size of the cluster fabric, and the uncalibrated model constants
(see :mod:`perfmodel.specs.constants`). Human units in the file (TFLOPS, GB/s, GiB, µs) are converted to
SI once, here. :class:`HardwareSpec` holds only numbers (array leaves), so that it can be vmapped
and differentiated; names and citations live in the plain :class:`Hardware` wrapper.
"""

from __future__ import annotations

import dataclasses
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from perfmodel.specs.arrays import f32
from perfmodel.specs.choices import Dtype
from perfmodel.specs.constants import Constants, constants_from_dict
from perfmodel.specs.names import aliases, preset_name
from simbase import units
from simbase.errors import AisimError, bad_value, suggest
from simbase.io import read_json

DTYPES = Dtype.labels()  # the keys of peak_tflops, in Dtype code order
TIERS = ("intra_node", "inter_node", "wan")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class HardwareSpec:
    """Numbers of one device type and its links (SI units; all leaves)."""

    peak_flops_per_s: Float[Array, " dtypes"]  # fp32, tf32, bf16, fp16, fp8, fp4; 0 = unsupported
    memory_bandwidth_bytes_per_s: Float[Array, ""]
    memory_capacity_bytes: Float[Array, ""]
    link_bandwidth_bytes_per_s: Float[Array, " tiers"]  # per device, per direction
    link_latency_s: Float[Array, " tiers"]
    # devices on the scale-up tier (tier 0): a node's, or an NVLink domain larger than a node
    # (GB200 NVL72: 72), from ``nvlink_domain_size`` when the file gives it
    gpus_per_node: Float[Array, ""]
    price_per_device_hour_usd: Float[Array, ""]  # NaN when unknown
    # 1 = the node's devices are time-sliced on one host's cores (XLA's CPU devices): the
    # numbers above are the whole host's; 0 = dedicated devices (GPUs). See step_time.
    devices_share_host: Float[Array, ""] = 0.0
    # what the runtime takes per device before the model gets any (CUDA context, NCCL buffers,
    # allocator fragmentation): a strategy fits when its bytes plus this fit the capacity
    memory_reserve_bytes: Float[Array, ""] = 0.0
    # FlashAttention-2's attention throughput over cuDNN's fused attention on this device (the
    # ``fa2`` attention kernel; 1 where they match or it was not measured)
    fa2_attention_ratio: Float[Array, ""] = 1.0
    # streaming multiprocessors and the output tile of a large 16-bit GEMM (one tile per SM at
    # a time): what wave quantization counts (perfmodel.step.roofline); 0 SMs = not modelled
    sm_count: Float[Array, ""] = 0.0
    gemm_tile_m: Float[Array, ""] = 128.0
    gemm_tile_n: Float[Array, ""] = 256.0
    # scale-up domains (nodes, NVL72 racks) under one rail-optimised leaf group (the DGX
    # SuperPOD scalable unit): a collective spanning more crosses the spine and shares it
    # (perfmodel.step.collectives.fabric_efficiency); 0 = not modelled
    fabric_leaf_domains: Float[Array, ""] = 0.0


@dataclasses.dataclass(frozen=True)
class Hardware:
    """A named hardware preset: the spec, its default constants and where they come from."""

    name: str
    description: str
    spec: HardwareSpec
    constants: Constants
    sources: dict[str, str]
    link_technology: dict[str, str]
    path: str = ""
    # the data sheet's maximum board power per device in watts (None when unknown): the energy
    # to train (perfmodel.plan.training) scales it; it never enters a step time, so it is no leaf
    board_power_w: float | None = None
    # the data sheet's maximum input power of the system that hosts ``system_gpus`` devices
    # (a DGX node, a GB200 NVL72 rack): CPUs, memory, NICs, switches and fans beside the boards
    system_power_w: float | None = None
    system_gpus: int | None = None

    @property
    def host_power_w(self) -> float | None:
        """Maximum power per device beyond its board (the system's share of CPUs, memory, NICs,
        switches and fans): ``system_power_w / system_gpus - board_power_w``; None when
        unknown."""
        if self.system_power_w is None or not self.system_gpus or self.board_power_w is None:
            return None
        return max(self.system_power_w / self.system_gpus - self.board_power_w, 0.0)

    @property
    def device_power_w(self) -> float | None:
        """Maximum power per device with its share of the host (``board_power_w +
        host_power_w``; the board alone when the system's power is unknown)."""
        if self.board_power_w is None:
            return None
        return self.board_power_w + (self.host_power_w or 0.0)

    def replace_spec(self, **changes: Any) -> Hardware:
        """Returns a copy with some spec fields replaced (values in SI units)."""
        new = dataclasses.replace(
            self.spec, **{k: jnp.asarray(v, jnp.float32) for k, v in changes.items()}
        )
        return dataclasses.replace(self, spec=new)


def _presets_dir() -> Path:
    return Path(str(resources.files("perfmodel") / "profiles" / "hardware"))


def hardware_names() -> list[str]:
    """Names of the shipped hardware presets (lowercase, hyphenated)."""
    return sorted(p.stem for p in _presets_dir().glob("*.json"))


# Past this, a hardware number (in its own unit: TFLOP/s, GB/s, GiB, µs, watts, devices) is a
# typo: 1e9 TFLOP/s is a million times any device, and larger values overflow the float32 model
MAX_NUMBER = 1e9


def _number(where: str, field: str, value: Any, unit: str, *, allow_none=False, positive=True):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad_value(where, field, value, f"a number in {unit}")
    if value > MAX_NUMBER:
        raise bad_value(where, field, value, f"a number in {unit} up to {MAX_NUMBER:g}")
    if value < 0 or (positive and value == 0):
        raise bad_value(
            where, field, value, f"a {'positive' if positive else 'non-negative'} number in {unit}"
        )
    return float(value)


def _check_object(doc: Any, where: str) -> None:
    """A JSON object with every required field."""
    if not isinstance(doc, dict):
        raise AisimError(f"{where}: expected a JSON object with hardware fields")
    required = ("peak_tflops", "memory_bandwidth_gb_per_s", "memory_capacity_gib", "links")
    for key in required:
        if key not in doc:
            raise AisimError(
                f"{where}: missing field '{key}' (the shipped presets in "
                "perfmodel/profiles/hardware/ show every field)"
            )


def _peak_flops(peaks: Any, where: str) -> list[float]:
    """FLOP/s per dtype in :class:`Dtype` code order from ``peak_tflops`` (0 where the device
    lacks the dtype; fp32 is required)."""
    if not isinstance(peaks, dict):
        raise bad_value(where, "peak_tflops", peaks, "an object {fp32: TFLOPS, bf16: TFLOPS, ...}")
    unknown = set(peaks) - set(DTYPES)
    if unknown:
        raise bad_value(
            where, "peak_tflops", sorted(unknown)[0], f"dtype keys among {', '.join(DTYPES)}"
        )
    peak = []
    for dt in DTYPES:
        v = _number(where, f"peak_tflops.{dt}", peaks.get(dt), "TFLOP/s", allow_none=True)
        peak.append(0.0 if v is None else v * units.TERA)
    if peak[Dtype.FP32] == 0.0:
        raise AisimError(
            f"{where}: field 'peak_tflops.fp32' is missing: expected a positive number in TFLOP/s"
        )
    return peak


class _Links(NamedTuple):
    """The link tiers of :data:`TIERS`, in SI, and each tier's technology (text)."""

    bandwidth_bytes_per_s: list[float]
    latency_s: list[float]
    technology: dict[str, str]


def _links(links: Any, where: str) -> _Links:
    """Bandwidth (GB/s) and latency (µs) of each tier of ``links``, converted to SI."""
    if not isinstance(links, dict):
        raise bad_value(
            where, "links", links, "an object with intra_node, inter_node and wan tiers"
        )
    bw, lat, tech = [], [], {}
    for tier in TIERS:
        if tier not in links:
            raise AisimError(
                f"{where}: missing field 'links.{tier}' (bandwidth_gb_per_s, latency_us)"
            )
        t = links[tier]
        bw.append(
            _number(where, f"links.{tier}.bandwidth_gb_per_s", t.get("bandwidth_gb_per_s"), "GB/s")
            * units.GIGA
        )
        lat.append(
            _number(
                where,
                f"links.{tier}.latency_us",
                t.get("latency_us"),
                "microseconds",
                positive=False,
            )
            * units.US
        )
        tech[tier] = str(t.get("technology", ""))
    return _Links(bw, lat, tech)


def _gemm_tile(doc: dict[str, Any], where: str) -> list[int]:
    """``gemm_tile``: [rows, columns] of a GEMM output tile, positive integers."""
    tile = doc.get("gemm_tile", [128, 256])
    if (
        not isinstance(tile, list)
        or len(tile) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in tile)
    ):
        raise bad_value(where, "gemm_tile", tile, "[rows, columns] of a GEMM output tile")
    return tile


def _optional_fields(doc: dict[str, Any], where: str) -> dict[str, float]:
    """The optional :class:`HardwareSpec` fields, validated and in SI, by field name (a price
    not given is NaN; the others take their defaults)."""
    price = doc.get("price_per_device_hour_usd")
    price = _number(
        where, "price_per_device_hour_usd", price, "USD per device-hour", allow_none=True
    )
    gpn = _number(where, "gpus_per_node", doc.get("gpus_per_node", 8), "devices per node")
    gpn = _number(where, "nvlink_domain_size", doc.get("nvlink_domain_size", gpn), "devices")
    reserve = _number(
        where, "memory_reserve_gib", doc.get("memory_reserve_gib", 0.0), "GiB", positive=False
    )
    fa2 = doc.get("fa2_attention_ratio", 1.0)
    if isinstance(fa2, bool) or not isinstance(fa2, int | float) or not 0 < fa2 <= 1:
        raise bad_value(where, "fa2_attention_ratio", fa2, "a fraction in (0, 1]")
    sms = _number(where, "sm_count", doc.get("sm_count", 0), "SMs per device", positive=False)
    tile = _gemm_tile(doc, where)
    leaf = _number(
        where, "fabric_leaf_domains", doc.get("fabric_leaf_domains", 0), "domains", positive=False
    )
    shared = doc.get("devices_share_host", False)
    if not isinstance(shared, bool):
        raise bad_value(where, "devices_share_host", shared, "true or false")
    return dict(
        gpus_per_node=gpn,
        price_per_device_hour_usd=math.nan if price is None else price,
        devices_share_host=float(shared),
        memory_reserve_bytes=reserve * units.GIB,
        fa2_attention_ratio=float(fa2),
        sm_count=sms,
        gemm_tile_m=float(tile[0]),
        gemm_tile_n=float(tile[1]),
        fabric_leaf_domains=leaf,
    )


def _power(doc: dict[str, Any], where: str) -> tuple[float | None, float | None, int | None]:
    """(board watts, system watts, devices per system), None where not given; a system's
    power needs the devices it hosts."""
    power = _number(where, "board_power_w", doc.get("board_power_w"), "watts", allow_none=True)
    system = _number(where, "system_power_w", doc.get("system_power_w"), "watts", allow_none=True)
    system_gpus = doc.get("system_gpus")
    if system is not None and (
        isinstance(system_gpus, bool) or not isinstance(system_gpus, int) or system_gpus < 1
    ):
        raise bad_value(where, "system_gpus", system_gpus, "the devices the system hosts")
    return power, system, (system_gpus if system is not None else None)


def hardware_from_dict(doc: dict[str, Any], where: str = "<dict>") -> Hardware:
    """Validates a hardware description (the JSON schema of the presets) and converts it to SI.

    Args:
      doc: the parsed JSON (peak_tflops per dtype, memory_bandwidth_gb_per_s,
        memory_capacity_gib, links per tier, optional constants, price and gpus_per_node).
      where: the source named in errors (a file path).

    Returns:
      A :class:`Hardware`: the SI :class:`HardwareSpec` (FLOP/s, bytes/s, bytes, seconds) and
      the preset's default :class:`~perfmodel.specs.constants.Constants`.

    Raises:
      AisimError: naming ``where``, the field, the bad value and the expected unit.
    """
    _check_object(doc, where)
    peak = _peak_flops(doc["peak_tflops"], where)
    links = _links(doc["links"], where)
    optional = _optional_fields(doc, where)
    bandwidth = _number(
        where, "memory_bandwidth_gb_per_s", doc["memory_bandwidth_gb_per_s"], "GB/s"
    )
    capacity = _number(where, "memory_capacity_gib", doc["memory_capacity_gib"], "GiB")
    spec = HardwareSpec(
        peak_flops_per_s=f32(peak),
        memory_bandwidth_bytes_per_s=f32(bandwidth * units.GIGA),
        memory_capacity_bytes=f32(capacity * units.GIB),
        link_bandwidth_bytes_per_s=f32(links.bandwidth_bytes_per_s),
        link_latency_s=f32(links.latency_s),
        **{name: f32(value) for name, value in optional.items()},
    )
    consts = constants_from_dict(doc.get("constants", {}), spec.link_latency_s, where)
    power, system, system_gpus = _power(doc, where)
    return Hardware(
        name=str(doc.get("name", Path(where).stem)).lower(),
        description=str(doc.get("description", "")),
        spec=spec,
        constants=consts,
        sources=dict(doc.get("sources", {})),
        link_technology=links.technology,
        path=where,
        board_power_w=power,
        system_power_w=system,
        system_gpus=system_gpus,
    )


def load_hardware_file(path: str | Path) -> Hardware:
    """Loads and validates a user hardware JSON file (same schema as the presets).

    Raises:
      AisimError: a missing or unreadable file, invalid JSON, or a bad field (naming the file,
        the field, the value and the expected unit).
    """
    return hardware_from_dict(read_json(path, "file"), str(path))


def load_hardware(name: str) -> Hardware:
    """Loads a shipped preset by name or alias, case-insensitively (``A100-80GB`` ==
    ``a100-80gb``; ``H100`` names ``h100-sxm``: :mod:`perfmodel.specs.names`).

    Args:
      name: a name in :func:`hardware_names`, or one of a preset's ``aliases``.

    Returns:
      The validated :class:`Hardware`.

    Raises:
      AisimError: unknown name, with the closest names suggested.
    """
    key = preset_name(name, _presets_dir())
    if key is None:
        raise AisimError(
            f"unknown hardware preset {name!r}{suggest(name.strip(), hardware_names())}"
        )
    path = _presets_dir() / f"{key}.json"
    return hardware_from_dict(json.loads(path.read_text()), str(path))


def hardware_preset_name(name: str) -> str | None:
    """The preset that ``name`` names (its file name or an alias), or None."""
    return preset_name(name, _presets_dir())


def hardware_aliases() -> dict[str, list[str]]:
    """Preset name -> the other names it answers to (its file's ``aliases``)."""
    return aliases(_presets_dir())


def peak_for_dtype(spec: HardwareSpec, dtype_code) -> Float[Array, ""]:
    """Peak FLOP/s of the tensor units for a :class:`~perfmodel.specs.choices.Dtype` code (0 when the
    device lacks the dtype)."""
    return spec.peak_flops_per_s[jnp.asarray(dtype_code, jnp.int32)]
