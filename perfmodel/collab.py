"""Cross-site collaborative training: one synchronous round, per participant, by phase.

Contract: a few sites (participants), each with its own hardware, devices, local data and local
steps, are joined by WAN links (line rate up and down; the efficiency and latency of the site's
``wan`` tier) to a parameter server (``topology="server"``) or to each other in a ring
(``"ring"``). :func:`round_timeline` is pure, jittable and differentiable, written for one model
with scalar leaves and the sites stacked on a leading ``sites`` axis (vmapped in one place,
:func:`_site_work`); :func:`sweep` is the one ``jit(vmap)`` over model sizes. For each site it
returns the seconds of compute, serialise, upload, wait, aggregate, download and deserialise in
one round, and the shares

    compute + communication (upload + download + waiting) + serialisation + other = 100 %,

where *other* is the aggregation (and, in pipeline mode, the optimiser step and fixed overhead).
The round is synchronous, so every site's round lasts as long as the slowest one's, and a site
that finishes early waits; waiting counts as communication (as the source document's table does).

Modes: ``fedavg`` (each site trains a full replica for ``local_steps`` steps, then the models are
averaged), ``data-parallel`` (gradients cross the WAN every step: a round is one step; optionally
compressed to fp16, int8 or top-k) and ``pipeline`` (the model's stages are split over the sites and
activations cross the WAN: perfmodel's pipeline formulas, :func:`perfmodel.step_time.step_time`,
with the WAN as the pipeline tier). Local compute is perfmodel's step time (roofline per layer,
intra-site data parallelism over the site's devices, optimiser), times the local steps, plus a fixed
per-round overhead. Transfers are alpha-beta (:mod:`perfmodel.collectives`). Serialisation is
bytes / throughput of the chosen format (``aisim collab measure-serde`` measures them).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from perfmodel import collectives as coll
from perfmodel.choices import Dtype, Recompute, Schedule, ZeroStage
from perfmodel.constants import Constants
from perfmodel.hardware import HardwareSpec
from perfmodel.roofline import op_time_s
from perfmodel.step_time import step_time
from perfmodel.strategy import ACT_BYTES, Strategy
from perfmodel.workload import ModelSpec, OpClass, tokens_per_sample, total_params

MODES = ("fedavg", "data-parallel", "pipeline")
TOPOLOGIES = ("server", "ring")
COMPRESSIONS = ("none", "fp16", "int8", "topk")
SERDE_FORMATS = ("numpy", "msgpack", "protobuf", "pickle")
# bytes per value sent for each compression: fp32, fp16, int8 (per-tensor scale neglected);
# top-k sends a 4-byte value and a 4-byte index per kept entry (Aji & Heafield 2017)
_VALUE_BYTES = {"none": 4.0, "fp16": 2.0, "int8": 1.0, "topk": 8.0}
_FP32 = 4.0
WAN = 2  # index of the wan tier in the per-tier arrays
SHARE_TERMS = ("compute", "communication", "serialization", "other")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Site:
    """One participant (scalar leaves; a stack of sites adds a leading ``sites`` axis).

    Attributes:
      hw: the site's device and link numbers (its ``wan`` tier is overridden by the line rates).
      consts: efficiencies; ``link_bandwidth_efficiency[2]`` and ``link_latency_s[2]`` are the
        achieved fraction and the one-way latency of the site's WAN link.
      devices: devices at the site (intra-site data parallelism).
      micro_batch_size: samples per device per local step.
      local_steps: optimiser steps per round (fedavg).
      overhead_s: fixed cost per round on the site (data loading, evaluation, launches).
      up_bytes_per_s, down_bytes_per_s: WAN line rate towards and from the aggregator (or ring).
      serialize_bytes_per_s, deserialize_bytes_per_s: (de)serialisation throughput at the site.
      dtype: compute dtype code (a :class:`perfmodel.choices.Dtype`).
    """

    hw: HardwareSpec
    consts: Constants
    devices: Float[Array, ""]
    micro_batch_size: Float[Array, ""]
    local_steps: Float[Array, ""]
    overhead_s: Float[Array, ""]
    up_bytes_per_s: Float[Array, ""]
    down_bytes_per_s: Float[Array, ""]
    serialize_bytes_per_s: Float[Array, ""]
    deserialize_bytes_per_s: Float[Array, ""]
    dtype: Float[Array, ""]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Aggregator:
    """The parameter server (in a ring, its ``time_factor`` scales each site's local reduction).

    Attributes:
      hw, consts: where the average is computed (a memory-bound roofline op).
      time_factor: multiplier on that roofline time (framework overhead; calibrated).
      serialize_bytes_per_s, deserialize_bytes_per_s: the server's (de)serialisation throughput.
    """

    hw: HardwareSpec
    consts: Constants
    time_factor: Float[Array, ""]
    serialize_bytes_per_s: Float[Array, ""]
    deserialize_bytes_per_s: Float[Array, ""]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Setup:
    """Choices of a collaboration (static) and its numeric knobs (leaves)."""

    topk_fraction: Float[Array, ""]
    num_microbatches: Float[Array, ""]
    mode: str = jax.tree.static(default="fedavg")
    topology: str = jax.tree.static(default="server")
    compression: str = jax.tree.static(default="none")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RoundTimeline:
    """One round, per site (leaves ``[sites]``; ``round_s`` is shared). Seconds and percent.

    ``compute_s + communication_s + serialization_s + other_s == round_s`` for every site, with
    ``communication_s = upload_s + download_s + wait_s``, ``serialization_s = serialize_s +
    deserialize_s`` and ``other_s = aggregate_s`` (+ optimiser and overhead in pipeline mode).
    """

    compute_s: Float[Array, " sites"]
    serialize_s: Float[Array, " sites"]
    upload_s: Float[Array, " sites"]
    wait_s: Float[Array, " sites"]
    aggregate_s: Float[Array, " sites"]
    download_s: Float[Array, " sites"]
    deserialize_s: Float[Array, " sites"]
    communication_s: Float[Array, " sites"]
    serialization_s: Float[Array, " sites"]
    other_s: Float[Array, " sites"]
    round_s: Float[Array, ""]
    compute_share_pct: Float[Array, " sites"]
    communication_share_pct: Float[Array, " sites"]
    serialization_share_pct: Float[Array, " sites"]
    other_share_pct: Float[Array, " sites"]
    upload_bytes: Float[Array, ""]
    download_bytes: Float[Array, ""]
    params: Float[Array, ""]


def payload_bytes(params, num_sites, setup: Setup) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """Bytes one site uploads and downloads per synchronisation.

    Top-k keeps ``k·params`` entries; the server's average of ``P`` sparse updates has up to
    ``P·k·params`` entries, never more than the dense fp32 vector.
    """
    up = (
        params
        * _VALUE_BYTES[setup.compression]
        * (setup.topk_fraction if setup.compression == "topk" else 1.0)
    )
    if setup.compression == "topk":
        down = jnp.minimum(num_sites * up, params * _FP32)
    else:
        down = up
    return up, down


def _local_strategy(site: Site, pp, num_microbatches, gpus_per_node) -> Strategy:
    one = jnp.ones((), jnp.float32)
    return Strategy(
        dp=site.devices,
        tp=one,
        pp=pp,
        micro_batch_size=site.micro_batch_size,
        num_microbatches=num_microbatches,
        interleave=one,
        schedule=jnp.asarray(float(Schedule.ONE_F_ONE_B), jnp.float32),
        zero_stage=float(ZeroStage.NONE) * one,
        recompute=float(Recompute.NONE) * one,
        sequence_parallel=0.0 * one,
        dtype=site.dtype,
        dp_overlap=one,
        fused_attention=0.0 * one,
        gpus_per_node=gpus_per_node,
    )


def local_step_s(m: ModelSpec, site: Site) -> Float[Array, ""]:
    """Seconds of one local optimiser step at a site (perfmodel's step time, dp over its devices)."""
    s = _local_strategy(
        site, jnp.ones((), jnp.float32), jnp.ones((), jnp.float32), site.hw.gpus_per_node
    )
    return step_time(m, site.hw, site.consts, s).step_time_s


def _wan_link(site: Site, line_rate):
    return site.consts.link_latency_s[WAN], line_rate * site.consts.link_bandwidth_efficiency[WAN]


def _reduce_s(hw: HardwareSpec, consts: Constants, params, inputs) -> Float[Array, ""]:
    """Roofline time of averaging ``inputs`` fp32 vectors of ``params`` values (memory-bound)."""
    op = OpClass(
        flops=inputs * params,
        bytes=(inputs + 1.0) * params * _FP32,
        kernels=jnp.maximum(inputs, 1.0),
        tensor=False,
    )
    peak = hw.peak_flops_per_s[0]
    return op_time_s(op, consts, peak, peak, hw.memory_bandwidth_bytes_per_s)


def _site_work(m: ModelSpec, site: Site, agg: Aggregator, setup: Setup, num_sites, up_b, down_b):
    """One site's own phases (no waiting): a dict of seconds, written for one site."""
    params = total_params(m)
    if setup.mode == "pipeline":
        # the WAN is the pipeline tier: tier 1 (crossed by a pp group spanning > devices) gets the
        # site's WAN rate, efficiency and latency; the site's devices share tier 0
        rate = jnp.minimum(site.up_bytes_per_s, site.down_bytes_per_s)
        hw = dataclasses.replace(
            site.hw, link_bandwidth_bytes_per_s=site.hw.link_bandwidth_bytes_per_s.at[1].set(rate)
        )
        c = dataclasses.replace(
            site.consts,
            link_latency_s=site.consts.link_latency_s.at[1].set(site.consts.link_latency_s[WAN]),
            link_bandwidth_efficiency=site.consts.link_bandwidth_efficiency.at[1].set(
                site.consts.link_bandwidth_efficiency[WAN]
            ),
        )
        s = _local_strategy(site, num_sites, setup.num_microbatches, site.devices)
        b = step_time(m, hw, c, s)
        # activations (forward) and their gradients (backward) of each microbatch cross the WAN
        # once each way, 2(m + p - 1) messages per step as in step_time's p2p term
        act_b = jnp.asarray(ACT_BYTES, jnp.float32)[site.dtype.astype(jnp.int32)]
        n_msg = site.micro_batch_size * tokens_per_sample(m) * m.hidden_size * act_b
        count = 2.0 * (setup.num_microbatches + num_sites - 1.0)
        return dict(
            compute=b.compute_s + b.tp_comm_s + b.dp_comm_exposed_s,
            serialize=count * n_msg / site.serialize_bytes_per_s,
            deserialize=count * n_msg / site.deserialize_bytes_per_s,
            upload=0.5 * b.pp_p2p_s,
            download=0.5 * b.pp_p2p_s,
            bubble=b.bubble_s,
            aggregate=b.optimizer_s + b.overhead_s + site.overhead_s,
        )
    steps = site.local_steps if setup.mode == "fedavg" else jnp.ones((), jnp.float32)
    work = dict(
        compute=steps * local_step_s(m, site) + site.overhead_s,
        serialize=up_b / site.serialize_bytes_per_s,
        deserialize=down_b / site.deserialize_bytes_per_s,
    )
    lat, up_bw = _wan_link(site, site.up_bytes_per_s)
    _, down_bw = _wan_link(site, site.down_bytes_per_s)
    if setup.topology == "server":
        work.update(upload=coll.p2p_s(up_b, lat, up_bw), download=coll.p2p_s(down_b, lat, down_bw))
    else:  # ring: each site reduces the chunks it receives (fused into the all-reduce)
        work.update(
            aggregate=agg.time_factor
            * _reduce_s(site.hw, site.consts, params * (num_sites - 1.0) / num_sites, 1.0),
            latency=lat,
            bandwidth=jnp.minimum(up_bw, down_bw),
        )
    return work


def round_timeline(m: ModelSpec, sites: Site, agg: Aggregator, setup: Setup) -> RoundTimeline:
    """One synchronous round of every site (sites stacked on the leading axis).

    Server: site ``i`` downloads the model, deserialises, computes, serialises and uploads; the
    server waits for the last upload, then averages (``aggregate``: roofline reduction times the
    aggregator's ``time_factor``, plus deserialising ``P`` uploads and serialising the result), so
    ``round = max_i(arrival_i) + aggregate`` and ``wait_i = round − aggregate − arrival_i``.
    Ring: the all-reduce (``2(P−1)·α + 2(P−1)/P·n/β``, bounded by the slowest link) starts when the
    last site has serialised. Pipeline: every site runs its stage under perfmodel's 1F1B formulas;
    the bubble and the difference to the slowest site are waiting.

    Args:
      m: the model (scalar leaves).
      sites: a :class:`Site` stack with leading axis ``sites``.
      agg: the aggregator.
      setup: mode, topology, compression and their knobs.

    Returns:
      A :class:`RoundTimeline`.
    """
    num_sites = jnp.asarray(sites.devices.shape[0], jnp.float32)
    params = total_params(m)
    up_b, down_b = payload_bytes(params, num_sites, setup)
    w = jax.vmap(_site_work, in_axes=(None, 0, None, None, None, None, None))(
        m, sites, agg, setup, num_sites, up_b, down_b
    )
    zeros = jnp.zeros_like(w["compute"])
    if setup.mode == "pipeline":
        own = (
            w["compute"]
            + w["serialize"]
            + w["deserialize"]
            + w["upload"]
            + w["download"]
            + w["bubble"]
            + w["aggregate"]
        )
        round_s = jnp.max(own)
        wait = round_s - own + w["bubble"]
        upload, download, aggregate = w["upload"], w["download"], w["aggregate"]
    elif setup.topology == "server":
        arrival = w["download"] + w["deserialize"] + w["compute"] + w["serialize"] + w["upload"]
        server = (
            agg.time_factor * _reduce_s(agg.hw, agg.consts, params, num_sites)
            + num_sites * up_b / agg.deserialize_bytes_per_s
            + down_b / agg.serialize_bytes_per_s
        )
        round_s = jnp.max(arrival) + server
        wait = round_s - server - arrival
        upload, download, aggregate = w["upload"], w["download"], zeros + server
    else:
        ready = w["compute"] + w["serialize"]
        ring = coll.all_reduce_s(num_sites, up_b, jnp.max(w["latency"]), jnp.min(w["bandwidth"]))
        finish = w["deserialize"] + w["aggregate"]
        round_s = jnp.max(ready) + ring + jnp.max(finish)
        wait = round_s - ready - ring - finish
        upload, download, aggregate = zeros + 0.5 * ring, zeros + 0.5 * ring, w["aggregate"]
    comm = upload + download + wait
    ser = w["serialize"] + w["deserialize"]

    def pct(x):
        return 100.0 * x / round_s

    return RoundTimeline(
        compute_s=w["compute"],
        serialize_s=w["serialize"],
        upload_s=upload,
        wait_s=wait,
        aggregate_s=aggregate,
        download_s=download,
        deserialize_s=w["deserialize"],
        communication_s=comm,
        serialization_s=ser,
        other_s=aggregate,
        round_s=round_s,
        compute_share_pct=pct(w["compute"]),
        communication_share_pct=pct(comm),
        serialization_share_pct=pct(ser),
        other_share_pct=pct(aggregate),
        upload_bytes=up_b,
        download_bytes=down_b,
        params=params,
    )


_sweep = jax.jit(jax.vmap(round_timeline, in_axes=(0, None, None, None)))


def sweep(models: ModelSpec, sites: Site, agg: Aggregator, setup: Setup) -> RoundTimeline:
    """:func:`round_timeline` over models stacked on a leading ``sizes`` axis (one ``jit(vmap)``).

    Returns leaves of shape ``[sizes, sites]`` (``[sizes]`` for the shared ones).
    """
    return _sweep(models, sites, agg, setup)


def stack(trees: list) -> object:
    """Stacks pytrees of the same structure (sites, or models of one kind) on a new leading axis."""
    return jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x, jnp.float32) for x in xs]), *trees)


