"""Fit the collaboration constants to a table of per-client shares (and total times).

Contract: :func:`load_collab_table` reads a table like the source document's
(``model_params``, ``total_task_time``, ``client{i}_compute_utilization_pct``,
``client{i}_communication_share_pct``, ``client{i}_serialization_share_pct``, optional
``client{i}_other_share_pct`` and ``rounds``; a row with no percentage is predicted, not fitted).
:func:`fit_collab` frees, over a :class:`Scenario`,

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
from calibration.profile import PROFILE_SCHEMA
from collab.profile import COLLAB_KIND
from collab.round_model import Round, stack
from collab.scenario import Scenario, scenario_parts, size_models, timeline_frame
from collab.scenario_model import WAN, Aggregator, Setup, Site, round_timeline, source_shares, sweep
from collab.settings import scenario_from_text
from simbase import version
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

    sites: Site
    agg: Aggregator
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

    def build(self, raw: dict[str, jax.Array]) -> tuple[Site, Aggregator]:
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
            consts=stack(consts),
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
        out["wan.bandwidth_efficiency"] = float(sites.consts.link_bandwidth_efficiency[0, WAN])
        out["wan.effective_bandwidth_bytes_per_s"] = float(
            sites.up_bytes_per_s[0] * out["wan.bandwidth_efficiency"]
        )
        out["wan.latency_s"] = float(sites.consts.link_latency_s[0, WAN])
        out["serialize_bytes_per_s"] = float(sites.serialize_bytes_per_s[0])
        out["deserialize_bytes_per_s"] = float(sites.deserialize_bytes_per_s[0])
        out["aggregation_time_factor"] = float(agg.time_factor)
        return out


# --------------------------------------------------------------------- objective and solver


def predicted(param: CollabParameterization, raw, models, setup) -> Round:
    """The timeline of every row under raw values (``[rows, sites]`` leaves)."""
    sites, agg = param.build(raw)
    return jax.vmap(round_timeline, in_axes=(0, None, None, None))(models, sites, agg, setup)


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
    err = jnp.where(mask, source_shares(tl) - target, 0.0)
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
    setup = Setup(*setup_leaves, *setup_static)
    param = CollabParameterization(sites=sites, agg=agg, num_sites=num_sites)

    @jax.jit  # traced once, not once per call in the optimizer's loops (4 s -> 1.5 s)
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
        total time implies, and the predicted shares (:func:`collab.timeline_frame`).
      sites, agg: the fitted scenario parts (for :func:`collab.sweep`).
      loss: the objective at the optimum.
    """

    values: dict[str, float]
    rms_error_pp: float
    table: pd.DataFrame
    rows: pd.DataFrame
    sites: Site
    agg: Aggregator
    loss: float
    num_fitted_values: int

    def document(self) -> dict:
        """The ``--json`` document: the RMS error, the fitted values and both tables."""
        return {
            "rms_error_pp": self.rms_error_pp,
            "fitted_percentages": self.num_fitted_values,
            "values": self.values,
            "table": self.table.to_dict(orient="records"),
            "rows": self.rows.to_dict(orient="records"),
        }


def fit_collab(table: CollabTable, scenario: Scenario) -> CollabFit:
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
    sites, agg, setup = scenario_parts(scenario)
    models = size_models(table.sizes)
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
    tl = sweep(models, fsites, fagg, setup)
    pred = np.asarray(source_shares(tl), np.float64)
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
    rows = timeline_frame(table.sizes, tl, np.where(np.isfinite(table.rounds), table.rounds, 1.0))
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


def fit_profile(fit: CollabFit, table: CollabTable, scenario: Scenario) -> dict:
    """The ``aisim.profile/1`` document of a fit (its ``collab.fit`` block, which
    :func:`collab.profile.apply_profile` reads)."""
    return {
        "schema": PROFILE_SCHEMA,
        "kind": COLLAB_KIND,
        "created_by": f"aisim {version()}",
        "collab": {
            "fit": {
                "values": fit.values,
                "rms_error_pp": fit.rms_error_pp,
                "fitted_percentages": fit.num_fitted_values,
                "rows": int(table.fitted.sum()),
                "data": Path(table.path).name,
                "data_sha256": table.source_sha256,
                "scenario": {
                    "hardware": [h.name for h in scenario.hardware],
                    "aggregator": scenario.aggregator.name,
                    "mode": scenario.mode,
                    "topology": scenario.topology,
                },
            }
        },
    }


def fit_from_text(
    path: str | Path, *, rounds: float | None = None, clients: int | None = None, **settings
) -> tuple[CollabFit, dict]:
    """``aisim collab fit``: the table at ``path`` (:func:`load_collab_table`) fitted over the
    scenario of textual settings (:func:`collab.scenario_from_text`; ``clients`` default: the
    table's); returns the fit and its profile document (:func:`fit_profile`)."""
    table = load_collab_table(path, rounds)
    given = {k: v for k, v in settings.items() if v is not None}
    sc = scenario_from_text(clients=table.num_sites if clients is None else clients, **given)
    result = fit_collab(table, sc)
    return result, fit_profile(result, table, sc)
