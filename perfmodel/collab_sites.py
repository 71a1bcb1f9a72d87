"""Cross-site training of real models, the round model: sites that are clusters, synced over a WAN.

Contract: each site is a cluster whose inner optimiser step has already been timed by perfmodel's
step model (:func:`perfmodel.estimate`, any strategy inside the site); :func:`cross_site_round`
is pure, jittable and differentiable, written for one setting with the sites on a leading
``sites`` axis, and :func:`round_grid` is the one ``jit(vmap)`` over settings (inner steps H,
link rates). For each site it returns the seconds and shares of one round

    compute + communication + serialisation + idle = 100 %,

where *idle* is waiting for a slower site (or, for a site the deadline dropped, the whole round).

Round modes (``mode``, static): ``data-parallel`` (the gradient crosses the WAN after every step),
``fedavg`` / ``diloco`` (H inner steps, then the pseudo-gradient, the size of the model, is
averaged across sites and an outer optimiser applied; DiLoCo's outer Nesterov step, Douillard
et al. 2023, is a few element-wise passes and costs nothing here) and ``streaming-diloco`` (the
model in F fragments, one fragment synced every H/F steps while the next steps run, Douillard et
al. 2025, "Streaming DiLoCo"). The WAN all-reduce is a ring over the sites (``2(n-1)/n · bytes``
over the slowest link, plus ``2(n-1)`` latencies: Thakur et al. 2005) or a parameter server (every
site uploads and downloads the payload; the server's own link carries ``n`` payloads each way).
A link's rate is its line rate, capped by TCP's window: one connection never has more than
``tcp_window_bytes`` unacknowledged, so it carries at most ``window / RTT`` (RTT = twice the
one-way latency; Mathis et al. 1997), which is what makes a ring across continents slower than one
inside a continent at the same line rate.
``overlap`` lets the sync of one round run under the next round's inner steps (one-step delayed
outer update); INTELLECT-1 and OpenDiLoCo ran it blocking. ``churn_rate`` sites of every
``1/churn_rate`` rounds are replaced, and a newcomer's state download delays the round;
``deadline_s`` > 0 drops the sites whose inner steps take longer. ``window_s`` > 0 fixes the round's
length, as a protocol clocked by a chain does (Templar/Covenant: a window of blocks): each site
first waits for the exchange of the previous round (the exposed sync), then runs inner steps until
it has done H or the window ends, and idles for the rest.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from perfmodel import collectives as coll

ROUND_MODES = ("data-parallel", "fedavg", "diloco", "streaming-diloco")
SYNC_TOPOLOGIES = ("ring", "server")
# bytes per value of each payload; top-k sends a 4-byte value and a 4-byte index per kept
# entry (Aji & Heafield 2017); int8 neglects the per-block scales
PAYLOAD_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0, "topk": 8.0}
SITE_SHARES = ("compute", "communication", "serialization", "idle")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SiteRate:
    """One site, its inner step already timed (scalar leaves; stacked: leading ``sites`` axis).

    Attributes:
      inner_step_s: seconds of one inner optimiser step (perfmodel's step time at the site).
      devices: devices at the site.
      peak_flops_per_s: one device's peak in the compute dtype (for the MFU).
      mfu: model FLOPs utilisation of one inner step (perfmodel's).
      tokens_per_step: tokens the site trains per inner step.
      up_bytes_per_s, down_bytes_per_s: WAN line rates out of and into the site.
      latency_s: one-way WAN latency of the site.
      serialize_bytes_per_s, deserialize_bytes_per_s: payload (de)serialisation throughput
        (``inf``: tensors sent as they are).
    """

    inner_step_s: Float[Array, ""]
    devices: Float[Array, ""]
    peak_flops_per_s: Float[Array, ""]
    mfu: Float[Array, ""]
    tokens_per_step: Float[Array, ""]
    up_bytes_per_s: Float[Array, ""]
    down_bytes_per_s: Float[Array, ""]
    latency_s: Float[Array, ""]
    serialize_bytes_per_s: Float[Array, ""]
    deserialize_bytes_per_s: Float[Array, ""]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class WanRound:
    """How the sites synchronise (names static, numbers leaves).

    Attributes:
      params: model parameters (the pseudo-gradient has one value per parameter).
      local_steps: inner steps H per round (``data-parallel``: ignored, one step).
      fragments: streaming DiLoCo's F (``streaming-diloco`` only).
      wan_efficiency: achieved fraction of the line rate (the one calibrated WAN constant).
      churn_rate: fraction of sites replaced per round (0: none).
      state_bytes: bytes a newcomer downloads (weights and outer optimiser state).
      deadline_s: drop sites whose inner steps of a round exceed this (0: wait for all).
      topk_fraction: entries top-k keeps.
      server_bytes_per_s: the parameter server's line rate (``server`` topology).
      tcp_window_bytes: bytes a link keeps in flight (its TCP connections' window together);
        caps the link at ``window / RTT`` (``inf``: no cap, the line rate alone).
      window_s: the round's fixed length in seconds, set by the protocol and not by the sites
        (``0``: the round lasts as long as its work).
    """

    params: Float[Array, ""]
    local_steps: Float[Array, ""]
    fragments: Float[Array, ""]
    wan_efficiency: Float[Array, ""]
    churn_rate: Float[Array, ""]
    state_bytes: Float[Array, ""]
    deadline_s: Float[Array, ""]
    topk_fraction: Float[Array, ""]
    server_bytes_per_s: Float[Array, ""]
    tcp_window_bytes: Float[Array, ""]
    window_s: Float[Array, ""] = 0.0
    mode: str = jax.tree.static(default="diloco")
    topology: str = jax.tree.static(default="ring")
    compression: str = jax.tree.static(default="fp32")
    overlap: bool = jax.tree.static(default=False)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CrossSiteRound:
    """One round: per site (leaves ``[sites]``) and overall (scalars). Seconds, percent, bytes.

    ``compute_s + communication_s + serialization_s + idle_s == round_s`` for every site.
    ``compute_utilization_pct`` (overall) is the device-weighted share of the round spent on
    inner steps that count (a dropped site's do not), the figure published runs report.
    """

    compute_s: Float[Array, " sites"]
    communication_s: Float[Array, " sites"]
    serialization_s: Float[Array, " sites"]
    idle_s: Float[Array, " sites"]
    compute_share_pct: Float[Array, " sites"]
    communication_share_pct: Float[Array, " sites"]
    serialization_share_pct: Float[Array, " sites"]
    idle_share_pct: Float[Array, " sites"]
    mfu: Float[Array, " sites"]
    bytes_sent: Float[Array, " sites"]
    dropped: Float[Array, " sites"]
    round_s: Float[Array, ""]
    sync_s: Float[Array, ""]
    churn_s: Float[Array, ""]
    payload_bytes: Float[Array, ""]
    tokens_per_round: Float[Array, ""]
    compute_utilization_pct: Float[Array, ""]
    overall_mfu: Float[Array, ""]


def sync_payload_bytes(params, r: WanRound) -> Float[Array, ""]:
    """Bytes of one site's full-model payload (gradient or pseudo-gradient) after compression."""
    frac = r.topk_fraction if r.compression == "topk" else 1.0
    return params * PAYLOAD_BYTES[r.compression] * frac


def window_capped(line_bytes_per_s, latency_s, window_bytes):
    """A link's rate: its line rate, or less when TCP's window runs out first.

    A sender may have at most ``window_bytes`` unacknowledged, and an acknowledgement returns one
    round trip (``2 · latency_s``) later, so the link carries at most ``window / RTT`` bytes per
    second (the bandwidth-delay product; Mathis et al. 1997, "The macroscopic behavior of the TCP
    congestion avoidance algorithm"). ``window_bytes`` ``inf`` leaves the line rate.
    """
    rtt = 2.0 * latency_s
    cap = jnp.where(rtt > 0, window_bytes / jnp.where(rtt > 0, rtt, 1.0), jnp.inf)
    return jnp.minimum(line_bytes_per_s, cap)


def wan_sync_s(n_bytes, s: SiteRate, live, r: WanRound):
    """Seconds to average ``n_bytes`` over the live sites, and the bytes each one sends.

    Ring: ``2(n-1)·α_max + 2(n-1)/n · bytes / β_min`` with β the slowest live site's
    ``min(up, down)``, capped at ``tcp_window_bytes / (2 α_max)`` (:func:`window_capped`: the
    ring's longest hop sets every step), times ``wan_efficiency``
    (:func:`perfmodel.collectives.all_reduce_s`). Server: the slowest upload (or the server's
    ingress of ``n`` payloads), then the slowest download (or its egress), each site's link capped
    by its own RTT; a top-k average holds up to ``n·k`` entries, never more than the dense fp32
    vector.
    """
    n = jnp.sum(live)
    eff = r.wan_efficiency
    lat = jnp.max(jnp.where(live > 0, s.latency_s, 0.0))
    if r.topology == "ring":
        bw = jnp.min(
            jnp.where(live > 0, jnp.minimum(s.up_bytes_per_s, s.down_bytes_per_s), jnp.inf)
        )
        bw = window_capped(bw, lat, r.tcp_window_bytes)
        t = coll.all_reduce_s(n, n_bytes, lat, bw * eff)
        sent = 2.0 * (n - 1.0) / jnp.maximum(n, 1.0) * n_bytes * live
        return t, sent
    down_bytes = n_bytes
    if r.compression == "topk":
        down_bytes = jnp.minimum(n * n_bytes, r.params * PAYLOAD_BYTES["fp32"])
    up_bw = window_capped(s.up_bytes_per_s, s.latency_s, r.tcp_window_bytes)
    down_bw = window_capped(s.down_bytes_per_s, s.latency_s, r.tcp_window_bytes)
    up = jnp.max(jnp.where(live > 0, s.latency_s + n_bytes / (up_bw * eff), 0.0))
    down = jnp.max(jnp.where(live > 0, s.latency_s + down_bytes / (down_bw * eff), 0.0))
    server = r.server_bytes_per_s * eff
    t = jnp.maximum(up, lat + n * n_bytes / server) + jnp.maximum(
        down, lat + n * down_bytes / server
    )
    return t, n_bytes * live


def _split(exposed, comm, ser):
    """Exposed seconds split between communication and serialisation in proportion."""
    total = comm + ser
    frac = jnp.where(total > 0, comm / jnp.where(total > 0, total, 1.0), 1.0)
    return exposed * frac, exposed * (1.0 - frac)


def cross_site_round(s: SiteRate, r: WanRound) -> CrossSiteRound:
    """One synchronous round of every site (sites stacked on the leading axis).

    Every live site runs H inner steps (``compute_i = H · inner_step_s_i``); the round waits for
    the slowest live one, then (``overlap`` off) serialises and syncs, or (``overlap`` on) hides
    the sync behind the next round's inner steps, exposing only ``max(0, sync + serde −
    compute_max)``. Streaming DiLoCo syncs ``F`` fragments of ``payload/F`` bytes, each under the
    ``H/F`` inner steps that follow it (``overlap`` off: none hidden). A churned-in site downloads
    ``state_bytes`` at its (window-capped) line rate before joining; the expected delay per round is
    ``min(1, churn_rate · n) · (α + state/β)``.

    ``window_s`` > 0 (a protocol's fixed window, e.g. Templar's ``blocks_per_window`` × 12 s
    blocks): the round lasts ``max(window, exposed)`` where ``exposed`` is the exchange the inner
    steps wait for (sync and serialisation not hidden, and churn); a site's inner steps run in
    what is left, ``min(H · inner_step_s, window − exposed)`` (its inner loop stops when the window
    ends, as Templar's miner does), and it idles for the rest of the window. Tokens count the inner
    steps done.

    Args:
      s: a :class:`SiteRate` stack with leading axis ``sites``.
      r: the :class:`WanRound` (mode, topology, compression, overlap and their numbers).

    Returns:
      A :class:`CrossSiteRound`.
    """
    steps = jnp.ones_like(r.local_steps) if r.mode == "data-parallel" else r.local_steps
    compute = steps * s.inner_step_s
    too_slow = (r.deadline_s > 0) & (compute > r.deadline_s)
    # a deadline never drops every site: the fastest one always counts
    live = jnp.where(too_slow & (compute > jnp.min(compute)), 0.0, 1.0)
    cmax = jnp.max(compute * live)
    payload = sync_payload_bytes(r.params, r)
    frags = r.fragments if r.mode == "streaming-diloco" else jnp.ones_like(r.fragments)
    sync, sent = wan_sync_s(payload / frags, s, live, r)
    serde = jnp.max(
        live * (payload / s.serialize_bytes_per_s + payload / s.deserialize_bytes_per_s)
    )
    if r.mode == "streaming-diloco":
        per = sync + serde / frags
        hidden = cmax / frags if r.overlap else 0.0
        exposed = frags * jnp.maximum(per - hidden, 0.0)
        comm, ser = _split(exposed, frags * sync, serde)
        sync_total, sent = frags * sync, frags * sent
    elif r.overlap:
        comm, ser = _split(jnp.maximum(sync + serde - cmax, 0.0), sync, serde)
        sync_total = sync
    else:
        comm, ser, sync_total = sync, serde, sync
    n = jnp.sum(live)
    # the newcomer's download is one more TCP transfer: capped by the window at its round trip
    down_bw = window_capped(s.down_bytes_per_s, s.latency_s, r.tcp_window_bytes)
    slowest_down = jnp.min(jnp.where(live > 0, down_bw, jnp.inf)) * r.wan_efficiency
    churn = jnp.minimum(1.0, r.churn_rate * n) * (
        jnp.max(s.latency_s) + r.state_bytes / slowest_down
    )
    churn = jnp.where(r.churn_rate > 0, churn, 0.0)
    exposed = comm + ser + churn
    windowed = r.window_s > 0
    # a fixed window: the inner steps get what the exchange leaves, and stop at the window's end
    budget = jnp.maximum(r.window_s - exposed, 0.0)
    done = jnp.where(windowed, jnp.minimum(compute, budget), compute)
    round_s = jnp.where(windowed, jnp.maximum(r.window_s, exposed), cmax + exposed)
    compute_i = done * live
    steps_done = jnp.where(windowed, done / s.inner_step_s, steps)
    comm_i = (comm + churn) * live
    ser_i = ser * live
    # waiting for the slowest site; float32 rounding can leave -1e-6 s where there is none
    idle_i = jnp.maximum(round_s - compute_i - comm_i - ser_i, 0.0)

    def pct(x):
        return 100.0 * x / round_s

    dev = s.devices
    util = jnp.sum(compute_i * dev) / (round_s * jnp.sum(dev))
    peak = s.peak_flops_per_s * dev
    overall_mfu = jnp.sum(s.mfu * compute_i * peak) / (round_s * jnp.sum(peak))
    return CrossSiteRound(
        compute_s=compute_i,
        communication_s=comm_i,
        serialization_s=ser_i,
        idle_s=idle_i,
        compute_share_pct=pct(compute_i),
        communication_share_pct=pct(comm_i),
        serialization_share_pct=pct(ser_i),
        idle_share_pct=pct(idle_i),
        mfu=s.mfu * compute_i / round_s,
        bytes_sent=sent,
        dropped=1.0 - live,
        round_s=round_s,
        sync_s=sync_total,
        churn_s=churn,
        payload_bytes=payload,
        tokens_per_round=jnp.sum(live * steps_done * s.tokens_per_step),
        compute_utilization_pct=100.0 * util,
        overall_mfu=overall_mfu,
    )


_grid = jax.jit(jax.vmap(cross_site_round, in_axes=(0, 0)))


def round_grid(s: SiteRate, r: WanRound) -> CrossSiteRound:
    """:func:`cross_site_round` over settings stacked on a leading ``settings`` axis (one
    ``jit(vmap)``): ``s`` leaves ``[settings, sites]``, ``r`` leaves ``[settings]``."""
    return _grid(s, r)
