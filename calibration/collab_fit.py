"""Fit the collaboration constants to a table of per-client shares (and total times).

Contract: :func:`load_collab_table` reads a table like the source document's
(``model_params``, ``total_task_time``, ``client{i}_compute_utilization_pct``,
``client{i}_communication_share_pct``, ``client{i}_serialization_share_pct``, optional
``client{i}_other_share_pct`` and ``rounds``; a row with no percentage is predicted, not fitted).
:func:`fit_collab` frees, over a :class:`perfmodel.collab.Scenario`,

* per site: the compute efficiency (calibration's ``compute_efficiency`` logit shift on the matmul
  and memory-bound maxima) and a fixed per-round overhead (s);
* shared by the WAN links: the bandwidth efficiency and the latency (``link_*.wan``);
* the serialisation throughput (one factor on every (de)serialisation rate) and the aggregation
  cost (the aggregator's roofline ``time_factor``),

with calibration's :class:`~calibration.parameterization.Parameterization` for the entries that
are perfmodel constants and the same constrained raw space (sigmoid for fractions, scaled
softplus for positive values) for the rest. The objective is the mean squared error of the given
percentages in percentage points, plus, for rows that give a total time *and* a number of rounds,
the squared log error of ``rounds · round_s`` (``TIME_WEIGHT`` pp² per unit), plus a weak prior
towards the starting values (it only decides what the data cannot: percentages alone fix ratios
of times, not their scale). It is minimised with ``optax.adam`` then ``optax.lbfgs`` in one
compiled program, as :mod:`calibration.fit` does, so the result is deterministic.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from calibration.fit import adam_then_lbfgs
from calibration.parameterization import Parameterization
from perfmodel import collab
from simbase.errors import AisimError, bad_value
from simbase.io import read_text
from simbase.units import parse_count

ADAM_STEPS = 1500
ADAM_LR = 0.05
LBFGS_STEPS = 150
PRIOR_WEIGHT = 1e-4  # pp² per raw unit squared
TIME_WEIGHT = 100.0  # pp² per (log error)²: a 10 % error in total time costs as much as 1 pp
SHARE_COLUMNS = (
    "compute_utilization_pct",
    "communication_share_pct",
    "serialization_share_pct",
    "other_share_pct",
)
_TIME_ALIASES = ("total_task_time", "total_task_time_s")
_SITE_FREE = ("compute_efficiency", "link_bandwidth_efficiency.wan", "link_latency_s.wan")
_EPS = 1e-6


@dataclasses.dataclass(frozen=True)
class CollabTable:
    """The rows of a collaboration table (``[rows]`` arrays; NaN where blank).

    Attributes:
      sizes: the ``model_params`` strings.
      shares: ``[rows, sites, 4]`` percentages in :data:`SHARE_COLUMNS` order.
      total_time_s, rounds: per row (NaN when blank).
      fitted: rows with at least one percentage.
      source_sha256: of the file's bytes.
    """

    sizes: list[str]
    shares: np.ndarray
    total_time_s: np.ndarray
    rounds: np.ndarray
    fitted: np.ndarray
    num_sites: int
    path: str
    source_sha256: str


def load_collab_table(path: str | Path, rounds: float | None = None) -> CollabTable:
    """Reads and validates a collaboration table; ``rounds`` fills a blank ``rounds`` column.

    Raises:
      AisimError: naming the file, the row and the field (a size like ``10Q``, a negative value);
        a non-positive ``rounds`` names the argument ``rounds`` (``source`` ``None``).
    """
    path = Path(path)
    text = read_text(path, "file")  # one error line for a missing, unreadable or special file
    raw = path.read_bytes()  # the hash is of the bytes, as written
    try:
        df = pd.read_csv(io.StringIO(text))
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise AisimError(f"{path}: not a readable CSV table ({e})") from None
    if "model_params" not in df.columns:
        raise AisimError(f"{path}: missing column 'model_params' (sizes like 10M)")
    sites = sorted(
        {int(m.group(1)) for c in df.columns if (m := re.fullmatch(r"client(\d+)_.*_pct", c))}
    )
    if not sites or sites != list(range(1, len(sites) + 1)):
        raise AisimError(
            f"{path}: expected columns client1_compute_utilization_pct, ... for clients 1..N"
        )
    n, p = len(df), len(sites)
    shares = np.full((n, p, len(SHARE_COLUMNS)), np.nan)
    sizes = []
    for r in range(n):
        where = f"{path}: row {r + 1}"
        size = str(df["model_params"].iloc[r]).strip()
        try:
            if parse_count(size) < 8:
                raise ValueError
        except ValueError:
            raise bad_value(
                where, "model_params", size, "a parameter count like 10M or 1.5B"
            ) from None
        sizes.append(size)
        for i in range(p):
            for j, col in enumerate(SHARE_COLUMNS):
                name = f"client{i + 1}_{col}"
                if name in df.columns:
                    shares[r, i, j] = _number(df[name].iloc[r], where, name, 0.0, 100.0)
    tcol = next((c for c in _TIME_ALIASES if c in df.columns), None)
    total = (
        np.array(
            [
                _number(v, f"{path}: row {r + 1}", tcol, 0.0, math.inf, strict=True)
                for r, v in enumerate(df[tcol])
            ]
        )
        if tcol
        else np.full(n, np.nan)
    )
    rcol = (
        np.array(
            [
                _number(v, f"{path}: row {r + 1}", "rounds", 0.0, math.inf, strict=True)
                for r, v in enumerate(df["rounds"])
            ]
        )
        if "rounds" in df.columns
        else np.full(n, np.nan)
    )
    if rounds is not None:
        if not rounds > 0:
            raise bad_value(None, "rounds", rounds, "a positive number of rounds")
        rcol = np.where(np.isfinite(rcol), rcol, float(rounds))
    fitted = np.isfinite(shares).any(axis=(1, 2))
    if not fitted.any():
        raise AisimError(f"{path}: no row gives a percentage: nothing to fit")
    return CollabTable(
        sizes=sizes,
        shares=shares,
        total_time_s=total,
        rounds=rcol,
        fitted=fitted,
        num_sites=p,
        path=str(path),
        source_sha256=hashlib.sha256(raw).hexdigest(),
    )


def _number(v, where, field, lo, hi, strict=False) -> float:
    if (
        v is None
        or (isinstance(v, float) and math.isnan(v))
        or (isinstance(v, str) and not v.strip())
    ):
        return math.nan
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise bad_value(where, field, v, "a number") from None
    if not math.isfinite(x) or x < lo or x > hi or (strict and x == lo):
        raise bad_value(where, field, v, f"a number in {'(' if strict else '['}{lo:g}, {hi:g}]")
    return x


# --------------------------------------------------------------------- parameterisation


def _softplus_inv(y):
    y = jnp.maximum(y, _EPS)
    return jnp.where(y < 30.0, y + jnp.log(-jnp.expm1(-jnp.minimum(y, 30.0))), y)


@dataclasses.dataclass(frozen=True)
class CollabParameterization:
    """Raw (unconstrained) scalars -> the scenario's sites and aggregator (differentiable).

    ``overhead_scale_s`` sets the softplus scale of the per-round overheads (a raw step of 1 is
    a change of that order); the serde and aggregation factors are 1 at the start.
    """

    sites: collab.Site
    agg: collab.Aggregator
    num_sites: int
    overhead_scale_s: float = 1.0

    def _site_param(self, i: int) -> Parameterization:
        base = jax.tree.map(lambda x: x[i], self.sites.consts)
        return Parameterization(base=base, free=_SITE_FREE)

    def init(self) -> dict[str, jax.Array]:
        """The starting raw values: the scenario's constants; overheads of ``overhead_scale_s``."""
        raw: dict[str, jax.Array] = {}
        for i in range(self.num_sites):
            r = self._site_param(i).init()
            raw[f"site{i + 1}.compute_efficiency"] = r["compute_efficiency"]
            ov = jnp.maximum(self.sites.overhead_s[i], self.overhead_scale_s)
            raw[f"site{i + 1}.overhead_s"] = _softplus_inv(ov / self.overhead_scale_s)
        r0 = self._site_param(0).init()
        raw["wan.bandwidth_efficiency"] = r0["link_bandwidth_efficiency.wan"]
        raw["wan.latency_s"] = r0["link_latency_s.wan"]
        raw["serde_factor"] = _softplus_inv(jnp.ones(()))
        raw["aggregation_factor"] = _softplus_inv(jnp.ones(()))
        return raw

    def build(self, raw: dict[str, jax.Array]) -> tuple[collab.Site, collab.Aggregator]:
        """Sites and aggregator with the free entries replaced by ``raw``'s values."""
        consts = []
        for i in range(self.num_sites):
            r = {
                "compute_efficiency": raw[f"site{i + 1}.compute_efficiency"],
                "link_bandwidth_efficiency.wan": raw["wan.bandwidth_efficiency"],
                "link_latency_s.wan": raw["wan.latency_s"],
            }
            consts.append(self._site_param(i).constants(r))
        one = jax.nn.softplus(_softplus_inv(jnp.ones(())))
        serde = jax.nn.softplus(raw["serde_factor"]) / one
        aggf = jax.nn.softplus(raw["aggregation_factor"]) / one
        overhead = jnp.stack(
            [
                self.overhead_scale_s * jax.nn.softplus(raw[f"site{i + 1}.overhead_s"])
                for i in range(self.num_sites)
            ]
        )
        sites = dataclasses.replace(
            self.sites,
            consts=collab.stack(consts),
            overhead_s=overhead,
            serialize_bytes_per_s=self.sites.serialize_bytes_per_s * serde,
            deserialize_bytes_per_s=self.sites.deserialize_bytes_per_s * serde,
        )
        agg = dataclasses.replace(
            self.agg,
            time_factor=self.agg.time_factor * aggf,
            serialize_bytes_per_s=self.agg.serialize_bytes_per_s * serde,
            deserialize_bytes_per_s=self.agg.deserialize_bytes_per_s * serde,
        )
        return sites, agg

    def physical(self, raw: dict[str, jax.Array]) -> dict[str, float]:
        """The fitted values in SI units (efficiencies as fractions), for reports and profiles."""
        sites, agg = self.build(raw)
        out: dict[str, float] = {}
        for i in range(self.num_sites):
            out[f"site{i + 1}.matmul_efficiency_max"] = float(sites.consts.matmul_efficiency_max[i])
            out[f"site{i + 1}.memory_efficiency_max"] = float(sites.consts.memory_efficiency_max[i])
            out[f"site{i + 1}.overhead_s"] = float(sites.overhead_s[i])
        out["wan.bandwidth_efficiency"] = float(
            sites.consts.link_bandwidth_efficiency[0, collab.WAN]
        )
        out["wan.effective_bandwidth_bytes_per_s"] = float(
            sites.up_bytes_per_s[0] * out["wan.bandwidth_efficiency"]
        )
        out["wan.latency_s"] = float(sites.consts.link_latency_s[0, collab.WAN])
        out["serialize_bytes_per_s"] = float(sites.serialize_bytes_per_s[0])
        out["deserialize_bytes_per_s"] = float(sites.deserialize_bytes_per_s[0])
        out["aggregation_time_factor"] = float(agg.time_factor)
        return out


