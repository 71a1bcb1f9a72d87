"""Published cross-site runs of real models, against the round model (``aisim collab validate``).

Contract: :func:`load_crosssite_runs` reads and validates a table of published runs
(``collab/data/crosssite_runs.csv``, every number cited in ``crosssite_SOURCES.md``);
:func:`crosssite_of_run` turns one row into a :class:`collab.CrossSite`; :func:`validate_crosssite`
predicts every run uncalibrated (the hardware preset's WAN efficiency), fits one WAN efficiency on
the run marked ``fit`` (:func:`fit_wan_efficiency`, a bisection) and predicts every run again.
Each run is compared under the definition of utilisation its source uses (the row's
``utilization_definition``): ``compute_utilization`` (compute / wall time) or
``compute_share_of_busy`` (compute / (compute + communication), the time not idle; INTELLECT-1's
"Compute Util" and Covenant-72B's 94.5 %). A bad table raises one
:class:`~simbase.errors.AisimError` naming the file, the row and the column.
"""

from __future__ import annotations

import dataclasses
import io
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from collab.cross_site import CrossSite, evaluate, inner_step_times, make_exchange
from collab.round_model import collab_round
from collab.scenario_model import WAN
from perfmodel import KNOBS, load_hardware, resolve_model
from simbase.errors import AisimError, bad_value
from simbase.io import read_text

# the two definitions of compute utilisation, by the Round field that holds each
DEFINITIONS = {
    "compute_utilization": "overall_compute_utilization_pct",
    "compute_share_of_busy": "overall_compute_share_of_busy_pct",
}


CROSSSITE_RUNS = "crosssite_runs.csv"
_RUN_TEXT = ("run", "role", "source", "model", "hardware", "recompute", "mode")
_RUN_TEXT += ("compression", "topology", "utilization_definition")
_RUN_INTS = ("num_layers", "seq_len", "sites", "gpus_per_site", "batch_size", "micro_batch_size")
_RUN_INTS += ("zero", "local_steps", "overlap")
_RUN_FLOATS = ("wan_up_gbps", "wan_down_gbps", "published_compute_utilization_pct")
_RUN_OPTIONAL = ("vocab_size", "topk_fraction", "server_gbps", "published_sync_s")
_RUN_OPTIONAL += (
    "published_round_compute_s",
    "published_mfu_pct",
    "wan_rtt_ms",
    "tcp_window_bytes",
)
# columns a table may leave out (blank or absent: not used); besides these, a column named
# after a software-stack knob (perfmodel's registry, by name or alias) sets that knob for its
# rows, read and checked by the registry
_RUN_EXTRA = ("window_s", "published_inner_step_s")
STACK_COLUMNS = {n: k for k in KNOBS if k.home == "stack" for n in (k.name, *k.aliases)}


def crosssite_runs_path() -> Path:
    """The shipped table of published cross-site runs (see ``crosssite_SOURCES.md``)."""
    return Path(__file__).resolve().parent / "data" / CROSSSITE_RUNS


def load_crosssite_runs(path: str | Path | None = None) -> pd.DataFrame:
    """Reads and validates a table of published cross-site runs (one row per run).

    Columns: ``run``, ``role`` (``fit`` or ``heldout``), the model (a preset, ``num_layers``,
    optional ``vocab_size``, ``seq_len``), the sites (``hardware``, ``sites``,
    ``gpus_per_site``, ``batch_size`` sequences per site per inner step, ``micro_batch_size``,
    ``zero``, ``recompute``), the round (``mode``, ``local_steps``,
    ``compression``, optional ``topk_fraction``, ``topology``, ``overlap``), the links
    (``wan_up_gbps``, ``wan_down_gbps``, optional ``server_gbps``, ``wan_rtt_ms`` the round trip
    of the ring's longest hop (blank: the preset's latency) and ``tcp_window_bytes`` the bytes a
    link keeps in flight (blank: no cap)) and the published values
    (``published_compute_utilization_pct`` under the definition ``utilization_definition`` names,
    ``compute_utilization`` or ``compute_share_of_busy``; optional ``published_sync_s``,
    ``published_round_compute_s``, ``published_mfu_pct``). Optional columns: ``window_s`` the
    round's fixed length when the protocol sets it, ``published_inner_step_s`` a published
    per-step time that replaces the step model's (only where a source gives one), and any
    software-stack knob of :func:`perfmodel.estimate` by its name (``fused_attention``,
    ``logit_bytes``, ...): a blank cell leaves the knob at its default.

    Raises:
      AisimError: a missing column, a bad value (naming the file, ``row N: column`` and the
        value), or not exactly one ``fit`` row.
    """
    path = crosssite_runs_path() if path is None else Path(path)
    where = str(path)
    try:
        df = pd.read_csv(io.StringIO(read_text(path, what="cross-site runs table")))
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise AisimError(f"{path}: not a readable CSV table ({e})") from None
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
        _stack_knobs(r, f"{where}: row {i + 1}")
        if r["utilization_definition"] not in DEFINITIONS:
            raise bad_value(
                where, f"row {i + 1}: utilization_definition", r["utilization_definition"],
                "one of " + ", ".join(DEFINITIONS),
            )  # fmt: skip
        if r["role"] not in ("fit", "heldout"):
            raise bad_value(where, f"row {i + 1}: role", r["role"], "fit or heldout")
    if int((df["role"] == "fit").sum()) != 1:
        raise bad_value(where, "role", int((df["role"] == "fit").sum()), "exactly one fit row")
    return df


