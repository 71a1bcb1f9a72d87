"""Cross-site collaboration scenarios: validated Python values -> the model's pytrees and tables.

Contract: a :class:`Scenario` describes a collaboration with Python values (presets, per-site
tuples, rates in bytes per second); :func:`scenario_parts` turns it into the stacked
:class:`~collab.scenario_model.Site`, the :class:`~collab.scenario_model.Aggregator` and the
:class:`~collab.scenario_model.Setup` of :mod:`collab.scenario_model`, and :func:`sweep_frame`
evaluates it over model sizes into one table row per size. This is the boundary: every builder
validates its values and raises :class:`~simbase.errors.AisimError` naming the site (``client2``)
or, for the arguments of a call, ``source=None`` and the argument's name.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
import pandas as pd

from collab.round_model import Round, stack
from collab.scenario_model import (
    COMPRESSIONS,
    MODES,
    TOPOLOGIES,
    WAN,
    Aggregator,
    Setup,
    Site,
    source_shares,
    sweep,
)
from perfmodel import Constants, Dtype, ModelSpec, mlp_from_params
from simbase.errors import bad_value
from simbase.units import format_count

# the source table's share columns per client, in SHARE_TERMS order
SHARE_COLUMNS = (
    "compute_utilization_pct",
    "communication_share_pct",
    "serialization_share_pct",
    "other_share_pct",
)

# ------------------------------------------------------------------ builders (the boundary)

# (serialise, deserialise) throughput of 10M+100M-parameter fp32 weights by format, bytes per
# second: total bytes over total median time of `aisim collab measure-serde --params 10M,100M` on
# the project's 2-core CPU machine (docs/guides/collab.md); a measure-serde profile of your own
# machine (`--profile`) replaces them
SERDE_DEFAULT_BYTES_PER_S = {
    "numpy": (1.56e9, 4.21e8),
    "msgpack": (4.70e8, 1.31e9),
    "protobuf": (7.80e8, 6.15e8),
    "pickle": (1.71e9, 1.55e9),
}


def _positive(where: str | None, field: str, value, unit: str) -> float:
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
    """A :class:`Site` from a :class:`perfmodel.specs.hardware.Hardware` preset and Python values.

    The WAN line rates default to the preset's ``wan`` tier, the latency to its ``wan`` latency.

    Raises:
      AisimError: a non-positive count, rate or throughput, naming ``where`` and the field.
    """
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

    hardware: tuple  # perfmodel.specs.hardware.Hardware per site
    aggregator: object  # perfmodel.specs.hardware.Hardware of the parameter server
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
    """The standard square MLPs (:func:`perfmodel.specs.model.mlp_from_params`) of ``sizes``, stacked."""
    return stack([mlp_from_params(s).spec for s in sizes])


def timeline_frame(sizes, tl: Round, rounds=1.0):
    """One row per model size: the source table's columns, the other share and each phase.

    Columns: ``model_params`` (the size as given), ``params`` (exact count), ``rounds``,
    ``round_time_s``, ``total_task_time_s = rounds · round_time_s``, then per client ``i``
    the source's shares ``client{i}_compute_utilization_pct`` (compute / wall time),
    ``..._communication_share_pct`` (with the waiting), ``..._serialization_share_pct`` and
    ``..._other_share_pct``, the other definition of utilisation
    ``client{i}_compute_share_of_busy_pct`` (compute / the time not spent waiting), and the
    seconds of each phase (``client{i}_wait_s`` the waiting, ``client{i}_aggregate_s`` the
    aggregation).
    """
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
    shares = np.asarray(source_shares(tl), np.float64)
    busy = np.asarray(tl.compute_share_of_busy_pct, np.float64)
    phases = {
        "compute_s": tl.compute_s,
        "serialize_s": tl.serialize_s,
        "upload_s": tl.upload_s,
        "wait_s": tl.idle_s,
        "aggregate_s": tl.other_s,
        "download_s": tl.download_s,
        "deserialize_s": tl.deserialize_s,
    }
    for i in range(shares.shape[1]):
        for j, k in enumerate(SHARE_COLUMNS):
            df[f"client{i + 1}_{k}"] = shares[:, i, j]
        df[f"client{i + 1}_compute_share_of_busy_pct"] = busy[:, i]
    for i in range(shares.shape[1]):
        for k, v in phases.items():
            df[f"client{i + 1}_{k}"] = np.asarray(v, np.float64)[:, i]
    return df


def sweep_frame(sc: Scenario, sizes, rounds=1.0):
    """:func:`timeline_frame` of a scenario over model sizes (``"10M"`` strings or counts)."""
    sites, agg, setup = scenario_parts(sc)
    return timeline_frame(list(sizes), sweep(size_models(sizes), sites, agg, setup), rounds)