# --------------------------------------------------------------------- objective and solver


def predicted(param: CollabParameterization, raw, models, setup) -> collab.RoundTimeline:
    """The timeline of every row under raw values (``[rows, sites]`` leaves)."""
    sites, agg = param.build(raw)
    return jax.vmap(collab.round_timeline, in_axes=(0, None, None, None))(models, sites, agg, setup)


def _shares(tl: collab.RoundTimeline) -> jax.Array:
    return jnp.stack(
        [
            tl.compute_share_pct,
            tl.communication_share_pct,
            tl.serialization_share_pct,
            tl.other_share_pct,
        ],
        axis=-1,
    )


def objective(
    raw,
    param: CollabParameterization,
    models,
    setup,
    target,
    mask,
    log_total,
    time_mask,
    log_rounds,
):
    """Mean squared percentage error (pp²) + ``TIME_WEIGHT`` · mean squared log time error + prior."""
    tl = predicted(param, raw, models, setup)
    err = jnp.where(mask, _shares(tl) - target, 0.0)
    data = jnp.sum(err**2) / jnp.maximum(jnp.sum(mask), 1.0)
    r = jnp.where(time_mask, jnp.log(tl.round_s) + log_rounds - log_total, 0.0)
    times = TIME_WEIGHT * jnp.sum(r**2) / jnp.maximum(jnp.sum(time_mask), 1.0)
    centre = param.init()
    prior = sum((raw[k] - centre[k]) ** 2 for k in raw)
    return data + times + PRIOR_WEIGHT * prior


