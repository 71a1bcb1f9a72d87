"""Cross-site collaborative training, the model: one synchronous round, per participant, by phase.

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
bytes / throughput of the chosen format (:func:`calibration.serde.measure_serde` measures them).
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
from perfmodel.strategy import ACT_BYTES, KNOB_DEFAULTS, Strategy
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
        grad_reduce_fp32=jnp.where(
            (site.dtype == Dtype.BF16) | (site.dtype == Dtype.FP8), 1.0, 0.0
        ).astype(jnp.float32),
        **{k: jnp.asarray(v, jnp.float32) for k, v in KNOB_DEFAULTS.items()},
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
