"""The cross-site round: sites whose work is timed, synchronised over a WAN (the one round model).

Contract: :func:`collab_round` is pure, jittable and differentiable, written for one setting with
the sites on a leading ``sites`` axis; :func:`round_grid` is the one ``jit(vmap)`` over settings.
Both front ends build its inputs: :mod:`collab.scenario_model` times the standard MLPs with
perfmodel's step function inside ``jit`` (``aisim collab sweep``), :mod:`collab.cross_site` times
each site's inner step with :func:`perfmodel.estimate` (``aisim collab sweep --model``). For each
site it returns the seconds of one round by phase,

    compute + communication + serialisation + other + idle = round,

with *other* the aggregation (a parameter server's average, a ring's local reduction) and *idle*
waiting (for a slower site, the server, the pipeline bubble, the end of a fixed window; a site a
deadline dropped idles the whole round), and two utilisations: ``compute_utilization`` =
compute / wall time and ``compute_share_of_busy`` = compute / (compute + communication +
serialisation + other), the time not spent idle (the definition INTELLECT-1's and
Covenant-72B's published figures use; see ``collab/data/crosssite_SOURCES.md``).

Modes (static): ``data-parallel`` (the gradient crosses the WAN after every step), ``fedavg`` /
``diloco`` (H local steps, then the model or pseudo-gradient is averaged; DiLoCo's outer Nesterov
step, Douillard et al. 2023, costs nothing here), ``streaming-diloco`` (F fragments, one synced
every H/F steps while the next ones run, Douillard et al. 2025) and ``pipeline`` (one stage per
site, one step per round: :class:`PipelineStage`). The sync is a ring all-reduce over the sites
(``2(n-1)·α + 2(n-1)/n · bytes/β`` over the slowest link: Thakur et al. 2005) or a parameter
server (each site uploads and downloads; the server's own link carries ``n`` payloads each way).
A link carries its line rate times its efficiency, capped by TCP's window at ``window / RTT``
(Mathis et al. 1997). A blocking round follows each site's own chain of phases (download,
deserialise, compute, serialise, upload, then the server's average; or compute and serialise,
the ring, then deserialise and reduce). ``overlap`` hides the sync behind the next round's steps,
streaming behind the next fragment's, and ``window_s`` > 0 fixes the round's length as a protocol
clocked by a chain does (Templar/Covenant): those expose one shared exchange, the part of the sync
and serialisation not hidden. ``churn_rate`` replaces sites each round (a newcomer's state
download delays it) and ``deadline_s`` > 0 drops the sites whose steps take longer.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from perfmodel import all_reduce_s, p2p_s

ROUND_MODES = ("data-parallel", "fedavg", "diloco", "streaming-diloco", "pipeline")
SYNC_TOPOLOGIES = ("ring", "server")
# bytes per value of each payload; top-k sends a 4-byte value and a 4-byte index per kept
# entry (Aji & Heafield 2017); int8 neglects the per-block scales
PAYLOAD_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0, "topk": 8.0}
COMPRESSION_NAMES = {"none": "fp32"}  # the sizes model's word for an uncompressed payload
PHASES = ("compute", "communication", "serialization", "other", "idle")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PipelineStage:
    """``pipeline`` mode: one site's stage of the pipeline step (scalar leaves).

    Attributes:
      p2p_s: the step's activation and gradient sends across the WAN (perfmodel's ``pp_p2p_s``).
      bubble_s: the step's pipeline bubble.
      message_bytes: bytes the site (de)serialises per step (every message it sends).
    """

    p2p_s: Float[Array, ""]
    bubble_s: Float[Array, ""]
    message_bytes: Float[Array, ""]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SiteWork:
    """One site, its work timed (scalar leaves; stacked: a leading ``sites`` axis).

    Attributes:
      step_s: seconds of one local (inner) optimiser step.
      local_steps: steps per round (H; ``data-parallel`` and ``pipeline``: one).
      overhead_s: fixed seconds per round spent computing besides the steps (data loading).
      devices: devices at the site (weights of the overall figures).
      peak_flops_per_s: one device's peak in the compute dtype.
      mfu: model FLOPs utilisation of one step.
      tokens_per_step: tokens (samples of an MLP) one step trains.
      up_bytes_per_s, down_bytes_per_s: WAN line rates out of and into the site.
      latency_s: one-way WAN latency.
      link_efficiency: achieved fraction of the site's (window-capped) line rate.
      serialize_bytes_per_s, deserialize_bytes_per_s: payload (de)serialisation throughput
        (``inf``: tensors sent as they are).
      reduce_s: ``ring``: seconds the site spends reducing the chunks it receives.
      stage: ``pipeline`` mode only (else ``None``).
    """

    step_s: Float[Array, ""]
    local_steps: Float[Array, ""]
    overhead_s: Float[Array, ""]
    devices: Float[Array, ""]
    peak_flops_per_s: Float[Array, ""]
    mfu: Float[Array, ""]
    tokens_per_step: Float[Array, ""]
    up_bytes_per_s: Float[Array, ""]
    down_bytes_per_s: Float[Array, ""]
    latency_s: Float[Array, ""]
    link_efficiency: Float[Array, ""]
    serialize_bytes_per_s: Float[Array, ""]
    deserialize_bytes_per_s: Float[Array, ""]
    reduce_s: Float[Array, ""]
    stage: PipelineStage | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Exchange:
    """How the sites synchronise (names static, numbers scalar leaves).

    Attributes:
      params: model parameters (a payload has one value per parameter).
      fragments: streaming DiLoCo's F.
      wan_efficiency: a factor on every WAN rate, the sites' and the server's (the constant
        ``collab validate`` fits; 1: the sites' own ``link_efficiency`` alone).
      churn_rate: fraction of sites replaced per round; state_bytes: what a newcomer downloads.
      deadline_s: drop the sites whose steps of a round take longer (0: wait for all).
      topk_fraction: entries top-k keeps.
      server_bytes_per_s: the parameter server's line rate (``inf``: never the bottleneck).
      server_s: seconds the server spends averaging the uploads (``server`` topology).
      tcp_window_bytes: bytes a link keeps in flight (``inf``: no cap).
      window_s: the round's fixed length set by the protocol (0: as long as its work).
    """

    params: Float[Array, ""]
    fragments: Float[Array, ""]
    wan_efficiency: Float[Array, ""]
    churn_rate: Float[Array, ""]
    state_bytes: Float[Array, ""]
    deadline_s: Float[Array, ""]
    topk_fraction: Float[Array, ""]
    server_bytes_per_s: Float[Array, ""]
    server_s: Float[Array, ""]
    tcp_window_bytes: Float[Array, ""]
    window_s: Float[Array, ""]
    mode: str = jax.tree.static(default="diloco")
    topology: str = jax.tree.static(default="ring")
    compression: str = jax.tree.static(default="fp32")
    overlap: bool = jax.tree.static(default=False)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Round:
    """One round: per site (leaves ``[sites]``) and overall (scalars). Seconds, percent, bytes.

    ``compute_s + communication_s + serialization_s + other_s + idle_s == round_s`` for every
    site; a blocking round's ``communication_s`` is ``upload_s + download_s`` plus what the
    server's link and a newcomer's state download add, and its ``serialization_s`` is
    ``serialize_s + deserialize_s`` (an overlapped, streamed or windowed round exposes one shared
    exchange, which the phases split in halves). ``compute_utilization_pct`` is compute / wall
    time and ``compute_share_of_busy_pct`` compute / (wall time − idle), per site; the
    ``overall_`` figures weight the sites by their devices.
    """

    compute_s: Float[Array, " sites"]
    serialize_s: Float[Array, " sites"]
    deserialize_s: Float[Array, " sites"]
    upload_s: Float[Array, " sites"]
    download_s: Float[Array, " sites"]
    communication_s: Float[Array, " sites"]
    serialization_s: Float[Array, " sites"]
    other_s: Float[Array, " sites"]
    idle_s: Float[Array, " sites"]
    compute_utilization_pct: Float[Array, " sites"]
    compute_share_of_busy_pct: Float[Array, " sites"]
    communication_share_pct: Float[Array, " sites"]
    serialization_share_pct: Float[Array, " sites"]
    other_share_pct: Float[Array, " sites"]
    idle_share_pct: Float[Array, " sites"]
    mfu: Float[Array, " sites"]
    bytes_sent: Float[Array, " sites"]
    dropped: Float[Array, " sites"]
    round_s: Float[Array, ""]
    sync_s: Float[Array, ""]
    churn_s: Float[Array, ""]
    upload_bytes: Float[Array, ""]
    download_bytes: Float[Array, ""]
    params: Float[Array, ""]
    tokens_per_round: Float[Array, ""]
    overall_compute_utilization_pct: Float[Array, ""]
    overall_compute_share_of_busy_pct: Float[Array, ""]
    overall_mfu: Float[Array, ""]


def payload_bytes(params, num_sites, compression: str, topk_fraction):
    """Bytes one site uploads and downloads per synchronisation.

    Top-k keeps ``k·params`` entries; the average of ``n`` sparse updates has up to ``n·k·params``
    entries, never more than the dense fp32 vector.
    """
    comp = COMPRESSION_NAMES.get(compression, compression)
    up = params * PAYLOAD_BYTES[comp] * (topk_fraction if comp == "topk" else 1.0)
    if comp == "topk":
        return up, jnp.minimum(num_sites * up, params * PAYLOAD_BYTES["fp32"])
    return up, up


def window_capped(line_bytes_per_s, latency_s, window_bytes):
    """A link's rate: its line rate, or less when TCP's window runs out first.

    A sender may have at most ``window_bytes`` unacknowledged, and an acknowledgement returns one
    round trip (``2 · latency_s``) later, so the link carries at most ``window / RTT`` bytes per
    second (the bandwidth-delay product; Mathis et al. 1997, "The macroscopic behavior of the TCP
    congestion avoidance algorithm"). ``window_bytes`` ``inf`` leaves the line rate.
    """
    rtt = 2.0 * latency_s
    # double wheres: an infinite window or a zero round trip must leave finite gradients
    capped = jnp.isfinite(window_bytes) & (rtt > 0)
    cap = jnp.where(
        capped, jnp.where(capped, window_bytes, 1.0) / jnp.where(capped, rtt, 1.0), jnp.inf
    )
    return jnp.minimum(line_bytes_per_s, cap)


def _max_live(x, live):
    return jnp.max(jnp.where(live > 0, x, 0.0))


def _split(exposed, comm, ser):
    """Exposed seconds split between communication and serialisation in proportion."""
    total = comm + ser
    frac = jnp.where(total > 0, comm / jnp.where(total > 0, total, 1.0), 1.0)
    return exposed * frac, exposed * (1.0 - frac)


@dataclasses.dataclass(frozen=True)
class _Sync:
    """The round's transfers: per-site seconds, the shared extra, the whole sync, bytes sent."""

    upload: Array
    download: Array
    shared: Array  # what the server's own link adds beyond the slowest site (0 in a ring)
    total: Array
    sent: Array


def _sync(s: SiteWork, x: Exchange, live, n, up_b, down_b) -> _Sync:
    """The sync of one payload (``up_b`` out, ``down_b`` in per site) over the live sites.

    Ring: ``2(n-1)·α_max + 2(n-1)/n · bytes / β_min``, β the slowest live site's ``min(up,
    down)`` capped at ``window / (2 α_max)`` (the ring's longest hop sets every step), times its
    efficiency (:func:`perfmodel.all_reduce_s`); each site's upload and download are half of it.
    Server: each site's upload and download at its own capped rate; the whole sync is the slowest
    upload (or the server's ingress of ``n`` payloads), then the slowest download (or its egress).
    """
    eff = s.link_efficiency * x.wan_efficiency
    lat = _max_live(s.latency_s, live)
    if x.topology == "ring":
        line = jnp.minimum(s.up_bytes_per_s, s.down_bytes_per_s)
        bw = jnp.min(
            jnp.where(live > 0, window_capped(line, lat, x.tcp_window_bytes) * eff, jnp.inf)
        )
        t = all_reduce_s(n, up_b, lat, bw)
        half = jnp.zeros_like(s.step_s) + 0.5 * t
        sent = 2.0 * (n - 1.0) / jnp.maximum(n, 1.0) * up_b * live
        return _Sync(half, half, jnp.zeros_like(t), t, sent)
    up_bw = window_capped(s.up_bytes_per_s, s.latency_s, x.tcp_window_bytes) * eff
    down_bw = window_capped(s.down_bytes_per_s, s.latency_s, x.tcp_window_bytes) * eff
    up, down = p2p_s(up_b, s.latency_s, up_bw), p2p_s(down_b, s.latency_s, down_bw)
    up_max, down_max = _max_live(up, live), _max_live(down, live)
    server = x.server_bytes_per_s * x.wan_efficiency
    t = jnp.maximum(up_max, lat + n * up_b / server) + jnp.maximum(
        down_max, lat + n * down_b / server
    )
    return _Sync(up, down, t - (up_max + down_max), t, up_b * live)


def _churn_s(s: SiteWork, x: Exchange, live, n):
    """The expected delay a newcomer's state download adds per round: ``min(1, churn_rate · n)
    · (α + state / β)`` at the slowest live site's (window-capped) download rate."""
    eff = s.link_efficiency * x.wan_efficiency
    down_bw = window_capped(s.down_bytes_per_s, s.latency_s, x.tcp_window_bytes) * eff
    slowest = jnp.min(jnp.where(live > 0, down_bw, jnp.inf))
    churn = jnp.minimum(1.0, x.churn_rate * n) * (jnp.max(s.latency_s) + x.state_bytes / slowest)
    return jnp.where(x.churn_rate > 0, churn, 0.0)


def _exposed_exchange(x: Exchange, sync: _Sync, serde, cmax, frags):
    """Seconds of sync and serialisation that the steps wait for when one shared exchange is
    exposed (an overlapped, streamed or windowed round), and the whole sync and bytes sent."""
    if x.mode == "streaming-diloco":
        per = sync.total + serde / frags
        hidden = cmax / frags if x.overlap else 0.0
        comm, ser = _split(frags * jnp.maximum(per - hidden, 0.0), frags * sync.total, serde)
        return comm, ser, frags * sync.total, frags * sync.sent
    if x.overlap:
        comm, ser = _split(jnp.maximum(sync.total + serde - cmax, 0.0), sync.total, serde)
        return comm, ser, sync.total, sync.sent
    return sync.total, serde, sync.total, sync.sent


def collab_round(s: SiteWork, x: Exchange) -> Round:
    """One synchronous round of every site (sites stacked on the leading axis).

    A blocking round without a window follows each site's chain: with a server, site ``i``
    downloads, deserialises, computes (``H · step_s + overhead_s``), serialises and uploads, and
    the round lasts ``max_i(chain_i)`` plus the server's average (``server_s``), what its own
    link adds and the churn; in a ring, ``max_i(compute_i + serialise_i)``, the all-reduce, then
    ``max_i(deserialise_i + reduce_i)``. Otherwise one exchange is exposed: ``overlap`` shows
    ``max(0, sync + serde − compute_max)``, streaming DiLoCo ``F · max(0, sync_F + serde/F −
    compute_max/F)`` (nothing hidden without ``overlap``), a blocking windowed round the whole
    sync and serialisation; with ``window_s`` > 0 the round lasts ``max(window, exposed)`` and
    each site's steps run in what is left, ``min(compute, window − exposed)`` (Templar's inner
    loop stops when the window ends), idling for the rest. ``pipeline``: see
    :class:`PipelineStage`; every site runs its stage, the slowest sets the round.

    Args:
      s: a :class:`SiteWork` stack with leading axis ``sites``.
      x: the :class:`Exchange` (mode, topology, compression, overlap and their numbers).

    Returns:
      A :class:`Round`.
    """
    if x.mode == "pipeline":
        return _pipeline_round(s, x)
    steps = jnp.ones_like(s.local_steps) if x.mode == "data-parallel" else s.local_steps
    steps_s = steps * s.step_s
    work = steps_s + s.overhead_s
    too_slow = (x.deadline_s > 0) & (work > x.deadline_s)
    # a deadline never drops every site: the fastest one always counts
    live = jnp.where(too_slow & (work > jnp.min(work)), 0.0, 1.0)
    n = jnp.sum(live)
    up_b, down_b = payload_bytes(x.params, n, x.compression, x.topk_fraction)
    frags = x.fragments if x.mode == "streaming-diloco" else jnp.ones_like(x.fragments)
    sync = _sync(s, x, live, n, up_b / frags, down_b / frags)
    ser = live * (up_b / s.serialize_bytes_per_s)
    deser = live * (down_b / s.deserialize_bytes_per_s)
    churn = _churn_s(s, x, live, n)
    cmax = jnp.max(work * live)
    comm, ser_x, sync_total, sent = _exposed_exchange(
        x, sync, _max_live(ser + deser, live), cmax, frags
    )
    # one exposed exchange (and the server's average): a fixed window gives the steps what it
    # leaves
    average = x.server_s if x.topology == "server" else jnp.zeros_like(x.server_s)
    exposed = comm + ser_x + churn + average
    windowed = x.window_s > 0
    budget = jnp.maximum(x.window_s - exposed, 0.0)
    done = jnp.where(windowed, jnp.minimum(work, budget), work)
    shared = dict(
        round_s=jnp.where(windowed, jnp.maximum(x.window_s, exposed), cmax + exposed),
        compute=done * live,
        comm=(comm + churn) * live,
        ser=ser_x * live,
        other=average * live,
    )
    shared |= dict(
        idle=shared["round_s"]
        - shared["compute"]
        - shared["comm"]
        - shared["ser"]
        - shared["other"],
        upload=0.5 * shared["comm"],
        download=0.5 * shared["comm"],
        serialize=0.5 * shared["ser"],
        deserialize=0.5 * shared["ser"],
    )
    if x.mode == "streaming-diloco" or x.overlap:
        t = shared
    else:
        chain = _chains(s, x, sync, live, work, ser, deser, churn)
        t = {k: jnp.where(windowed, shared[k], chain[k]) for k in chain}
    steps_done = jnp.where(windowed, jnp.maximum(done - s.overhead_s, 0.0) / s.step_s, steps)
    useful = jnp.where(windowed, jnp.maximum(done - s.overhead_s, 0.0), steps_s) * live
    return _round_result(
        s, x, t, live, useful, steps_done * live, sync_total, sent, churn, up_b, down_b
    )


def _chains(s: SiteWork, x: Exchange, sync: _Sync, live, work, ser, deser, churn) -> dict:
    """A blocking round's phases as each site's chain of them (see :func:`collab_round`)."""
    up, down = sync.upload * live, sync.download * live
    extra = (sync.shared + churn) * live
    if x.topology == "server":
        chain = down + deser + work * live + ser + up
        round_s = jnp.max(chain) + x.server_s + sync.shared + churn
        other = x.server_s * live
        idle = round_s - other - chain - extra
    else:
        ready, finish = (work + ser) * live, (deser + s.reduce_s) * live
        round_s = jnp.max(ready) + sync.total + jnp.max(finish) + churn
        other = s.reduce_s * live
        idle = round_s - ready - sync.total * live - finish - churn * live
    return dict(
        round_s=round_s,
        compute=work * live,
        comm=up + down + extra,
        ser=ser + deser,
        other=other,
        upload=up,
        download=down,
        serialize=ser,
        deserialize=deser,
        idle=idle,
    )


def _pipeline_round(s: SiteWork, x: Exchange) -> Round:
    """``pipeline``: one step of a pipeline whose stages are the sites. A site computes all of
    its step but the WAN sends and the bubble (``step_s − p2p_s − bubble_s``, plus its
    overhead), (de)serialises its messages and sends them; the slowest site sets the round, and
    the bubble and the wait for it are idle."""
    st = s.stage
    compute = s.step_s - st.p2p_s - st.bubble_s + s.overhead_s
    ser = st.message_bytes / s.serialize_bytes_per_s
    deser = st.message_bytes / s.deserialize_bytes_per_s
    half = 0.5 * st.p2p_s
    own = compute + ser + deser + half + half + st.bubble_s
    round_s = jnp.max(own)
    zero = jnp.zeros_like(compute)
    t = dict(
        round_s=round_s,
        compute=compute,
        comm=half + half,
        ser=ser + deser,
        other=zero,
        upload=half,
        download=half,
        serialize=ser,
        deserialize=deser,
        idle=round_s - own + st.bubble_s,
    )
    live = jnp.ones_like(compute)
    msg = jnp.max(st.message_bytes)
    return _round_result(
        s, x, t, live, s.step_s, zero, jnp.max(st.p2p_s), st.message_bytes, 0.0 * msg, msg, msg,
        tokens=jnp.max(s.tokens_per_step),
    )  # fmt: skip


def _round_result(
    s, x, t, live, useful, steps_done, sync_s, sent, churn, up_b, down_b, tokens=None
):
    """The :class:`Round` of a round's phases ``t`` (per site; ``round_s`` shared)."""
    round_s = t["round_s"]
    # waiting; float32 rounding can leave -1e-6 s where there is none
    idle = jnp.maximum(t["idle"], 0.0)
    busy = t["compute"] + t["comm"] + t["ser"] + t["other"]

    def pct(v):
        return 100.0 * v / round_s

    dev = s.devices
    peak = s.peak_flops_per_s * dev
    of_busy = jnp.where(busy > 0, t["compute"] / jnp.where(busy > 0, busy, 1.0), 0.0)
    if tokens is None:
        tokens = jnp.sum(steps_done * s.tokens_per_step)
    return Round(
        compute_s=t["compute"],
        serialize_s=t["serialize"],
        deserialize_s=t["deserialize"],
        upload_s=t["upload"],
        download_s=t["download"],
        communication_s=t["comm"],
        serialization_s=t["ser"],
        other_s=t["other"],
        idle_s=idle,
        compute_utilization_pct=pct(t["compute"]),
        compute_share_of_busy_pct=100.0 * of_busy,
        communication_share_pct=pct(t["comm"]),
        serialization_share_pct=pct(t["ser"]),
        other_share_pct=pct(t["other"]),
        idle_share_pct=pct(idle),
        mfu=s.mfu * useful / round_s,
        bytes_sent=sent,
        dropped=1.0 - live,
        round_s=round_s,
        sync_s=sync_s,
        churn_s=churn,
        upload_bytes=up_b,
        download_bytes=down_b,
        params=x.params,
        tokens_per_round=tokens,
        overall_compute_utilization_pct=100.0
        * jnp.sum(t["compute"] * dev)
        / (round_s * jnp.sum(dev)),
        overall_compute_share_of_busy_pct=100.0
        * jnp.sum(t["compute"] * dev)
        / jnp.maximum(jnp.sum(busy * dev), 1e-30),
        overall_mfu=jnp.sum(s.mfu * useful * peak) / (round_s * jnp.sum(peak)),
    )


_grid = jax.jit(jax.vmap(collab_round, in_axes=(0, 0)))


def round_grid(s: SiteWork, x: Exchange) -> Round:
    """:func:`collab_round` over settings stacked on a leading ``settings`` axis (one
    ``jit(vmap)``): ``s`` leaves ``[settings, sites]``, ``x`` leaves ``[settings]``."""
    return _grid(s, x)


def stack(trees: list) -> object:
    """Stacks pytrees of one structure (sites, settings, or models of one kind) on a new leading
    axis, as float32."""
    return jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x, jnp.float32) for x in xs]), *trees)