# ------------------------------------------------------------------ builders (the boundary)

# (serialise, deserialise) throughput of 10M+100M-parameter fp32 weights by format, bytes per
# second: total bytes over total median time of `aisim collab measure-serde --params 10M,100M` on
# the project's 2-core CPU machine (docs/readme/collab.md); a measure-serde profile of your own
# machine (`--profile`) replaces them
SERDE_DEFAULT_BYTES_PER_S = {
    "numpy": (1.56e9, 4.21e8),
    "msgpack": (4.70e8, 1.31e9),
    "protobuf": (7.80e8, 6.15e8),
    "pickle": (1.71e9, 1.55e9),
}


def _positive(where: str | None, field: str, value, unit: str) -> float:
    import math

    from simbase.errors import bad_value

    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise bad_value(where, field, value, f"a positive number ({unit})")
    return float(value)


def make_site(
    hardware,
    *,
    devices: int = 1,
    micro_batch_size: int = 64,
    local_steps: float = 1.0,
    overhead_s: float = 0.0,
    up_bytes_per_s: float | None = None,
    down_bytes_per_s: float | None = None,
    latency_s: float | None = None,
    serialize_bytes_per_s: float = SERDE_DEFAULT_BYTES_PER_S["msgpack"][0],
    deserialize_bytes_per_s: float = SERDE_DEFAULT_BYTES_PER_S["msgpack"][1],
    dtype: str = "fp32",
    consts: Constants | None = None,
    where: str = "site",
) -> Site:
    """A :class:`Site` from a :class:`perfmodel.hardware.Hardware` preset and Python values.

    The WAN line rates default to the preset's ``wan`` tier, the latency to its ``wan`` latency.

    Raises:
      AisimError: a non-positive count, rate or throughput, naming ``where`` and the field.
    """
    from simbase.errors import bad_value

    spec = hardware.spec
    wan_rate = float(spec.link_bandwidth_bytes_per_s[WAN])
    up = wan_rate if up_bytes_per_s is None else up_bytes_per_s
    down = up if down_bytes_per_s is None else down_bytes_per_s
    vals = {
        "devices": _positive(where, "devices", devices, "devices"),
        "micro_batch_size": _positive(
            where, "micro_batch_size", micro_batch_size, "samples per device"
        ),
        "local_steps": _positive(where, "local_steps", local_steps, "steps per round"),
        "up_bytes_per_s": _positive(where, "up_bandwidth", up, "bytes/s"),
        "down_bytes_per_s": _positive(where, "down_bandwidth", down, "bytes/s"),
        "serialize_bytes_per_s": _positive(
            where, "serialize_bytes_per_s", serialize_bytes_per_s, "bytes/s"
        ),
        "deserialize_bytes_per_s": _positive(
            where, "deserialize_bytes_per_s", deserialize_bytes_per_s, "bytes/s"
        ),
    }
    if not (isinstance(overhead_s, int | float) and overhead_s >= 0):
        raise bad_value(where, "overhead_s", overhead_s, "a non-negative number of seconds")
    code = next((d for d in Dtype if d.label == dtype), None)
    if code is None or float(spec.peak_flops_per_s[code]) <= 0:
        raise bad_value(
            where, "dtype", dtype, f"a dtype {hardware.name} supports ({', '.join(Dtype.labels())})"
        )
    c = hardware.constants if consts is None else consts
    if latency_s is not None:
        if not (isinstance(latency_s, int | float) and latency_s >= 0):
            raise bad_value(where, "latency", latency_s, "a non-negative number of seconds")
        c = dataclasses.replace(
            c, link_latency_s=jnp.asarray(c.link_latency_s).at[WAN].set(float(latency_s))
        )
    f = jnp.float32
    return Site(
        hw=spec,
        consts=c,
        overhead_s=jnp.asarray(float(overhead_s), f),
        dtype=jnp.asarray(float(code), f),
        **{k: jnp.asarray(v, f) for k, v in vals.items()},
    )