@functools.partial(jax.jit, static_argnames=("num_sites", "setup_static"))
def _solve(
    sites,
    agg,
    num_sites,
    setup_static,
    setup_leaves,
    models,
    target,
    mask,
    log_total,
    time_mask,
    log_rounds,
):
    setup = collab.Setup(*setup_leaves, *setup_static)
    param = CollabParameterization(sites=sites, agg=agg, num_sites=num_sites)

    def f(raw):
        return objective(raw, param, models, setup, target, mask, log_total, time_mask, log_rounds)

    return adam_then_lbfgs(
        f, param.init(), adam_steps=ADAM_STEPS, lbfgs_steps=LBFGS_STEPS, lr=ADAM_LR
    )


@dataclasses.dataclass(frozen=True)
class CollabFit:
    """A fit: the fitted values, the error and the table of fitted against given values.

    Attributes:
      values: :meth:`CollabParameterization.physical` of the optimum.
      rms_error_pp: RMS error of the given percentages, in percentage points.
      table: one row per (size, client, quantity): ``given``, ``aisim``, ``error_pp``
        (rows that gave nothing are predictions, ``given`` NaN).
      rows: one row per size: predicted round time, given total time and rounds, the rounds a
        total time implies, and the predicted shares (:func:`perfmodel.collab.timeline_frame`).
      sites, agg: the fitted scenario parts (for :func:`perfmodel.collab.sweep`).
      loss: the objective at the optimum.
    """

    values: dict[str, float]
    rms_error_pp: float
    table: pd.DataFrame
    rows: pd.DataFrame
    sites: collab.Site
    agg: collab.Aggregator
    loss: float
    num_fitted_values: int


