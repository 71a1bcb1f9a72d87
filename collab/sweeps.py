"""``aisim collab sweep`` as one library call: settings as text in, a table and a document out.

Contract: :func:`run_sweep` takes the sweep's settings as typed (see :mod:`collab.settings`) and
returns a :class:`SweepResult`: without ``model``, the standard MLPs of ``sizes`` (one row per
size, the source table's shares per client; :func:`collab.sweep_frame`); with ``model``, a real
model across sites (one row per inner-step count H and WAN rate, per-site records;
:func:`collab.evaluate`). A setting that only one of the two uses is refused by the other, and
every value is checked before any computation; errors are :class:`~simbase.errors.AisimError`
with ``field`` the parameter's name.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pandas as pd

from collab.cross_site import CrossSite, cross_site_frame, evaluate
from collab.scenario import SHARE_COLUMNS, sweep_frame
from collab.settings import (
    cross_site_from_text,
    parse_counts,
    parse_rates,
    parse_sizes,
    scenario_from_text,
)
from simbase import units
from simbase.errors import bad_value

# a task of more rounds than this is a typo (1e30), not a plan: a billion rounds of a second
# is 32 years
MAX_ROUNDS = 1e9

DEFAULT_SIZES = "10M,20M,40M,60M,80M,100M"
# settings of the model sizes alone and of real models alone, with their defaults
_SIZES_ONLY = dict(local_samples="60000", aggregator_hardware="cpu-host", rounds=1.0)
_MODEL_ONLY = dict(
    layers=None, seq_len=None, fragments=1, overlap=False, churn=0.0, deadline=None,
    wan_efficiency=None, server_bandwidth=None, tcp_window=None, round_window=0.0,
    inner_step_time=None, tokens=None, stack=None,
)  # fmt: skip
_WITH_MODEL = "it applies with {model}"
SITE_RECORD = (
    "inner_step_s", "memory_gib", "fits_memory", "auto", "compute_utilization_pct",
    "compute_share_of_busy_pct", "communication_share_pct", "serialization_share_pct",
    "idle_share_pct", "mfu", "bytes_sent", "dropped",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """What a sweep reports.

    Attributes:
      kind: ``"sizes"`` (the standard MLPs) or ``"model"`` (a real model across sites).
      frame: one row per size, or per (H, WAN rate): every column (``--out``).
      setting: what was swept, as the JSON document's ``setting`` block.
      sites: ``"model"``: per row, one record per site (its inner step, memory, shares).
      hardware: each site's hardware preset.
    """

    kind: str
    frame: pd.DataFrame
    setting: dict[str, Any]
    sites: list[list[dict[str, Any]]] | None
    hardware: tuple

    @property
    def num_sites(self) -> int:
        return len(self.hardware)

    def document(self) -> dict[str, Any]:
        """The ``--json`` document: ``setting`` and ``rows`` (a real model: also the slowest
        site's ``inner_step_s`` and the first row's ``compute_utilization`` and
        ``compute_share_of_busy``, fractions, and each row's ``sites``)."""
        rows = self.frame.to_dict(orient="records")
        if self.kind == "sizes":
            return {"setting": self.setting, "rows": rows}
        first = self.frame.iloc[0]
        return {
            "setting": self.setting,
            "inner_step_s": float(first["inner_step_s"]),
            "compute_utilization": float(first["compute_utilization_pct"]) / 100.0,
            "compute_share_of_busy": float(first["compute_share_of_busy_pct"]) / 100.0,
            "rows": [
                {**{k: v for k, v in r.items() if not k.startswith("site")}, "sites": s}
                for r, s in zip(rows, self.sites, strict=True)
            ],
        }

    def client_shares(self) -> pd.DataFrame:
        """A sizes sweep as one row per size and client: ``model_params``, ``client`` (from 1),
        ``total_task_time_s`` and the client's shares of the round (percent): those of
        :data:`collab.scenario.SHARE_COLUMNS` and ``compute_share_of_busy_pct``."""
        shares = (*SHARE_COLUMNS[:1], "compute_share_of_busy_pct", *SHARE_COLUMNS[1:])
        rows = [
            {"model_params": r["model_params"], "client": i,
             "total_task_time_s": r["total_task_time_s"]}
            | {k: r[f"client{i}_{k}"] for k in shares}
            for _, r in self.frame.iterrows()
            for i in range(1, self.num_sites + 1)
        ]  # fmt: skip
        return pd.DataFrame(rows)

    def site_groups(self) -> pd.DataFrame:
        """The first row's sites, identical ones as one row whose ``sites`` names them
        (``"1-3,5"``): hardware, devices, inner step, memory, both utilisations (fractions),
        communication and idle shares, dropped."""
        keys = ["hardware", "devices", "inner_step_s", "memory_gib", "compute_utilization"]
        keys += ["compute_share_of_busy", "communication_share_pct", "idle_share_pct", "dropped"]
        sites = pd.DataFrame(self.sites[0])
        grouped = sites.groupby(keys, sort=False)["site"].agg(lambda x: site_ranges(list(x)))
        return grouped.reset_index().rename(columns={"site": "sites"})[["sites", *keys]]

    def auto_sites(self) -> list[dict[str, Any]]:
        """The first row's sites where ``auto`` chose a knob, identical ones together:
        ``sites`` (``"1-3"``), ``hardware`` and ``auto`` (``"zero_stage 3, recompute full"``)."""
        out: dict[tuple, list[int]] = {}
        for s in (self.sites or [[]])[0]:
            if s["auto"]:
                out.setdefault((s["hardware"], s["auto"]), []).append(s["site"])
        return [
            {"sites": site_ranges(ids), "hardware": hw, "auto": a} for (hw, a), ids in out.items()
        ]

    def unfit_sites(self) -> list[dict[str, Any]]:
        """The first row's sites whose strategy does not fit their devices' memory, identical
        ones together: ``sites`` (``"1-3"``), ``hardware``, ``memory_gib`` needed per device and
        ``capacity_gib`` a device has."""
        if not self.sites:
            return []
        out: dict[tuple, list[int]] = {}
        for s in self.sites[0]:
            if not s["fits_memory"]:
                cap = float(self.hardware[s["site"] - 1].spec.memory_capacity_bytes) / units.GIB
                out.setdefault((s["hardware"], s["memory_gib"], cap), []).append(s["site"])
        return [
            {"sites": site_ranges(ids), "hardware": hw, "memory_gib": gib, "capacity_gib": cap}
            for (hw, gib, cap), ids in out.items()
        ]


def site_ranges(ids: list[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3,5"``."""
    out, start = [], ids[0]
    for a, b in zip(ids, [*ids[1:], None], strict=True):
        if b != a + 1:
            out.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ",".join(out)


def _refuse(given: dict[str, Any], defaults: dict[str, Any], why: str, hint: str) -> None:
    for field, default in defaults.items():
        if given.get(field, default) != default:
            raise bad_value(None, field, given[field], why, hint=hint)


def _sizes_sweep(sizes: str, rounds: float, knobs: dict, profile, text: dict) -> SweepResult:
    microbatches = knobs.get("num_microbatches")
    if microbatches is not None:  # the pipeline mode's microbatches per step
        text["num_microbatches"] = parse_counts(str(microbatches), "num_microbatches")[0]
    extra = {k: v for k, v in knobs.items() if k not in ("dtype", "num_microbatches")}
    if extra:
        field, value = next(iter(extra.items()))
        raise bad_value(None, field, value, "a site strategy of a real model", hint=_WITH_MODEL)
    if not (isinstance(rounds, int | float) and 0 < rounds <= MAX_ROUNDS):
        raise bad_value(None, "rounds", rounds, f"a positive number of rounds up to {MAX_ROUNDS:g}")
    size_list = parse_sizes(sizes)
    text = {k: v for k, v in text.items() if v is not None}
    sc = scenario_from_text(**text, dtype=knobs.get("dtype", "fp32"), profile=profile)
    df = sweep_frame(sc, size_list, rounds)
    setting = {
        "mode": sc.mode,
        "topology": sc.topology,
        "compression": sc.compression,
        "clients": sc.num_sites,
        "hardware": [h.name for h in sc.hardware],
        "aggregator": sc.aggregator.name,
        "wan_bandwidth": text.get("wan_bandwidth", "1Gbps"),
        "rounds": rounds,
        "serde_format": text.get("serde_format", "msgpack"),
        "profile": None if profile is None else str(profile),
    }
    return SweepResult("sizes", df, setting, None, sc.hardware)


def _records(cs: CrossSite, df: pd.DataFrame) -> list[list[dict[str, Any]]]:
    """Per row of ``df``, one dict per site: its inner step, memory and shares."""
    out = []
    for _, r in df.iterrows():
        recs = []
        for i in range(cs.num_sites):
            rec: dict[str, Any] = {
                "site": i + 1,
                "hardware": cs.hardware[i].name,
                "devices": cs.per_site("devices")[i],
            }
            for k in SITE_RECORD:
                v = r[f"site{i + 1}_{k}"]
                if k in ("fits_memory", "dropped"):
                    rec[k] = bool(v)
                elif k == "auto":
                    rec[k] = str(v)
                elif k in ("compute_utilization_pct", "compute_share_of_busy_pct"):
                    rec[k.removesuffix("_pct")] = float(v) / 100.0  # fractions, as the row's
                else:
                    rec[k] = float(v)
            recs.append(rec)
        out.append(recs)
    return out


def _model_sweep(cs: CrossSite, local_steps, wan_bandwidth, own_rates: bool, tokens, profile):
    steps = parse_counts(local_steps or "100", "local_steps")
    rates = None if own_rates else parse_rates(wan_bandwidth or "1Gbps", "wan_bandwidth")
    count = None
    if tokens is not None:
        try:
            count = units.parse_count(tokens)
        except ValueError:
            count = -1.0
        if not 0 < count < math.inf:
            raise bad_value(None, "tokens", tokens, "a positive token count like 1T")
    res = evaluate(cs, steps, rates)
    df = cross_site_frame(cs, res, count)
    setting = {
        "model": cs.model.name,
        "params": float(res.estimates[0].to_dict()["params"]),
        "mode": cs.mode,
        "topology": cs.topology,
        "compression": cs.compression,
        "overlap": cs.overlap,
        "fragments": cs.fragments,
        "clients": cs.num_sites,
        "hardware": [h.name for h in cs.hardware],
        "devices": cs.per_site("devices"),
        "batch_size": cs.per_site("batch_size"),
        "wan_efficiency": cs.wan_efficiency,
        "tcp_window_bytes": None if math.isinf(cs.tcp_window_bytes) else cs.tcp_window_bytes,
        "round_window_s": cs.window_s,
        "knobs": cs.knobs,
        "stack": None if cs.stack is None else cs.stack.name,
        "tokens": count,
        "profile": None if profile is None else str(profile),
    }
    return SweepResult("model", df, setting, _records(cs, df), cs.hardware)


def run_sweep(
    *,
    sizes: str = DEFAULT_SIZES,
    model: str | None = None,
    rounds: float = 1.0,
    tokens: str | None = None,
    profile: str | Path | None = None,
    knobs: dict[str, Any] | None = None,
    **settings: Any,
) -> SweepResult:
    """``aisim collab sweep``: the standard MLPs of ``sizes`` (``model`` None) or a real model.

    Args:
      sizes: model sizes (the standard square MLPs), e.g. ``"10M,100M"``.
      model: a model preset or ``.json`` file: sites that are clusters train it.
      rounds: rounds of the task (sizes: total time = rounds × round time).
      tokens: tokens to train (a real model: adds the time to train them).
      profile: a collab profile (sizes) or a calibrated profile (a real model).
      knobs: the sites' strategy knobs (a real model; sizes take ``dtype`` alone).
      **settings: the keyword arguments of :func:`collab.scenario_from_text` (sizes) or
        :func:`collab.cross_site_from_text` (a real model; ``local_steps`` and ``wan_bandwidth``
        are lists to sweep), by name.

    Raises:
      AisimError: a bad setting, or one that the other kind of sweep alone takes.
    """
    knobs = dict(knobs or {})
    if model is None:
        _refuse(
            settings | {"tokens": tokens}, _MODEL_ONLY, "a setting of a real model", _WITH_MODEL
        )
        text = {k: v for k, v in settings.items() if k not in _MODEL_ONLY}
        return _sizes_sweep(sizes, rounds, knobs, profile, text)
    why = "a setting of the model sizes, not of a real model"
    _refuse(settings | {"rounds": rounds}, _SIZES_ONLY, why, "leave it out with {model}")
    if sizes != DEFAULT_SIZES:
        raise bad_value(None, "sizes", sizes, why, hint="leave it out with {model}")
    steps, bandwidth = settings.pop("local_steps", None), settings.get("wan_bandwidth")
    text = {k: v for k, v in settings.items() if k not in _SIZES_ONLY and v is not None}
    cs = cross_site_from_text(model=model, profile=profile, knobs=knobs, **text)
    own = settings.get("wan_up") is not None or settings.get("wan_down") is not None
    return _model_sweep(cs, steps, bandwidth, own, tokens, profile)
