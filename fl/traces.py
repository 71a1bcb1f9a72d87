"""Per-client availability and speed traces: the CSV format, its loader and a diurnal generator.

Contract: a trace is a CSV file with one row per client, ``client_id`` ``0..clients-1`` (each
once) and, all optional:

- ``device``: a device preset (``fl/profiles``) that replaces the drawn device of that client;
- ``speed_factor``: a number > 0 multiplying the client's training FLOP/s (2 halves its
  compute time);
- availability, in UTC hours of the simulated day (the clock starts at 00:00 UTC), either
  ``available_hours`` as hour ranges ``"22-24;0-6"`` (available in ``[22, 24)`` and ``[0, 6)``,
  empty: never) or 24 columns ``p0`` … ``p23``, the chance of being available in each hour.

:func:`load_trace` applies a trace to a population's :class:`~fl.systems.Systems`; a client
is then available at time ``t`` with chance ``hourly_availability[k, hour(t)]``
(:func:`available_now`), rounds sample only clients available at their start, and a sampled
client answers. :func:`generate_trace` writes the shipped synthetic diurnal trace
(``fl/profiles/trace_diurnal.json``, sources there). Loaders raise
:class:`~simbase.errors.AisimError` naming the file, the column and the value.
"""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from jaxtyping import Array, Float

from fl.systems import Systems, load_profile
from simbase.errors import AisimError, bad_value
from simbase.io import write_table
from simbase.parse import check_seed

SECONDS_PER_HOUR = 3600.0
HOURS = 24
HOUR_COLUMNS = tuple(f"p{h}" for h in range(HOURS))


def available_now(key: Array, systems: Systems, t_s: Float[Array, ""]) -> Array:
    """Which clients can train at simulated time ``t_s`` (one Bernoulli draw each): with a trace
    the chance of ``t_s``'s UTC hour, else the preset's ``availability``."""
    u = jax.random.uniform(key, systems.availability.shape)
    if systems.hourly_availability is None:
        return u < systems.availability
    hour = jnp.floor(t_s / SECONDS_PER_HOUR).astype(jnp.int32) % HOURS
    return u < systems.hourly_availability[:, hour]


def parse_hours(text: str, where: str, row: int) -> np.ndarray:
    """``"22-24;0-6"`` -> 24 availabilities (1 inside a range, else 0)."""
    out = np.zeros(HOURS)
    text = "" if text is None or (isinstance(text, float) and np.isnan(text)) else str(text)
    for part in filter(None, (p.strip() for p in text.split(";"))):
        lo, sep, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi)
        except ValueError:
            a, b = -1, -1
        if not sep or not 0 <= a < b <= HOURS:
            raise bad_value(
                where,
                "available_hours",
                part,
                f"hour ranges such as 22-24;0-6 (0 <= start < end <= 24) in row {row + 2}",
            )
        out[a:b] = 1.0
    return out


def read_trace(path: str | Path, num_clients: int) -> pd.DataFrame:
    """Reads and checks a trace file for a population of ``num_clients``; returns one row per
    client in client order with ``device`` (or ``None``), ``speed_factor`` and ``p0..p23``."""
    where = str(path)
    try:
        raw = pd.read_csv(path)
    except FileNotFoundError:
        raise bad_value(None, "trace", where, "an existing CSV file") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise AisimError(f"{where}: not a readable CSV file ({e})", usage=False) from None
    if "client_id" not in raw.columns:
        raise bad_value(where, "client_id", None, "a client_id column")
    ids = pd.to_numeric(raw["client_id"], errors="coerce")
    expected = np.arange(num_clients)
    if ids.isna().any() or not np.array_equal(np.sort(ids.to_numpy()), expected):
        raise bad_value(
            where,
            "client_id",
            f"{len(raw)} rows",
            f"each of 0..{num_clients - 1} exactly once (the population's clients)",
        )
    raw = raw.assign(client_id=ids.astype(int)).sort_values("client_id").reset_index(drop=True)
    out = pd.DataFrame({"client_id": expected})
    out["device"] = raw["device"].astype(str) if "device" in raw.columns else None
    if "speed_factor" in raw.columns:
        speed = pd.to_numeric(raw["speed_factor"], errors="coerce").to_numpy()
        bad = ~(speed > 0)
        if bad.any():
            i = int(np.argmax(bad))
            raise bad_value(
                where, "speed_factor", raw["speed_factor"][i], f"a number > 0 in row {i + 2}"
            )
        out["speed_factor"] = speed
    else:
        out["speed_factor"] = 1.0
    has_p = [c for c in HOUR_COLUMNS if c in raw.columns]
    if "available_hours" in raw.columns and has_p:
        raise bad_value(where, "available_hours", "with p0..p23", "one availability form, not both")
    if has_p:
        if len(has_p) != HOURS:
            missing = next(c for c in HOUR_COLUMNS if c not in raw.columns)
            raise bad_value(where, missing, None, "all 24 columns p0..p23")
        p = raw[list(HOUR_COLUMNS)].apply(pd.to_numeric, errors="coerce").to_numpy()
        bad = ~((p >= 0) & (p <= 1))
        if bad.any():
            i, h = np.argwhere(bad)[0]
            raise bad_value(
                where,
                HOUR_COLUMNS[h],
                raw[HOUR_COLUMNS[h]][i],
                f"a chance in [0, 1] in row {i + 2}",
            )
    elif "available_hours" in raw.columns:
        p = np.stack([parse_hours(t, where, i) for i, t in enumerate(raw["available_hours"])])
    else:
        p = np.ones((num_clients, HOURS))
    for h, c in enumerate(HOUR_COLUMNS):
        out[c] = p[:, h]
    if "device" in raw.columns:
        for name in sorted(set(out["device"])):
            try:
                load_profile(name)
            except AisimError:
                raise bad_value(where, "device", name, "a device preset name") from None
    return out