def make_aggregator(
    hardware,
    *,
    time_factor: float = 1.0,
    serialize_bytes_per_s: float = SERDE_DEFAULT_BYTES_PER_S["msgpack"][0],
    deserialize_bytes_per_s: float = SERDE_DEFAULT_BYTES_PER_S["msgpack"][1],
) -> Aggregator:
    """An :class:`Aggregator` on a hardware preset (the parameter server's host)."""
    f = jnp.float32
    return Aggregator(
        hw=hardware.spec,
        consts=hardware.constants,
        time_factor=jnp.asarray(_positive("aggregator", "time_factor", time_factor, "factor"), f),
        serialize_bytes_per_s=jnp.asarray(serialize_bytes_per_s, f),
        deserialize_bytes_per_s=jnp.asarray(deserialize_bytes_per_s, f),
    )


def make_setup(
    mode: str = "fedavg",
    topology: str = "server",
    compression: str = "none",
    *,
    topk_fraction: float = 0.01,
    num_microbatches: int = 8,
) -> Setup:
    """A validated :class:`Setup` (names checked against :data:`MODES` and friends).

    Raises:
      AisimError: an unknown name or a bad knob, naming the argument (``mode``, ``topology``,
        ``compression``, ``topk_fraction``, ``num_microbatches``; ``source`` ``None``).
    """
    from simbase.errors import bad_value

    for field, value, choices in (
        ("mode", mode, MODES),
        ("topology", topology, TOPOLOGIES),
        ("compression", compression, COMPRESSIONS),
    ):
        if value not in choices:
            raise bad_value(None, field, value, "one of " + ", ".join(choices))
    if not (isinstance(topk_fraction, int | float) and 0 < topk_fraction <= 1):
        raise bad_value(None, "topk_fraction", topk_fraction, "a fraction in (0, 1]")
    _positive(None, "num_microbatches", num_microbatches, "microbatches per step")
    f = jnp.float32
    return Setup(
        topk_fraction=jnp.asarray(float(topk_fraction), f),
        num_microbatches=jnp.asarray(float(num_microbatches), f),
        mode=mode,
        topology=topology,
        compression=compression,
    )


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A collaboration described with Python values (what the CLI and the notebook build).

    Per-site lists have one entry per participant (``len(hardware)`` sites). ``local_steps``
    ``None`` means one epoch of the local data: ``ceil(local_samples / (devices · batch))``.
    Rates are bytes per second; ``None`` rates and latencies come from the preset's ``wan`` tier.
    """

    hardware: tuple  # perfmodel.hardware.Hardware per site
    aggregator: object  # perfmodel.hardware.Hardware of the parameter server
    devices: tuple = (1,)
    micro_batch_size: tuple = (64,)
    local_samples: tuple = (60000,)
    local_steps: tuple | None = None
    up_bytes_per_s: tuple | None = None
    down_bytes_per_s: tuple | None = None
    latency_s: float | None = None
    overhead_s: tuple = (0.0,)
    consts: tuple | None = None  # Constants per site overriding the preset's (a fitted profile)
    serialize_bytes_per_s: float = SERDE_DEFAULT_BYTES_PER_S["msgpack"][0]
    deserialize_bytes_per_s: float = SERDE_DEFAULT_BYTES_PER_S["msgpack"][1]
    aggregation_time_factor: float = 1.0
    mode: str = "fedavg"
    topology: str = "server"
    compression: str = "none"
    topk_fraction: float = 0.01
    num_microbatches: int = 8
    dtype: str = "fp32"

    @property
    def num_sites(self) -> int:
        return len(self.hardware)

    def per_site(self, name: str):
        """The value of a per-site field for every site (a single value is repeated).

        Raises:
          AisimError: ``field`` ``name`` has neither one value nor one per site.
        """
        from simbase.errors import bad_value

        v = getattr(self, name)
        if v is None or not isinstance(v, tuple | list):
            return [v] * self.num_sites
        if len(v) == 1:
            return list(v) * self.num_sites
        if len(v) != self.num_sites:
            raise bad_value(None, name, tuple(v), f"1 value or one per client ({self.num_sites})")
        return list(v)


def scenario_sites(sc: Scenario) -> Site:
    """The stacked :class:`Site` of a scenario (validated)."""
    import math

    sites = []
    cols = {
        k: sc.per_site(k)
        for k in (
            "devices",
            "micro_batch_size",
            "local_samples",
            "local_steps",
            "up_bytes_per_s",
            "down_bytes_per_s",
            "overhead_s",
            "consts",
        )
    }
    for i, hw in enumerate(sc.hardware):
        dev, mbs = cols["devices"][i], cols["micro_batch_size"][i]
        steps = cols["local_steps"][i]
        if steps is None:
            samples = _positive(
                f"client{i + 1}", "local_samples", cols["local_samples"][i], "samples"
            )
            steps = math.ceil(
                samples
                / (
                    _positive(f"client{i + 1}", "devices", dev, "devices")
                    * _positive(f"client{i + 1}", "micro_batch_size", mbs, "samples")
                )
            )
        sites.append(
            make_site(
                hw,
                devices=dev,
                micro_batch_size=mbs,
                local_steps=steps,
                overhead_s=cols["overhead_s"][i],
                up_bytes_per_s=cols["up_bytes_per_s"][i],
                down_bytes_per_s=cols["down_bytes_per_s"][i],
                latency_s=sc.latency_s,
                serialize_bytes_per_s=sc.serialize_bytes_per_s,
                deserialize_bytes_per_s=sc.deserialize_bytes_per_s,
                dtype=sc.dtype,
                consts=cols["consts"][i],
                where=f"client{i + 1}",
            )
        )
    return stack(sites)


def scenario_parts(sc: Scenario) -> tuple[Site, Aggregator, Setup]:
    """Sites, aggregator and setup of a scenario, ready for :func:`sweep`."""
    agg = make_aggregator(
        sc.aggregator,
        time_factor=sc.aggregation_time_factor,
        serialize_bytes_per_s=sc.serialize_bytes_per_s,
        deserialize_bytes_per_s=sc.deserialize_bytes_per_s,
    )
    setup = make_setup(
        sc.mode,
        sc.topology,
        sc.compression,
        topk_fraction=sc.topk_fraction,
        num_microbatches=sc.num_microbatches,
    )
    return scenario_sites(sc), agg, setup


def size_models(sizes) -> ModelSpec:
    """The standard square MLPs (:func:`perfmodel.workload.mlp_from_params`) of ``sizes``, stacked."""
    from perfmodel.workload import mlp_from_params

    return stack([mlp_from_params(s).spec for s in sizes])


def timeline_frame(sizes, tl: RoundTimeline, rounds=1.0):
    """One row per model size: the source table's columns, the other share and each phase.

    Columns: ``model_params`` (the size as given), ``params`` (exact count), ``rounds``,
    ``round_time_s``, ``total_task_time_s = rounds · round_time_s``, then per client ``i``
    ``client{i}_compute_utilization_pct``, ``..._communication_share_pct``,
    ``..._serialization_share_pct``, ``..._other_share_pct`` and the seconds of each phase.
    """
    import numpy as np
    import pandas as pd

    from simbase.units import format_count

    n = len(sizes)
    rounds = np.broadcast_to(np.asarray(rounds, np.float64), (n,))
    r = np.asarray(tl.round_s, np.float64)
    df = pd.DataFrame(
        {
            "model_params": [s if isinstance(s, str) else format_count(float(s)) for s in sizes],
            "params": np.asarray(tl.params, np.float64),
            "rounds": rounds,
            "round_time_s": r,
            "total_task_time_s": rounds * r,
        }
    )
    shares = {
        "compute_utilization_pct": tl.compute_share_pct,
        "communication_share_pct": tl.communication_share_pct,
        "serialization_share_pct": tl.serialization_share_pct,
        "other_share_pct": tl.other_share_pct,
    }
    phases = (
        "compute_s",
        "serialize_s",
        "upload_s",
        "wait_s",
        "aggregate_s",
        "download_s",
        "deserialize_s",
    )
    sites = np.asarray(tl.compute_s).shape[1]
    for i in range(sites):
        for k, v in shares.items():
            df[f"client{i + 1}_{k}"] = np.asarray(v, np.float64)[:, i]
    for i in range(sites):
        for k in phases:
            df[f"client{i + 1}_{k}"] = np.asarray(getattr(tl, k), np.float64)[:, i]
    return df


def sweep_frame(sc: Scenario, sizes, rounds=1.0):
    """:func:`timeline_frame` of a scenario over model sizes (``"10M"`` strings or counts)."""
    sites, agg, setup = scenario_parts(sc)
    return timeline_frame(list(sizes), sweep(size_models(sizes), sites, agg, setup), rounds)
