"""Cross-site training of the standard MLPs, timed inside ``jit``: the ``aisim collab sweep`` model.

Contract: a few sites (participants), each with its own hardware, devices, local data and local
steps, are joined by WAN links (line rate up and down; the efficiency and latency of the site's
``wan`` tier) to a parameter server (``topology="server"``) or to each other in a ring
(``"ring"``). :func:`site_work` times one site's work with perfmodel's step function (roofline
per layer, data parallelism over the site's devices, the optimiser; in ``pipeline`` mode the
pipeline step with the WAN as its tier) and :func:`round_timeline` hands the sites to the one
round model, :func:`collab.round_model.collab_round`; both are pure, jittable and
differentiable, written for one model with scalar leaves and the sites stacked on a leading
``sites`` axis (vmapped in one place). :func:`sweep` is the one ``jit(vmap)`` over model sizes.
The source document's table reads the result as four shares of the round,

    compute + communication (upload + download + waiting) + serialisation + other = 100 %,

where *other* is the aggregation: waiting counts as communication there
(:func:`source_shares`). Modes: ``fedavg`` (each site trains a full replica for its
``local_steps``, then the models are averaged), ``data-parallel`` (gradients cross the WAN every
step, optionally compressed to fp16, int8 or top-k) and ``pipeline`` (the model's stages at the
sites, activations across the WAN). Serialisation is bytes / throughput of the chosen format
(:func:`collab.serialisation.measure_serde` measures them).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from collab.round_model import Exchange, PipelineStage, Round, SiteWork, collab_round, payload_bytes
from perfmodel import (
    Constants,
    HardwareSpec,
    ModelSpec,
    OpClass,
    Strategy,
    activation_bytes,
    op_time_s,
    step_time,
    tokens_per_sample,
    total_params,
)
from perfmodel.specs.strategy import Scope, from_leaves, leaf_codes

MODES = ("fedavg", "data-parallel", "pipeline")
TOPOLOGIES = ("server", "ring")
COMPRESSIONS = ("none", "fp16", "int8", "topk")
SERDE_FORMATS = ("numpy", "msgpack", "protobuf", "pickle")
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
      dtype: compute dtype code (a :class:`perfmodel.specs.choices.Dtype`).
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


def _local_strategy(site: Site, pp, num_microbatches, gpus_per_node) -> Strategy:
    """Data parallelism over the site's devices, the registry's defaults otherwise (1F1B, no
    ZeRO or recomputation, gradients reduced in fp32 for bf16 and fp8)."""
    leaves = {k: jnp.asarray(v, jnp.float32) for k, v in leaf_codes({}).items()}
    leaves.update(
        dp=site.devices,
        pp=pp,
        micro_batch_size=site.micro_batch_size,
        num_microbatches=num_microbatches,
        dtype=site.dtype,
        gpus_per_node=gpus_per_node,
    )
    return from_leaves(leaves, scope=Scope(cp=False, fp8=True))


def local_step_s(m: ModelSpec, site: Site) -> Float[Array, ""]:
    """Seconds of one local optimiser step at a site (perfmodel's step time, dp over its devices)."""
    s = _local_strategy(
        site, jnp.ones((), jnp.float32), jnp.ones((), jnp.float32), site.hw.gpus_per_node
    )
    return step_time(m, site.hw, site.consts, s).step_time_s


def _average_s(hw: HardwareSpec, consts: Constants, params, inputs) -> Float[Array, ""]:
    """Seconds to average ``inputs`` fp32 vectors of ``params`` values: one memory-bound vector
    kernel per input under perfmodel's roofline (:func:`perfmodel.op_time_s`)."""
    kernels = jnp.maximum(inputs, 1.0)
    op = OpClass(
        flops=inputs * params, bytes=(inputs + 1.0) * params * _FP32, kernels=kernels, tensor=False
    )
    peak = hw.peak_flops_per_s[0]
    return op_time_s(op, consts, peak, peak, hw.memory_bandwidth_bytes_per_s)


def _pipeline_stage(m: ModelSpec, site: Site, setup: Setup, num_sites):
    """The pipeline step at a site, the WAN as its tier: tier 1 (crossed by a pp group spanning
    more than the site's devices) gets the site's WAN rate, efficiency and latency; the site's
    devices share tier 0."""
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
    b = step_time(m, hw, c, _local_strategy(site, num_sites, setup.num_microbatches, site.devices))
    # activations (forward) and their gradients (backward) of each microbatch cross the WAN
    # once each way, 2(m + p - 1) messages per step as in step_time's p2p term
    act = activation_bytes(site.dtype)
    message = site.micro_batch_size * tokens_per_sample(m) * m.hidden_size * act
    count = 2.0 * (setup.num_microbatches + num_sites - 1.0)
    stage = PipelineStage(p2p_s=b.pp_p2p_s, bubble_s=b.bubble_s, message_bytes=count * message)
    return b, stage, setup.num_microbatches


def site_work(m: ModelSpec, site: Site, agg: Aggregator, setup: Setup, num_sites) -> SiteWork:
    """One site's work in a round of model ``m``, timed by perfmodel's step function (written for
    one site: scalar leaves).

    ``fedavg`` and ``data-parallel``: one local step is :func:`local_step_s`, the site's
    overhead counts as compute, and in a ring the site reduces the chunks it receives (the
    aggregator's ``time_factor`` times a memory-bound average). ``pipeline``: the pipeline step
    of :func:`_pipeline_stage` (see :class:`collab.round_model.PipelineStage`).
    """
    one = jnp.ones((), jnp.float32)
    stage, microbatches = None, one
    if setup.mode == "pipeline":
        b, stage, microbatches = _pipeline_stage(m, site, setup, num_sites)
    else:
        b = step_time(
            m, site.hw, site.consts, _local_strategy(site, one, one, site.hw.gpus_per_node)
        )
    params = total_params(m)
    reduce = agg.time_factor * _average_s(
        site.hw, site.consts, params * (num_sites - 1.0) / num_sites, 1.0
    )
    return SiteWork(
        step_s=b.step_time_s,
        local_steps=site.local_steps,
        overhead_s=site.overhead_s,
        devices=site.devices,
        peak_flops_per_s=site.hw.peak_flops_per_s[site.dtype.astype(jnp.int32)],
        mfu=b.mfu,
        tokens_per_step=site.devices * site.micro_batch_size * microbatches * tokens_per_sample(m),
        up_bytes_per_s=site.up_bytes_per_s,
        down_bytes_per_s=site.down_bytes_per_s,
        latency_s=site.consts.link_latency_s[WAN],
        link_efficiency=site.consts.link_bandwidth_efficiency[WAN],
        serialize_bytes_per_s=site.serialize_bytes_per_s,
        deserialize_bytes_per_s=site.deserialize_bytes_per_s,
        reduce_s=reduce if setup.topology == "ring" else jnp.zeros_like(reduce),
        stage=stage,
    )


def exchange(m: ModelSpec, agg: Aggregator, setup: Setup, num_sites) -> Exchange:
    """The round's :class:`~collab.round_model.Exchange`: the payload of the model, and with a
    server its average on the aggregator (the aggregator's ``time_factor`` times a memory-bound
    average of ``n`` uploads, plus deserialising them and serialising the result)."""
    params = total_params(m)
    up_b, down_b = payload_bytes(params, num_sites, setup.compression, setup.topk_fraction)
    server_s = (
        agg.time_factor * _average_s(agg.hw, agg.consts, params, num_sites)
        + num_sites * up_b / agg.deserialize_bytes_per_s
        + down_b / agg.serialize_bytes_per_s
    )
    zero, one = jnp.zeros((), jnp.float32), jnp.ones((), jnp.float32)
    return Exchange(
        params=params,
        fragments=one,
        wan_efficiency=one,
        churn_rate=zero,
        state_bytes=zero,
        deadline_s=zero,
        topk_fraction=setup.topk_fraction,
        server_bytes_per_s=jnp.full((), jnp.inf, jnp.float32),
        server_s=server_s if setup.topology == "server" else zero,
        tcp_window_bytes=jnp.full((), jnp.inf, jnp.float32),
        window_s=zero,
        mode=setup.mode,
        topology=setup.topology,
        compression=setup.compression,
    )


def round_timeline(m: ModelSpec, sites: Site, agg: Aggregator, setup: Setup) -> Round:
    """One synchronous round of every site (sites stacked on the leading axis) for model ``m``:
    :func:`site_work` of each site, then :func:`collab.round_model.collab_round`.

    Args:
      m: the model (scalar leaves).
      sites: a :class:`Site` stack with leading axis ``sites``.
      agg: the aggregator.
      setup: mode, topology, compression and their knobs.

    Returns:
      A :class:`~collab.round_model.Round` (``idle_s`` is the waiting).
    """
    num_sites = jnp.asarray(sites.devices.shape[0], jnp.float32)
    work = jax.vmap(site_work, in_axes=(None, 0, None, None, None))(m, sites, agg, setup, num_sites)
    return collab_round(work, exchange(m, agg, setup, num_sites))


def source_shares(r: Round) -> Float[Array, "... sites 4"]:
    """The source document's four shares (percent) of a round, as :data:`SHARE_TERMS`: compute,
    communication with the waiting, serialisation and other."""
    return jnp.stack(
        [
            r.compute_utilization_pct,
            100.0 * (r.communication_s + r.idle_s) / r.round_s[..., None],
            r.serialization_share_pct,
            r.other_share_pct,
        ],
        axis=-1,
    )


_sweep = jax.jit(jax.vmap(round_timeline, in_axes=(0, None, None, None)))


def sweep(models: ModelSpec, sites: Site, agg: Aggregator, setup: Setup) -> Round:
    """:func:`round_timeline` over models stacked on a leading ``sizes`` axis (one ``jit(vmap)``).

    Returns leaves of shape ``[sizes, sites]`` (``[sizes]`` for the shared ones).
    """
    return _sweep(models, sites, agg, setup)