def load_trace(path: str | Path, systems: Systems) -> Systems:
    """``systems`` with a trace applied (see module): devices replaced, FLOP/s scaled and the
    hourly availability set (a sampled client then always answers: ``availability`` 1)."""
    n = int(systems.flops_per_s.shape[0])
    t = read_trace(path, n)
    fields = {f.name: np.asarray(getattr(systems, f.name)) for f in dataclasses.fields(Systems)}
    if t["device"].notna().all():
        for name in sorted(set(t["device"])):
            prof = load_profile(name)
            rows = (t["device"] == name).to_numpy()
            for f in (
                "flops_per_s",
                "downlink_bytes_per_s",
                "uplink_bytes_per_s",
                "latency_s",
                "serialize_bytes_per_s",
            ):
                fields[f] = np.where(rows, getattr(prof, f), fields[f])
    fields["flops_per_s"] = fields["flops_per_s"] * t["speed_factor"].to_numpy()
    fields["availability"] = np.ones(n)
    fields["hourly_availability"] = t[list(HOUR_COLUMNS)].to_numpy()
    return Systems(**{k: jnp.asarray(v, jnp.float32) for k, v in fields.items()})


def diurnal_parameters() -> dict:
    """The generator's settings (``fl/profiles/trace_diurnal.json``, each value with a source)."""
    raw = json.loads((resources.files("fl") / "profiles" / "trace_diurnal.json").read_text())
    return {k: v["value"] for k, v in raw.items() if isinstance(v, dict)}


def generate_trace(num_clients: int, seed: int = 0) -> pd.DataFrame:
    """A synthetic diurnal trace (``fl/profiles/trace_diurnal.json``): each client a whole-hour
    time zone (near one of a few regions' offsets) and a night window of local hours in which it is available with a high chance
    (charging, idle, on Wi-Fi), a low chance by day, a phone with a lognormal speed factor.
    Deterministic for a seed; columns ``client_id, device, speed_factor, p0..p23`` (UTC)."""
    if not isinstance(num_clients, int) or num_clients < 1:
        raise bad_value(None, "clients", num_clients, "an integer >= 1")
    check_seed(seed)
    cfg = diurnal_parameters()
    rng = np.random.default_rng(seed)
    region = rng.choice(len(cfg["utc_offset_h"]), num_clients, p=cfg["region_share"])
    offset = np.asarray(cfg["utc_offset_h"])[region] + rng.integers(-1, 2, num_clients)
    start = rng.integers(*cfg["night_start_local_h"], num_clients, endpoint=False)
    length = rng.integers(cfg["night_length_h"][0], cfg["night_length_h"][1] + 1, num_clients)
    speed = rng.lognormal(0.0, cfg["speed_sigma"], num_clients)
    local_hour = (np.arange(HOURS)[None, :] + offset[:, None]) % HOURS  # UTC hour -> local
    into_night = (local_hour - start[:, None]) % HOURS
    night = into_night < length[:, None]
    p = np.where(night, cfg["night_availability"], cfg["day_availability"])
    out = pd.DataFrame(
        {
            "client_id": np.arange(num_clients),
            "device": cfg["device"],
            "speed_factor": np.round(speed, 4),
        }
    )
    return pd.concat([out, pd.DataFrame(p, columns=list(HOUR_COLUMNS))], axis=1)


def write_trace(num_clients: int, seed: int, path: str | Path) -> dict:
    """Writes :func:`generate_trace`'s trace to ``path`` atomically; returns what a person reads
    of it: the expected share available by UTC hour (lowest and highest, and their hours) and the
    median speed factor."""
    t = generate_trace(num_clients, seed)
    write_table(t, Path(path))
    hourly = t[list(HOUR_COLUMNS)].to_numpy().mean(axis=0)
    return {
        "clients": num_clients,
        "available_min": float(hourly.min()),
        "available_min_hour": int(hourly.argmin()),
        "available_max": float(hourly.max()),
        "available_max_hour": int(hourly.argmax()),
        "speed_factor_median": float(t["speed_factor"].median()),
    }