def _present(df, cols) -> tuple:
    return tuple(c for c in cols if c in df.columns)


def _stack_knobs(row, where: str) -> dict:
    """The software-stack knobs a row's optional columns set (a column by a stack knob's name
    or alias, its cell not blank), each checked by the registry."""
    out = {}
    for col in row.index:
        knob = STACK_COLUMNS.get(str(col))
        if knob is None or _extra(row, col) is None:
            continue
        value = row[col]
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # a whole number in a column that has blanks reads as a float
        knob.parse(value, where)  # checked here, parsed where the strategy is built
        out[knob.name] = value
    return out


def _extra(row, col):
    """An optional column's value, or ``None`` when the column is absent or the cell blank."""
    v = row.get(col) if hasattr(row, "get") else None
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


def crosssite_of_run(row, wan_efficiency: float | None = None):
    """The :class:`collab.CrossSite` of one published run (``wan_efficiency`` None:
    the hardware preset's WAN efficiency, the uncalibrated prediction)."""
    dims = dict(num_layers=int(row["num_layers"]), seq_len=int(row["seq_len"]))
    if not pd.isna(row["vocab_size"]):
        dims["vocab_size"] = int(row["vocab_size"])
    m = resolve_model(row["model"], **dims)
    hw = load_hardware(row["hardware"])
    eff = float(hw.constants.link_bandwidth_efficiency[WAN])
    gbps = 1e9 / 8.0
    lat = float(hw.constants.link_latency_s[WAN])
    if not pd.isna(row["wan_rtt_ms"]):
        lat = 0.5 * float(row["wan_rtt_ms"]) * 1e-3
    window = math.inf if pd.isna(row["tcp_window_bytes"]) else float(row["tcp_window_bytes"])
    knobs = _stack_knobs(row, f"cross-site run {row.get('run', row.name)}")
    step = _extra(row, "published_inner_step_s")
    return CrossSite(
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


_jit_round = jax.jit(collab_round)


class _RunModel:
    """One published run, its inner steps timed once: the round at any WAN efficiency."""

    def __init__(self, row):
        self.row = row
        self.cs = crosssite_of_run(row)
        self.h = int(row["local_steps"])
        self.res = evaluate(self.cs, (self.h,))
        self.sites = jax.tree.map(lambda x: x[0], self.res.sites)
        params = float(self.res.estimates[0].to_dict()["params"])
        own = [*np.asarray(self.sites.up_bytes_per_s), *np.asarray(self.sites.down_bytes_per_s)]
        self.base = make_exchange(self.cs, params, own)
        self.metric = DEFINITIONS[str(row["utilization_definition"])]

    @property
    def preset_efficiency(self) -> float:
        return float(self.cs.wan_efficiency)

    def round(self, eff: float):
        x = dataclasses.replace(self.base, wan_efficiency=jnp.asarray(eff, jnp.float32))
        return _jit_round(self.sites, x)

    def utilization(self, eff: float) -> float:
        """The utilisation at WAN efficiency ``eff``, under the run's source's definition."""
        return float(getattr(self.round(eff), self.metric))

    def predict(self, eff: float | None) -> dict[str, float]:
        r = self.round(self.preset_efficiency if eff is None else eff)
        inner = inner_step_times(self.cs, self.res.estimates)[0]
        return {
            "inner_step_s": inner,
            "round_compute_s": float(r.compute_s[0]),
            "sync_s": float(r.sync_s),
            "utilization_pct": float(getattr(r, self.metric)),
            "compute_utilization_pct": float(r.overall_compute_utilization_pct),
            "compute_share_of_busy_pct": float(r.overall_compute_share_of_busy_pct),
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
    util = run.utilization
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

    def document(self) -> dict:
        """The ``--json`` document: the fitted efficiency, the held-out errors and every run."""
        return {
            "fitted_wan_efficiency": self.fitted_wan_efficiency,
            "heldout_mean_abs_error_pp": self.heldout_mean_abs_error_pp,
            "heldout_max_abs_error_pp": self.heldout_max_abs_error_pp,
            "runs": self.table.to_dict(orient="records"),
        }


def validate_crosssite(path: str | Path | None = None) -> CrossSiteValidation:
    """Predicts every run of the table uncalibrated (the preset's WAN efficiency), fits the WAN
    efficiency on the ``fit`` run (:func:`fit_wan_efficiency`) and predicts every run again.

    Columns of ``table``: ``run``, ``role``, ``definition`` (the source's definition of
    utilisation, the one compared), ``published_pct``, ``uncalibrated_pct``, ``fitted_pct``,
    ``uncalibrated_error_pp``, ``fitted_error_pp`` (prediction − published), the fitted
    ``fitted_compute_utilization_pct`` and ``fitted_compute_share_of_busy_pct`` (both
    definitions), ``published_sync_s``, ``uncalibrated_sync_s``, ``fitted_sync_s``,
    ``published_round_compute_s``, ``predicted_round_compute_s`` (the inner steps done per
    round, fitted), ``published_mfu_pct``, ``predicted_mfu_pct`` (no sync).
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
                "definition": row["utilization_definition"],
                "published_pct": pub,
                "uncalibrated_pct": u["utilization_pct"],
                "fitted_pct": f["utilization_pct"],
                "uncalibrated_error_pp": u["utilization_pct"] - pub,
                "fitted_error_pp": f["utilization_pct"] - pub,
                "fitted_compute_utilization_pct": f["compute_utilization_pct"],
                "fitted_compute_share_of_busy_pct": f["compute_share_of_busy_pct"],
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
