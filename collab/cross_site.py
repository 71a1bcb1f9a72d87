"""Cross-site training of real models: each site a cluster timed by :func:`perfmodel.estimate`.

Contract: a :class:`CrossSite` describes the collaboration with Python values (the model, per site
a hardware preset, a device count, sequences per inner step, the strategy knobs of
:func:`perfmodel.estimate` and a software stack; the WAN rates and the round's mode).
:func:`site_estimates` times each site's inner step with :func:`perfmodel.estimate` (so a site's
numbers are exactly those of ``aisim perf estimate`` with the same flags; in ``pipeline`` mode
one estimate of the pipeline whose stages are the sites, the WAN as its tier), and
:func:`evaluate` runs the one round model (:func:`collab.round_model.collab_round`) over a grid
of inner steps H and WAN rates in one ``jit(vmap)``; :func:`cross_site_frame` turns it into one
table row per setting. This is the boundary: bad values raise
:class:`~simbase.errors.AisimError` with ``source=None`` and ``field`` the parameter's name (the
strategy's own names for a site's knobs, ``num_gpus`` for devices).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp
import numpy as np
import pandas as pd

from collab.round_model import (
    COMPRESSION_NAMES,
    PAYLOAD_BYTES,
    ROUND_MODES,
    SYNC_TOPOLOGIES,
    Exchange,
    PipelineStage,
    Round,
    SiteWork,
    round_grid,
    stack,
)
from collab.scenario_model import activation_bytes
from perfmodel import Estimate, Model, estimate
from simbase.errors import bad_value

# a newcomer downloads the fp32 weights and DiLoCo's fp32 outer momentum (PRIME's live
# checkpoint recovery sends the model and optimiser state peer to peer)
STATE_BYTES_PER_PARAM = 8.0


@dataclasses.dataclass(frozen=True)
class CrossSite:
    """A cross-site collaboration of a real model (Python values; per-site tuples of one value or
    one per site).

    Attributes:
      model: the model (:func:`perfmodel.resolve_model`).
      hardware: :class:`perfmodel.Hardware` per site.
      devices: devices per site.
      batch_size: sequences (samples) per site per inner step (the site's global batch).
      constants: :class:`perfmodel.Constants` per site (a calibrated profile) or ``None``.
      knobs: the intra-site strategy, :func:`perfmodel.estimate`'s knobs (``tp``, ``pp``,
        ``zero_stage``, ``recompute``, ``dtype``, ``micro_batch_size``, ...), shared by the sites.
      stack: the sites' software :class:`perfmodel.Stack` (``None``: the registry's behaviours).
      up_bytes_per_s, down_bytes_per_s: WAN line rates per site (bytes/s).
      latency_s: one-way WAN latency per site (seconds).
      serialize_bytes_per_s, deserialize_bytes_per_s: payload (de)serialisation throughput
        (``inf``: tensors sent as they are, as NCCL and Gloo do).
      mode, topology, compression, overlap: the round (see :mod:`collab.round_model`).
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
    stack: Any = None
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
        raise bad_value(None, "mode", cs.mode, "one of " + ", ".join(ROUND_MODES))
    if cs.topology not in SYNC_TOPOLOGIES:
        raise bad_value(None, "topology", cs.topology, "one of " + ", ".join(SYNC_TOPOLOGIES))
    comp = COMPRESSION_NAMES.get(cs.compression, cs.compression)
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
    if cs.mode == "pipeline" and cs.window_s > 0:
        raise bad_value(None, "window_s", cs.window_s, "0 in pipeline mode (a round is one step)")
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
    ``global_batch`` = its sequences per inner step, the shared knobs and stack (sites with the
    same hardware, devices, batch and constants are timed once)."""
    hws, devs, batches = cs.per_site("hardware"), cs.per_site("devices"), cs.per_site("batch_size")
    consts = cs.per_site("constants")
    seen: dict[tuple, Estimate] = {}
    out = []
    for hw, dev, batch, c in zip(hws, devs, batches, consts, strict=True):
        key = (hw.name, dev, batch, id(c))
        if key not in seen:
            seen[key] = estimate(
                cs.model, hw, constants=c, num_gpus=dev, global_batch=batch, stack=cs.stack,
                **cs.knobs,
            )  # fmt: skip
        out.append(seen[key])
    return out


def _tokens_per_step(cs: CrossSite) -> list[float]:
    seq = float(cs.model.spec.seq_len) if cs.model.spec.kind == "transformer" else 1.0
    return [b * seq for b in cs.per_site("batch_size")]


def _rates(cs: CrossSite, bandwidth: float | None) -> tuple[list, list, list]:
    """Each site's up and down line rates (``bandwidth``: every site's, both ways) and latency."""
    up = cs.per_site("up_bytes_per_s") if bandwidth is None else [bandwidth] * cs.num_sites
    down = cs.per_site("down_bytes_per_s") if bandwidth is None else [bandwidth] * cs.num_sites
    for i, (u, d) in enumerate(zip(up, down, strict=True)):
        for field, v in (("up_bandwidth", u), ("down_bandwidth", d)):
            if not (isinstance(v, int | float) and 0 < v < math.inf):
                raise bad_value(f"site{i + 1}", field, v, "a positive rate (bytes/s)")
    lat = cs.per_site("latency_s")
    for i, v in enumerate(lat):
        if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
            raise bad_value(f"site{i + 1}", "latency", v, "a non-negative number of seconds")
    return up, down, lat


def site_work(
    cs: CrossSite, ests: list[Estimate], local_steps: float, bandwidth: float | None = None
) -> SiteWork:
    """The stacked :class:`~collab.round_model.SiteWork` of the sites at ``local_steps`` inner
    steps (``bandwidth``: every site's rate both ways, replacing the per-site rates)."""
    up, down, lat = _rates(cs, bandwidth)
    steps = inner_step_times(cs, ests)
    # the model's FLOPs over a measured step: MFU scales as the step model's time / the measured
    mfu = [float(e.breakdown.mfu) * e.step_time_s / t for e, t in zip(ests, steps, strict=True)]
    n, f = cs.num_sites, np.float32
    return SiteWork(
        step_s=np.array(steps, f),
        local_steps=np.full(n, local_steps, f),
        overhead_s=np.zeros(n, f),
        devices=np.array(cs.per_site("devices"), f),
        peak_flops_per_s=np.array([_peak(e) for e in ests], f),
        mfu=np.array(mfu, f),
        tokens_per_step=np.array(_tokens_per_step(cs), f),
        up_bytes_per_s=np.array(up, f),
        down_bytes_per_s=np.array(down, f),
        latency_s=np.array(lat, f),
        link_efficiency=np.ones(n, f),
        serialize_bytes_per_s=np.full(n, cs.serialize_bytes_per_s, f),
        deserialize_bytes_per_s=np.full(n, cs.deserialize_bytes_per_s, f),
        reduce_s=np.zeros(n, f),
    )


def _peak(e: Estimate) -> float:
    """One device's peak FLOP/s in the estimate's compute dtype."""
    return float(e.hardware.spec.peak_flops_per_s[int(e.strategy.memory.dtype)])


def make_exchange(cs: CrossSite, params: float, bandwidths) -> Exchange:
    """The :class:`~collab.round_model.Exchange` of the collaboration (validated); the server's
    rate defaults to the fastest of ``bandwidths``."""
    comp = check_round(cs)
    server = cs.server_bytes_per_s
    if server is None:
        server = float(max(bandwidths))
    f = jnp.float32
    return Exchange(
        params=jnp.asarray(params, f),
        fragments=jnp.asarray(float(cs.fragments), f),
        wan_efficiency=jnp.asarray(cs.wan_efficiency, f),
        churn_rate=jnp.asarray(cs.churn_rate, f),
        state_bytes=jnp.asarray(params * STATE_BYTES_PER_PARAM, f),
        deadline_s=jnp.asarray(cs.deadline_s, f),
        topk_fraction=jnp.asarray(cs.topk_fraction, f),
        server_bytes_per_s=jnp.asarray(server, f),
        server_s=jnp.zeros((), f),
        tcp_window_bytes=jnp.asarray(float(cs.tcp_window_bytes), f),
        window_s=jnp.asarray(float(cs.window_s), f),
        mode=cs.mode,
        topology=cs.topology,
        compression=comp,
        overlap=bool(cs.overlap),
    )


def _check_pipeline(cs: CrossSite) -> None:
    hws, devs = cs.per_site("hardware"), cs.per_site("devices")
    if len({h.name for h in hws}) > 1:
        raise bad_value(None, "client_hardware", ",".join(h.name for h in hws), "one preset")
    if len(set(devs)) > 1:
        raise bad_value(None, "devices", tuple(devs), "the same devices at every pipeline site")
    if int(cs.knobs.get("pp", 1)) != 1:
        raise bad_value(None, "pp", cs.knobs["pp"], "1 in pipeline mode (the sites are the stages)")


def pipeline_estimate(cs: CrossSite, bandwidth: float | None = None) -> Estimate:
    """``pipeline`` mode: perfmodel's step with ``pp`` = the number of sites, ``num_gpus`` =
    sites × devices, each site's devices one scale-up domain (``gpus_per_node``), and the
    inter-node tier (the one the pipeline sends cross) replaced by the WAN: rate ``min(up,
    down)`` of the slowest site, the largest latency and ``wan_efficiency``. ``batch_size`` is
    the whole pipeline's batch (one model replica spans the sites).

    Raises:
      AisimError: sites that differ in hardware or devices, or ``pp`` > 1 inside a site.
    """
    _check_pipeline(cs)
    up, down, lat = _rates(cs, bandwidth)
    n, dev, hw = cs.num_sites, int(cs.per_site("devices")[0]), cs.per_site("hardware")[0]
    base = cs.per_site("constants")[0] or hw.constants
    rate = float(min(min(up), min(down)))
    spec = dataclasses.replace(
        hw.spec, link_bandwidth_bytes_per_s=hw.spec.link_bandwidth_bytes_per_s.at[1].set(rate)
    )
    c = dataclasses.replace(
        base,
        link_latency_s=jnp.asarray(base.link_latency_s).at[1].set(max(lat)),
        link_bandwidth_efficiency=jnp.asarray(base.link_bandwidth_efficiency)
        .at[1]
        .set(cs.wan_efficiency),
    )
    return estimate(
        cs.model, dataclasses.replace(hw, spec=spec), constants=c, gpus_per_node=dev,
        num_gpus=n * dev, global_batch=int(cs.per_site("batch_size")[0]), stack=cs.stack,
        **{**cs.knobs, "pp": n},
    )  # fmt: skip


def pipeline_work(cs: CrossSite, e: Estimate) -> SiteWork:
    """Every site's :class:`~collab.round_model.SiteWork` of a pipeline step (one stage each):
    its sends and bubble from the estimate, its messages the activations (forward) and their
    gradients (backward) of each of the ``m`` microbatches, ``2(m + p − 1)`` on the step's
    critical path as in perfmodel's pipeline term."""
    b, s = e.breakdown, e.strategy
    spec = cs.model.spec
    seq = float(spec.seq_len) if spec.kind == "transformer" else 1.0
    message = float(s.batching.micro_batch_size) * seq * float(spec.hidden_size)
    message *= float(activation_bytes(int(s.memory.dtype)))
    count = 2.0 * (float(s.batching.num_microbatches) + cs.num_sites - 1.0)
    n, f = cs.num_sites, np.float32
    full = lambda v: np.full(n, v, f)  # noqa: E731
    work = site_work(dataclasses.replace(cs, inner_step_s=None), [e] * n, 1.0)
    return dataclasses.replace(
        work,
        step_s=full(e.step_time_s),
        tokens_per_step=full(_tokens_per_step(cs)[0]),
        stage=PipelineStage(
            p2p_s=full(float(b.pp_p2p_s)),
            bubble_s=full(float(b.bubble_s)),
            message_bytes=full(count * message),
        ),
    )


@dataclasses.dataclass(frozen=True)
class CrossSiteResult:
    """The grid of settings and its rounds (leaves ``[settings, sites]`` / ``[settings]``).

    Attributes:
      settings: per setting ``{"local_steps": H, "wan_bytes_per_s": rate or None}``.
      sites: the stacked :class:`~collab.round_model.SiteWork` of every setting.
      rounds: the :class:`~collab.round_model.Round` of every setting.
      estimates: each site's estimate (``pipeline``: the first setting's pipeline, per site).
    """

    settings: list[dict[str, Any]]
    sites: SiteWork
    rounds: Round
    estimates: list[Estimate]


def evaluate(cs: CrossSite, local_steps=(100,), bandwidths=None) -> CrossSiteResult:
    """Every (H, WAN rate) setting in one ``jit(vmap)`` of the round model.

    Args:
      cs: the collaboration.
      local_steps: inner steps H to try (``data-parallel`` and ``pipeline``: one step a round).
      bandwidths: WAN rates to try (bytes/s, every site both ways); ``None``: the sites' own.
    """
    check_round(cs)
    for h in local_steps:
        if isinstance(h, bool) or not (isinstance(h, int | float) and 1 <= h < math.inf):
            raise bad_value(None, "local_steps", h, "at least 1 inner step per round")
    if cs.mode in ("data-parallel", "pipeline"):
        local_steps = (1,)
    rates = [None] if bandwidths is None else list(bandwidths)
    rows: dict[tuple[int, int], tuple] = {}
    ests = None if cs.mode == "pipeline" else site_estimates(cs)
    first = ests
    for j, bw in enumerate(rates):
        if cs.mode == "pipeline":
            ests = [pipeline_estimate(cs, bw)] * cs.num_sites
            first = first or ests
        params = float(ests[0].to_dict()["params"])
        for i, h in enumerate(local_steps):
            s = pipeline_work(cs, ests[0]) if cs.mode == "pipeline" else site_work(cs, ests, h, bw)
            own = [*np.asarray(s.up_bytes_per_s), *np.asarray(s.down_bytes_per_s)]
            setting = {"local_steps": float(h), "wan_bytes_per_s": bw}
            rows[i, j] = (setting, s, make_exchange(cs, params, own))
    settings, sites, exchanges = zip(*(rows[k] for k in sorted(rows)), strict=True)
    sites = stack(list(sites))
    return CrossSiteResult(list(settings), sites, round_grid(sites, stack(list(exchanges))), first)


SITE_COLUMNS = (
    "compute_utilization_pct",
    "compute_share_of_busy_pct",
    "communication_share_pct",
    "serialization_share_pct",
    "idle_share_pct",
    "mfu",
    "bytes_sent",
    "dropped",
)


def cross_site_frame(cs: CrossSite, res: CrossSiteResult, tokens: float | None = None):
    """One row per setting: the round, the overall figures and each site's.

    Columns: ``mode``, ``local_steps``, ``wan_bandwidth_bps`` (bits/s; the sites' own rates when
    not swept: NaN), ``inner_step_s`` (the slowest site's), ``round_s``, ``sync_s``, ``churn_s``,
    ``payload_bytes`` (``pipeline``: the step's messages), ``compute_utilization_pct`` (compute
    / wall time) and ``compute_share_of_busy_pct`` (compute / the time not idle), both weighted
    by the sites' devices, ``communication_share_pct``, ``serialization_share_pct``,
    ``idle_share_pct`` (device-weighted over the sites), ``mfu``, ``tokens_per_round``,
    ``bytes_sent`` (all sites, per round), ``dropped_sites``, ``time_to_train_s`` (``tokens``
    given), then ``site{i}_inner_step_s``, ``site{i}_memory_gib``, ``site{i}_fits_memory``,
    ``site{i}_auto`` (what ``auto`` chose for the site, ``"zero_stage 3, recompute full"``; empty
    when nothing was ``auto``) and ``site{i}_<each of SITE_COLUMNS>``.
    """
    r = {
        f.name: np.asarray(getattr(res.rounds, f.name), np.float64)
        for f in dataclasses.fields(Round)
    }
    dev = np.array(cs.per_site("devices"), np.float64)
    w = dev / dev.sum()
    inner = np.asarray(res.sites.step_s, np.float64)
    df = pd.DataFrame(
        {
            "mode": cs.mode,
            "local_steps": [s["local_steps"] for s in res.settings],
            "wan_bandwidth_bps": [
                np.nan if s["wan_bytes_per_s"] is None else 8.0 * s["wan_bytes_per_s"]
                for s in res.settings
            ],
            "inner_step_s": inner.max(axis=1),
            "round_s": r["round_s"],
            "sync_s": r["sync_s"],
            "churn_s": r["churn_s"],
            "payload_bytes": r["upload_bytes"],
            "compute_utilization_pct": r["overall_compute_utilization_pct"],
            "compute_share_of_busy_pct": r["overall_compute_share_of_busy_pct"],
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
    cols: dict[str, Any] = {}
    for i, e in enumerate(res.estimates):
        cols[f"site{i + 1}_inner_step_s"] = inner[:, i]
        cols[f"site{i + 1}_memory_gib"] = e.to_dict()["memory"]["total_bytes"] / 2.0**30
        cols[f"site{i + 1}_fits_memory"] = bool(e.breakdown.fits_memory)
        cols[f"site{i + 1}_auto"] = ", ".join(f"{k} {v}" for k, v in e.auto.items())
        for k in SITE_COLUMNS:
            cols[f"site{i + 1}_{k}"] = r[k][:, i]
    return pd.concat([df, pd.DataFrame(cols, index=df.index)], axis=1)