def fit_collab(table: CollabTable, scenario: collab.Scenario) -> CollabFit:
    """Fits the collaboration constants of ``scenario`` to ``table`` (see the module docstring).

    Raises:
      AisimError: the scenario's number of clients differs from the table's (``field``
        ``clients``, ``value`` the scenario's count; the hint names the table's).
    """
    if scenario.num_sites != table.num_sites:
        raise AisimError(
            f"{table.path}: the table has {table.num_sites} clients but the scenario has "
            f"{scenario.num_sites}",
            field="clients",
            value=scenario.num_sites,
            expected=f"{table.num_sites} clients, as in the table",
            hint=f"pass {{clients}} {table.num_sites}",
        )
    sites, agg, setup = collab.scenario_parts(scenario)
    models = collab.size_models(table.sizes)
    idx = np.flatnonzero(table.fitted)
    fit_models = jax.tree.map(lambda x: x[idx], models)
    target = np.nan_to_num(table.shares[idx]).astype(np.float32)
    mask = np.isfinite(table.shares[idx])
    tmask = np.isfinite(table.total_time_s[idx]) & np.isfinite(table.rounds[idx])
    log_total = np.log(np.where(tmask, table.total_time_s[idx], 1.0)).astype(np.float32)
    log_rounds = np.log(np.where(tmask, table.rounds[idx], 1.0)).astype(np.float32)
    static = (setup.mode, setup.topology, setup.compression)
    raw, loss = _solve(
        sites,
        agg,
        scenario.num_sites,
        static,
        (setup.topk_fraction, setup.num_microbatches),
        fit_models,
        jnp.asarray(target),
        jnp.asarray(mask),
        jnp.asarray(log_total),
        jnp.asarray(tmask),
        jnp.asarray(log_rounds),
    )
    param = CollabParameterization(sites=sites, agg=agg, num_sites=scenario.num_sites)
    fsites, fagg = param.build(raw)
    tl = collab.sweep(models, fsites, fagg, setup)
    pred = np.asarray(_shares(tl), np.float64)
    given_mask = np.isfinite(table.shares)
    err = (pred - table.shares)[given_mask]
    rms = float(np.sqrt(np.mean(err**2)))
    recs = []
    for r, size in enumerate(table.sizes):
        for i in range(table.num_sites):
            for j, col in enumerate(SHARE_COLUMNS):
                g = table.shares[r, i, j]
                if not table.fitted[r] or np.isfinite(g) or j < 3:
                    recs.append(
                        {
                            "model_params": size,
                            "column": f"client{i + 1}_{col}",
                            "given": g,
                            "aisim": pred[r, i, j],
                            "error_pp": pred[r, i, j] - g,
                        }
                    )
    rows = collab.timeline_frame(
        table.sizes, tl, np.where(np.isfinite(table.rounds), table.rounds, 1.0)
    )
    rows.insert(3, "given_total_task_time_s", table.total_time_s)
    rows.insert(4, "given_rounds", table.rounds)
    rows.insert(5, "implied_rounds", table.total_time_s / rows["round_time_s"].to_numpy())
    rows.insert(6, "fitted", table.fitted)
    return CollabFit(
        values=param.physical(raw),
        rms_error_pp=rms,
        table=pd.DataFrame(recs),
        rows=rows,
        sites=fsites,
        agg=fagg,
        loss=float(loss),
        num_fitted_values=int(given_mask.sum()),
    )


