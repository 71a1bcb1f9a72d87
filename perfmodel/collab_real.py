"""Cross-site training of real models: sites timed by perfmodel's step model, and their tables.

Contract: a :class:`CrossSite` describes the collaboration with Python values (the model, per site
a hardware preset, a device count, sequences per inner step and the same strategy knobs as
:func:`perfmodel.estimate`; the WAN rates and the round's mode). :func:`site_estimates` times
each site's inner step with :func:`perfmodel.estimate` (so a site's numbers are exactly those of
``aisim perf estimate`` with the same flags), :func:`evaluate` runs the round model of
:mod:`perfmodel.collab_sites` over a grid of inner steps H and WAN rates in one ``jit(vmap)``,
and :func:`cross_site_frame` turns it into one table row per setting; :func:`pipeline_frame` is
the ``pipeline`` mode (one stage per site, perfmodel's pipeline step with the WAN as its tier).
This is the boundary:
bad values raise :class:`~simbase.errors.AisimError` with ``source=None`` and ``field`` the
parameter's name (the strategy's own names for a site's knobs, ``num_gpus`` for devices).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp
import numpy as np

from perfmodel.collab_sites import (
    PAYLOAD_BYTES,
    ROUND_MODES,
    SYNC_TOPOLOGIES,
    CrossSiteRound,
    SiteRate,
    WanRound,
    round_grid,
)
from perfmodel.estimate import Estimate, estimate
from perfmodel.workload import Model
from simbase.errors import bad_value

# a newcomer downloads the fp32 weights and DiLoCo's fp32 outer momentum (PRIME's live
# checkpoint recovery sends the model and optimiser state peer to peer)
STATE_BYTES_PER_PARAM = 8.0
COMPRESSION_ALIASES = {"none": "fp32"}


@dataclasses.dataclass(frozen=True)
class CrossSite:
    """A cross-site collaboration of a real model (Python values; per-site tuples of one value or
    one per site).

    Attributes:
      model: the model (:func:`perfmodel.resolve_model`).
      hardware: :class:`perfmodel.Hardware` per site.
      devices: devices per site.
      batch_size: sequences (samples) per site per inner step (the site's global batch).
      constants: :class:`perfmodel.Constants` per site (a calibrated stack profile) or ``None``.
      knobs: the intra-site strategy, :func:`perfmodel.estimate`'s knobs (``tp``, ``pp``,
        ``zero_stage``, ``recompute``, ``dtype``, ``micro_batch_size``, ...), shared by the sites.
      up_bytes_per_s, down_bytes_per_s: WAN line rates per site (bytes/s).
      latency_s: one-way WAN latency per site (seconds).
      serialize_bytes_per_s, deserialize_bytes_per_s: payload (de)serialisation throughput
        (``inf``: tensors sent as they are, as NCCL and Gloo do).
      mode, topology, compression, overlap: the round (see :mod:`perfmodel.collab_sites`).
      fragments: streaming DiLoCo's F.
      wan_efficiency: achieved fraction of the WAN line rate.
      churn_rate: fraction of sites replaced per round; deadline_s: 0 = wait for every site.
      topk_fraction: entries top-k keeps; server_bytes_per_s: the parameter server's line rate
        (``None``: the fastest site's).
      tcp_window_bytes: bytes a WAN link keeps in flight (its TCP window); caps a link at
        ``window / RTT`` (``inf``: no cap).
      window_s: the round's fixed length set by the protocol (seconds; ``0``: none), e.g.
        Templar's ``blocks_per_window`` × 12 s chain blocks.
      inner_step_s: a measured inner-step time per site (seconds) that replaces the step model's
        (``None``: :func:`perfmodel.estimate`'s).
    """

    model: Model
    hardware: tuple
    devices: tuple = (8,)
    batch_size: tuple = (128,)
    constants: tuple | None = None
    knobs: dict = dataclasses.field(default_factory=dict)
    up_bytes_per_s: tuple = (125e6,)
    down_bytes_per_s: tuple = (125e6,)
    latency_s: tuple = (0.05,)
    serialize_bytes_per_s: float = math.inf
    deserialize_bytes_per_s: float = math.inf
    mode: str = "diloco"
    topology: str = "ring"
    compression: str = "fp32"
    overlap: bool = False
    fragments: int = 1
    wan_efficiency: float = 1.0
    churn_rate: float = 0.0
    deadline_s: float = 0.0
    topk_fraction: float = 0.01
    server_bytes_per_s: float | None = None
    tcp_window_bytes: float = math.inf
    window_s: float = 0.0
    inner_step_s: tuple | None = None

    @property
    def num_sites(self) -> int:
        return len(self.hardware)

    def per_site(self, name: str) -> list:
        """A per-site field, one value per site (a single value is repeated).

        Raises:
          AisimError: ``name`` has neither one value nor one per site.
        """
        v = getattr(self, name)
        if v is None or not isinstance(v, tuple | list):
            return [v] * self.num_sites
        if len(v) == 1:
            return list(v) * self.num_sites
        if len(v) != self.num_sites:
            raise bad_value(None, name, tuple(v), f"1 value or one per site ({self.num_sites})")
        return list(v)


def check_round(cs: CrossSite) -> str:
    """Validates the round's choices and numbers; returns the compression's canonical name.

    Raises:
      AisimError: naming the field (``mode``, ``topology``, ``compression``, ``fragments``,
        ``wan_efficiency``, ``churn_rate``, ``deadline_s``, ``topk_fraction``,
        ``tcp_window_bytes``, ``window_s``, ``inner_step_s``).
    """
    if cs.mode not in ROUND_MODES:
        modes = ", ".join((*ROUND_MODES, "pipeline"))
        raise bad_value(None, "mode", cs.mode, "one of " + modes)
    if cs.topology not in SYNC_TOPOLOGIES:
        raise bad_value(None, "topology", cs.topology, "one of " + ", ".join(SYNC_TOPOLOGIES))
    comp = COMPRESSION_ALIASES.get(cs.compression, cs.compression)
    if comp not in PAYLOAD_BYTES:
        raise bad_value(None, "compression", cs.compression, "one of " + ", ".join(PAYLOAD_BYTES))
    if isinstance(cs.fragments, bool) or not isinstance(cs.fragments, int) or cs.fragments < 1:
        raise bad_value(None, "fragments", cs.fragments, "a positive integer")
    checks = (
        ("wan_efficiency", cs.wan_efficiency, lambda x: x > 0, "a positive factor"),
        ("churn_rate", cs.churn_rate, lambda x: 0 <= x <= 1, "a fraction in [0, 1]"),
        ("deadline_s", cs.deadline_s, lambda x: x >= 0, "seconds >= 0 (0: no deadline)"),
        ("topk_fraction", cs.topk_fraction, lambda x: 0 < x <= 1, "a fraction in (0, 1]"),
        ("window_s", cs.window_s, lambda x: x >= 0, "seconds >= 0 (0: no fixed window)"),
    )
    for field, v, ok, expected in checks:
        if not (isinstance(v, int | float) and math.isfinite(v) and ok(v)):
            raise bad_value(None, field, v, expected)
    w = cs.tcp_window_bytes
    if isinstance(w, bool) or not (isinstance(w, int | float) and w > 0):
        raise bad_value(None, "tcp_window_bytes", w, "a positive number of bytes (inf: no cap)")
    if cs.inner_step_s is not None:
        for v in cs.per_site("inner_step_s"):
            if isinstance(v, bool) or not (isinstance(v, int | float) and 0 < v < math.inf):
                raise bad_value(None, "inner_step_s", v, "positive seconds per inner step")
    return comp


def inner_step_times(cs: CrossSite, ests: list[Estimate]) -> list[float]:
    """Each site's inner-step seconds: the measured ``inner_step_s`` where given, else the step
    model's."""
    if cs.inner_step_s is None:
        return [float(e.step_time_s) for e in ests]
    return [float(v) for v in cs.per_site("inner_step_s")]


def site_estimates(cs: CrossSite) -> list[Estimate]:
    """Each site's inner step: :func:`perfmodel.estimate` with ``num_gpus`` = its devices,
    ``global_batch`` = its sequences per inner step and the shared knobs (sites with the same
    hardware, devices, batch and constants are timed once)."""
    hws, devs, batches = cs.per_site("hardware"), cs.per_site("devices"), cs.per_site("batch_size")
    consts = cs.per_site("constants")
    seen: dict[tuple, Estimate] = {}
    out = []
    for hw, dev, batch, c in zip(hws, devs, batches, consts, strict=True):
        key = (hw.name, dev, batch, id(c))
        if key not in seen:
            seen[key] = estimate(
                cs.model, hw, constants=c, num_gpus=dev, global_batch=batch, **cs.knobs
            )
        out.append(seen[key])
    return out


def site_rates(cs: CrossSite, ests: list[Estimate], bandwidth: float | None = None) -> SiteRate:
    """The stacked :class:`SiteRate` of the sites (``bandwidth``: every site's rate both ways,
    replacing the per-site rates, for a bandwidth sweep)."""
    f = np.float32
    up = cs.per_site("up_bytes_per_s") if bandwidth is None else [bandwidth] * cs.num_sites
    down = cs.per_site("down_bytes_per_s") if bandwidth is None else [bandwidth] * cs.num_sites
    for i, (u, d) in enumerate(zip(up, down, strict=True)):
        for field, v in (("up_bandwidth", u), ("down_bandwidth", d)):
            if not (isinstance(v, int | float) and v > 0):
                raise bad_value(f"site{i + 1}", field, v, "a positive rate (bytes/s)")
    lat = cs.per_site("latency_s")
    for i, v in enumerate(lat):
        if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
            raise bad_value(f"site{i + 1}", "latency", v, "a non-negative number of seconds")
    seq = float(cs.model.spec.seq_len) if cs.model.spec.kind == "transformer" else 1.0
    batches = cs.per_site("batch_size")
    steps = inner_step_times(cs, ests)
    # the model's FLOPs over a measured step: MFU scales as the step model's time / the measured
    mfu = [
        float(e.breakdown.mfu) * float(e.step_time_s) / t for e, t in zip(ests, steps, strict=True)
    ]
    return SiteRate(
        inner_step_s=np.array(steps, f),
        devices=np.array(cs.per_site("devices"), f),
        peak_flops_per_s=np.array([_peak(e) for e in ests], f),
        mfu=np.array(mfu, f),
        tokens_per_step=np.array([b * seq for b in batches], f),
        up_bytes_per_s=np.array(up, f),
        down_bytes_per_s=np.array(down, f),
        latency_s=np.array(lat, f),
        serialize_bytes_per_s=np.full(cs.num_sites, cs.serialize_bytes_per_s, f),
        deserialize_bytes_per_s=np.full(cs.num_sites, cs.deserialize_bytes_per_s, f),
    )


def _peak(e: Estimate) -> float:
    """One device's peak FLOP/s in the estimate's compute dtype."""
    return float(e.hardware.spec.peak_flops_per_s[int(e.strategy.dtype)])


def make_round(cs: CrossSite, params: float, local_steps: float, bandwidths) -> WanRound:
    """The :class:`WanRound` of the collaboration at ``local_steps`` (validated)."""
    comp = check_round(cs)
    if not (isinstance(local_steps, int | float) and local_steps >= 1):
        raise bad_value(None, "local_steps", local_steps, "at least 1 inner step per round")
    server = cs.server_bytes_per_s
    if server is None:
        server = float(max(bandwidths))
    f = jnp.float32
    return WanRound(
        params=jnp.asarray(params, f),
        local_steps=jnp.asarray(float(local_steps), f),
        fragments=jnp.asarray(float(cs.fragments), f),
        wan_efficiency=jnp.asarray(cs.wan_efficiency, f),
        churn_rate=jnp.asarray(cs.churn_rate, f),
        state_bytes=jnp.asarray(params * STATE_BYTES_PER_PARAM, f),
        deadline_s=jnp.asarray(cs.deadline_s, f),
        topk_fraction=jnp.asarray(cs.topk_fraction, f),
        server_bytes_per_s=jnp.asarray(server, f),
        tcp_window_bytes=jnp.asarray(float(cs.tcp_window_bytes), f),
        window_s=jnp.asarray(float(cs.window_s), f),
        mode=cs.mode,
        topology=cs.topology,
        compression=comp,
        overlap=bool(cs.overlap),
    )


@dataclasses.dataclass(frozen=True)
class CrossSiteResult:
    """The grid of settings and its rounds (leaves ``[settings, sites]`` / ``[settings]``)."""

    settings: list[dict[str, Any]]  # {"local_steps": H, "wan_bytes_per_s": rate or None}
    rounds: CrossSiteRound
    estimates: list[Estimate]


def evaluate(cs: CrossSite, local_steps=(100,), bandwidths=None) -> CrossSiteResult:
    """Every (H, WAN rate) setting in one ``jit(vmap)`` of :func:`cross_site_round`.

    Args:
      cs: the collaboration.
      local_steps: inner steps H to try.
      bandwidths: WAN rates to try (bytes/s, every site both ways); ``None``: the sites' own.
    """
    import jax

    ests = site_estimates(cs)
    params = float(ests[0].to_dict()["params"]) if ests else 0.0
    rates = [None] if bandwidths is None else list(bandwidths)
    settings, sites, rounds = [], [], []
    for h in local_steps:
        for bw in rates:
            s = site_rates(cs, ests, bw)
            own = list(np.asarray(s.up_bytes_per_s)) + list(np.asarray(s.down_bytes_per_s))
            settings.append({"local_steps": float(h), "wan_bytes_per_s": bw})
            sites.append(s)
            rounds.append(make_round(cs, params, h, own))
    stack = lambda xs: jax.tree.map(lambda *a: jnp.stack([jnp.asarray(x) for x in a]), *xs)  # noqa: E731
    return CrossSiteResult(settings, round_grid(stack(sites), stack(rounds)), ests)


SITE_COLUMNS = (
    "compute_utilization_pct",
    "communication_share_pct",
    "serialization_share_pct",
    "idle_share_pct",
    "mfu",
    "bytes_sent",
    "dropped",
)


def cross_site_frame(cs: CrossSite, res: CrossSiteResult, tokens: float | None = None):
    """One row per setting: the round, the overall shares and each site's.

    Columns: ``mode``, ``local_steps``, ``wan_bandwidth_bps`` (bits/s; the sites' own rates when
    not swept: NaN), ``inner_step_s`` (the slowest site's), ``round_s``, ``sync_s``, ``churn_s``,
    ``payload_bytes``, ``compute_utilization_pct``, ``communication_share_pct``,
    ``serialization_share_pct``, ``idle_share_pct`` (device-weighted over the sites), ``mfu``,
    ``tokens_per_round``, ``bytes_sent`` (all sites, per round), ``dropped_sites``,
    ``time_to_train_s`` (``tokens`` given), then ``site{i}_inner_step_s``,
    ``site{i}_memory_gib``, ``site{i}_fits_memory`` and ``site{i}_<each of SITE_COLUMNS>``.
    """
    import pandas as pd

    r = jax_to_np(res.rounds)
    dev = np.array(cs.per_site("devices"), np.float64)
    w = dev / dev.sum()
    inner = np.array(inner_step_times(cs, res.estimates))
    df = pd.DataFrame(
        {
            "mode": cs.mode,
            "local_steps": [s["local_steps"] for s in res.settings],
            "wan_bandwidth_bps": [
                np.nan if s["wan_bytes_per_s"] is None else 8.0 * s["wan_bytes_per_s"]
                for s in res.settings
            ],
            "inner_step_s": inner.max(),
            "round_s": r["round_s"],
            "sync_s": r["sync_s"],
            "churn_s": r["churn_s"],
            "payload_bytes": r["payload_bytes"],
            "compute_utilization_pct": r["compute_utilization_pct"],
            "communication_share_pct": r["communication_share_pct"] @ w,
            "serialization_share_pct": r["serialization_share_pct"] @ w,
            "idle_share_pct": r["idle_share_pct"] @ w,
            "mfu": r["overall_mfu"],
            "tokens_per_round": r["tokens_per_round"],
            "bytes_sent": r["bytes_sent"].sum(axis=1),
            "dropped_sites": r["dropped"].sum(axis=1).astype(int),
        }
    )
    if tokens is not None:
        df["time_to_train_s"] = tokens / r["tokens_per_round"] * r["round_s"]
    names = {"compute_utilization_pct": "compute_share_pct"}
    cols: dict[str, Any] = {}
    for i, e in enumerate(res.estimates):
        cols[f"site{i + 1}_inner_step_s"] = inner[i]
        cols[f"site{i + 1}_memory_gib"] = e.to_dict()["memory"]["total_bytes"] / 2.0**30
        cols[f"site{i + 1}_fits_memory"] = bool(e.breakdown.fits_memory)
        for k in SITE_COLUMNS:
            cols[f"site{i + 1}_{k}"] = r[names.get(k, k)][:, i]
    return pd.concat([df, pd.DataFrame(cols, index=df.index)], axis=1)


def jax_to_np(tree) -> dict[str, np.ndarray]:
    """A result dataclass's leaves as float64 numpy arrays, by field name."""
    return {f.name: np.asarray(getattr(tree, f.name), np.float64) for f in dataclasses.fields(tree)}


def pipeline_frame(cs: CrossSite, bandwidths=None, tokens: float | None = None):
    """``pipeline`` mode: the model's pipeline stages at different sites (one stage per site),
    timed by :func:`perfmodel.estimate` with the sites as the pipeline tier.

    The step is perfmodel's with ``pp`` = the number of sites, ``num_gpus`` = sites × devices,
    each site's devices as one scale-up domain (``gpus_per_node``), and the inter-node tier (the
    one pipeline sends cross) replaced by the WAN: rate ``min(up, down)`` of the slowest site,
    the largest latency and ``wan_efficiency``. ``batch_size`` is the whole pipeline's batch (one
    model replica spans the sites). A round is one step: compute (with the intra-site
    communication left exposed, the optimiser and overheads), communication (the pipeline sends)
    and idle (the bubble). Returns the columns of :func:`cross_site_frame`.

    Raises:
      AisimError: sites that differ in hardware or devices, or ``pp`` > 1 inside a site.
    """
    import pandas as pd

    check_round(dataclasses.replace(cs, mode="diloco"))
    if cs.window_s > 0:
        raise bad_value(None, "window_s", cs.window_s, "0 in pipeline mode (a round is one step)")
    hws, devs = cs.per_site("hardware"), cs.per_site("devices")
    if len({h.name for h in hws}) > 1:
        raise bad_value(None, "client_hardware", ",".join(h.name for h in hws), "one preset")
    if len(set(devs)) > 1:
        raise bad_value(None, "devices", tuple(devs), "the same devices at every pipeline site")
    if int(cs.knobs.get("pp", 1)) != 1:
        raise bad_value(None, "pp", cs.knobs["pp"], "1 in pipeline mode (the sites are the stages)")
    n, dev, hw = cs.num_sites, int(devs[0]), hws[0]
    base = cs.per_site("constants")[0] or hw.constants
    lat = max(cs.per_site("latency_s"))
    rates = [None] if bandwidths is None else list(bandwidths)
    rows, ests = [], []
    for bw in rates:
        up = cs.per_site("up_bytes_per_s") if bw is None else [bw] * n
        down = cs.per_site("down_bytes_per_s") if bw is None else [bw] * n
        rate = float(min(min(up), min(down)))
        spec = dataclasses.replace(
            hw.spec, link_bandwidth_bytes_per_s=hw.spec.link_bandwidth_bytes_per_s.at[1].set(rate)
        )
        c = dataclasses.replace(
            base,
            link_latency_s=jnp.asarray(base.link_latency_s).at[1].set(lat),
            link_bandwidth_efficiency=jnp.asarray(base.link_bandwidth_efficiency)
            .at[1]
            .set(cs.wan_efficiency),
        )
        knobs = {**cs.knobs, "pp": n}
        e = estimate(
            cs.model,
            dataclasses.replace(hw, spec=spec),
            constants=c,
            gpus_per_node=dev,
            num_gpus=n * dev,
            global_batch=int(cs.per_site("batch_size")[0]),
            **knobs,
        )
        ests.append(e)
        b = e.breakdown
        step = float(b.step_time_s)
        comm = float(b.pp_p2p_s)
        idle = float(b.bubble_s)
        compute = step - comm - idle
        seq = float(cs.model.spec.seq_len) if cs.model.spec.kind == "transformer" else 1.0
        tok = float(cs.per_site("batch_size")[0]) * seq
        row = {
            "mode": "pipeline",
            "local_steps": 1.0,
            "wan_bandwidth_bps": np.nan if bw is None else 8.0 * bw,
            "inner_step_s": step,
            "round_s": step,
            "sync_s": comm,
            "churn_s": 0.0,
            "payload_bytes": np.nan,
            "compute_utilization_pct": 100.0 * compute / step,
            "communication_share_pct": 100.0 * comm / step,
            "serialization_share_pct": 0.0,
            "idle_share_pct": 100.0 * idle / step,
            "mfu": float(b.mfu),
            "tokens_per_round": tok,
            "bytes_sent": np.nan,
            "dropped_sites": 0,
        }
        if tokens is not None:
            row["time_to_train_s"] = tokens / tok * step
        mem = e.to_dict()["memory"]["total_bytes"] / 2.0**30
        for i in range(n):
            p = f"site{i + 1}_"
            row |= {
                p + "inner_step_s": step,
                p + "memory_gib": mem,
                p + "fits_memory": bool(b.fits_memory),
                p + "compute_utilization_pct": row["compute_utilization_pct"],
                p + "communication_share_pct": row["communication_share_pct"],
                p + "serialization_share_pct": 0.0,
                p + "idle_share_pct": row["idle_share_pct"],
                p + "mfu": float(b.mfu),
                p + "bytes_sent": np.nan,
                p + "dropped": 0.0,
            }
        rows.append(row)
    return pd.DataFrame(rows), ests