# ------------------------------------------------------------ published cross-site runs
# (real models, each site a cluster: `calibration/data/crosssite_runs.csv`)

CROSSSITE_RUNS = "crosssite_runs.csv"
_RUN_TEXT = ("run", "role", "source", "model", "hardware", "recompute", "mode")
_RUN_TEXT += ("compression", "topology")
_RUN_INTS = ("num_layers", "seq_len", "sites", "gpus_per_site", "batch_size", "micro_batch_size")
_RUN_INTS += ("zero", "fused_attention", "local_steps", "overlap")
_RUN_FLOATS = ("wan_up_gbps", "wan_down_gbps", "published_compute_utilization_pct")
_RUN_OPTIONAL = ("vocab_size", "topk_fraction", "server_gbps", "published_sync_s")
_RUN_OPTIONAL += (
    "published_round_compute_s",
    "published_mfu_pct",
    "wan_rtt_ms",
    "tcp_window_bytes",
)
# columns a table may leave out (blank or absent: not used)
_RUN_EXTRA = (
    "window_s",
    "published_inner_step_s",
    "recompute_modules",
    "logit_bytes",
    "fsdp_fp32_params",
)


def crosssite_runs_path() -> Path:
    """The shipped table of published cross-site runs (see ``crosssite_SOURCES.md``)."""
    return Path(__file__).resolve().parent / "data" / CROSSSITE_RUNS


def load_crosssite_runs(path: str | Path | None = None) -> pd.DataFrame:
    """Reads and validates a table of published cross-site runs (one row per run).

    Columns: ``run``, ``role`` (``fit`` or ``heldout``), the model (a preset, ``num_layers``,
    optional ``vocab_size``, ``seq_len``), the sites (``hardware``, ``sites``,
    ``gpus_per_site``, ``batch_size`` sequences per site per inner step, ``micro_batch_size``,
    ``zero``, ``recompute``, ``fused_attention``), the round (``mode``, ``local_steps``,
    ``compression``, optional ``topk_fraction``, ``topology``, ``overlap``), the links
    (``wan_up_gbps``, ``wan_down_gbps``, optional ``server_gbps``, ``wan_rtt_ms`` the round trip
    of the ring's longest hop (blank: the preset's latency) and ``tcp_window_bytes`` the bytes a
    link keeps in flight (blank: no cap)) and the published values
    (``published_compute_utilization_pct``; optional ``published_sync_s``,
    ``published_round_compute_s``, ``published_mfu_pct``). Optional columns: ``window_s`` the
    round's fixed length when the protocol sets it, ``published_inner_step_s`` a published
    per-step time that replaces the step model's (only where a source gives one),
    ``recompute_modules``, ``logit_bytes`` and ``fsdp_fp32_params`` (0 or 1)
    (:func:`perfmodel.estimate`'s knobs of those names).

    Raises:
      AisimError: a missing column, a bad value (naming the file, ``row N: column`` and the
        value), or not exactly one ``fit`` row.
    """
    path = crosssite_runs_path() if path is None else Path(path)
    df = pd.read_csv(io.StringIO(read_text(path, what="cross-site runs table")))
    where = str(path)
    for col in _RUN_TEXT + _RUN_INTS + _RUN_FLOATS + _RUN_OPTIONAL:
        if col not in df.columns:
            raise AisimError(source=where, field=col, expected="a column of the cross-site table")
    for i, r in df.iterrows():
        for col in _RUN_INTS:
            v = r[col]
            if not (isinstance(v, int | np.integer | float) and math.isfinite(v) and v >= 0):
                raise bad_value(where, f"row {i + 1}: {col}", v, "a non-negative integer")
        for col in _RUN_FLOATS:
            if not (math.isfinite(float(r[col])) and float(r[col]) > 0):
                raise bad_value(where, f"row {i + 1}: {col}", r[col], "a positive number")
        for col in ("wan_rtt_ms", "tcp_window_bytes") + _present(df, _RUN_EXTRA[:2]):
            v = float(r[col])
            if not (math.isnan(v) or (math.isfinite(v) and v > 0)):
                raise bad_value(where, f"row {i + 1}: {col}", r[col], "a positive number or blank")
        if "fsdp_fp32_params" in df.columns and _extra(r, "fsdp_fp32_params") not in (None, 0, 1):
            raise bad_value(
                where, f"row {i + 1}: fsdp_fp32_params", r["fsdp_fp32_params"], "0, 1 or blank"
            )
        if r["role"] not in ("fit", "heldout"):
            raise bad_value(where, f"row {i + 1}: role", r["role"], "fit or heldout")
    if int((df["role"] == "fit").sum()) != 1:
        raise bad_value(where, "role", int((df["role"] == "fit").sum()), "exactly one fit row")
    return df


def _present(df, cols) -> tuple:
    return tuple(c for c in cols if c in df.columns)


def _extra(row, col):
    """An optional column's value, or ``None`` when the column is absent or the cell blank."""
    v = row.get(col) if hasattr(row, "get") else None
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


def crosssite_of_run(row, wan_efficiency: float | None = None):
    """The :class:`perfmodel.collab.CrossSite` of one published run (``wan_efficiency`` None:
    the hardware preset's WAN efficiency, the uncalibrated prediction)."""
    from perfmodel import load_hardware, resolve_model

    dims = dict(num_layers=int(row["num_layers"]), seq_len=int(row["seq_len"]))
    if not pd.isna(row["vocab_size"]):
        dims["vocab_size"] = int(row["vocab_size"])
    m = resolve_model(row["model"], **dims)
    hw = load_hardware(row["hardware"])
    eff = float(hw.constants.link_bandwidth_efficiency[collab.WAN])
    gbps = 1e9 / 8.0
    lat = float(hw.constants.link_latency_s[collab.WAN])
    if not pd.isna(row["wan_rtt_ms"]):
        lat = 0.5 * float(row["wan_rtt_ms"]) * 1e-3
    window = math.inf if pd.isna(row["tcp_window_bytes"]) else float(row["tcp_window_bytes"])
    knobs = {}
    if _extra(row, "recompute_modules") is not None:
        knobs["recompute_modules"] = str(row["recompute_modules"])
    if _extra(row, "logit_bytes") is not None:
        knobs["logit_bytes"] = float(row["logit_bytes"])
    if _extra(row, "fsdp_fp32_params") is not None:
        knobs["fsdp_fp32_params"] = bool(int(row["fsdp_fp32_params"]))
    step = _extra(row, "published_inner_step_s")
    return collab.CrossSite(
        model=m,
        hardware=(hw,) * int(row["sites"]),
        devices=(int(row["gpus_per_site"]),),
        batch_size=(int(row["batch_size"]),),
        knobs=dict(
            tp=1,
            pp=1,
            zero_stage=int(row["zero"]),
            recompute=row["recompute"],
            micro_batch_size=int(row["micro_batch_size"]),
            fused_attention=bool(row["fused_attention"]),
            dtype="bf16",
            **knobs,
        ),
        up_bytes_per_s=(float(row["wan_up_gbps"]) * gbps,),
        down_bytes_per_s=(float(row["wan_down_gbps"]) * gbps,),
        latency_s=(lat,),
        mode=row["mode"],
        topology=row["topology"],
        compression=row["compression"],
        overlap=bool(row["overlap"]),
        wan_efficiency=eff if wan_efficiency is None else float(wan_efficiency),
        topk_fraction=0.01 if pd.isna(row["topk_fraction"]) else float(row["topk_fraction"]),
        server_bytes_per_s=None if pd.isna(row["server_gbps"]) else row["server_gbps"] * gbps,
        tcp_window_bytes=window,
        window_s=float(_extra(row, "window_s") or 0.0),
        inner_step_s=None if step is None else (float(step),),
    )


_jit_round = jax.jit(collab.cross_site_round)


class _RunModel:
    """One published run, its inner steps timed once: the round at any WAN efficiency."""

    def __init__(self, row):
        self.row = row
        self.cs = crosssite_of_run(row)
        self.h = int(row["local_steps"])
        self.res = collab.evaluate(self.cs, (self.h,))
        self.sites = collab.site_rates(self.cs, self.res.estimates)
        params = float(self.res.estimates[0].to_dict()["params"])
        own = list(np.asarray(self.sites.up_bytes_per_s))
        own += list(np.asarray(self.sites.down_bytes_per_s))
        self.base = collab.make_round(self.cs, params, self.h, own)

    @property
    def preset_efficiency(self) -> float:
        return float(self.cs.wan_efficiency)

    def round(self, eff: float):
        r = dataclasses.replace(self.base, wan_efficiency=jnp.asarray(eff, jnp.float32))
        return _jit_round(self.sites, r)

    def predict(self, eff: float | None) -> dict[str, float]:
        r = self.round(self.preset_efficiency if eff is None else eff)
        inner = collab.inner_step_times(self.cs, self.res.estimates)[0]
        return {
            "inner_step_s": inner,
            "round_compute_s": float(r.compute_s[0]),
            "sync_s": float(r.sync_s),
            "compute_utilization_pct": float(r.compute_utilization_pct),
            "mfu_pct": 100.0 * float(self.sites.mfu[0]),
        }


def fit_wan_efficiency(row, lo: float = 1e-3, hi: float = 1e3, iters: int = 60) -> float:
    """The one WAN efficiency at which the round model reproduces a run's published compute
    utilisation: utilisation rises monotonically with the efficiency, so bisection on its
    logarithm finds it (one scalar: no optimiser needed). The inner steps are timed once.

    Raises:
      AisimError: no efficiency in ``[lo, hi]`` reaches the published utilisation.
    """
    return _fit(_RunModel(row), lo, hi, iters)


def _fit(run: _RunModel, lo: float, hi: float, iters: int) -> float:
    target = float(run.row["published_compute_utilization_pct"])

    def util(eff: float) -> float:
        return float(run.round(eff).compute_utilization_pct)

    if not util(lo) <= target <= util(hi):
        raise bad_value(
            str(run.row["run"]),
            "published_compute_utilization_pct",
            target,
            f"a utilisation the model reaches with a WAN efficiency in [{lo:g}, {hi:g}]",
        )
    a, b = math.log(lo), math.log(hi)
    for _ in range(iters):
        mid = 0.5 * (a + b)
        a, b = (mid, b) if util(math.exp(mid)) < target else (a, mid)
    return math.exp(0.5 * (a + b))


@dataclasses.dataclass(frozen=True)
class CrossSiteValidation:
    """Published cross-site runs against the model: uncalibrated, and after fitting one WAN
    efficiency on the ``fit`` run (``table`` one row per run; errors in percentage points)."""

    table: pd.DataFrame
    fitted_wan_efficiency: float
    heldout_mean_abs_error_pp: float
    heldout_max_abs_error_pp: float


def validate_crosssite(path: str | Path | None = None) -> CrossSiteValidation:
    """Predicts every run of the table uncalibrated (the preset's WAN efficiency), fits the WAN
    efficiency on the ``fit`` run (:func:`fit_wan_efficiency`) and predicts every run again.

    Columns of ``table``: ``run``, ``role``, ``published_pct``, ``uncalibrated_pct``,
    ``fitted_pct``, ``uncalibrated_error_pp``, ``fitted_error_pp`` (prediction − published),
    ``published_sync_s``, ``uncalibrated_sync_s``, ``fitted_sync_s``, ``published_round_compute_s``,
    ``predicted_round_compute_s`` (the inner steps done per round, fitted), ``published_mfu_pct``,
    ``predicted_mfu_pct`` (no sync).
    """
    runs = load_crosssite_runs(path)
    models = [_RunModel(row) for _, row in runs.iterrows()]
    eff = _fit(next(m for m in models if m.row["role"] == "fit"), 1e-3, 1e3, 60)
    recs = []
    for m in models:
        row = m.row
        u = m.predict(None)
        f = m.predict(eff)
        pub = float(row["published_compute_utilization_pct"])
        recs.append(
            {
                "run": row["run"],
                "role": row["role"],
                "published_pct": pub,
                "uncalibrated_pct": u["compute_utilization_pct"],
                "fitted_pct": f["compute_utilization_pct"],
                "uncalibrated_error_pp": u["compute_utilization_pct"] - pub,
                "fitted_error_pp": f["compute_utilization_pct"] - pub,
                "published_sync_s": row["published_sync_s"],
                "uncalibrated_sync_s": u["sync_s"],
                "fitted_sync_s": f["sync_s"],
                "published_round_compute_s": row["published_round_compute_s"],
                "predicted_round_compute_s": f["round_compute_s"],
                "published_mfu_pct": row["published_mfu_pct"],
                "predicted_mfu_pct": u["mfu_pct"],
            }
        )
    table = pd.DataFrame(recs)
    held = table[table["role"] == "heldout"]["fitted_error_pp"].abs()
    return CrossSiteValidation(
        table=table,
        fitted_wan_efficiency=eff,
        heldout_mean_abs_error_pp=float(held.mean()),
        heldout_max_abs_error_pp=float(held.max()),
    )
