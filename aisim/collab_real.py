"""`aisim collab sweep --model`: real models across sites, each site a cluster timed by
perfmodel's step function (:mod:`perfmodel.collab_real`): the command's options to a cross-site
setup, its table, JSON, per-site records and the H x bandwidth trade-off figure.
"""

import dataclasses
import inspect
import io
import math
from pathlib import Path

from aisim.console import (
    check_out_suffix,
    console,
    print_json,
    rich_table,
)
from aisim.perf_knobs import (
    estimate_knobs,
)
from simbase import units
from simbase.errors import bad_value
from simbase.io import write_table


def _real_model(model: str, layers: int | None, seq_len: int | None):
    """``--model``: a preset name or a model ``.json`` file, with ``--layers``/``--seq-len``."""
    from perfmodel import resolve_model

    is_file = model.lower().endswith(".json")
    return resolve_model(
        None if is_file else model,
        model_file=Path(model) if is_file else None,
        num_layers=layers,
        seq_len=seq_len,
    )


def _site_constants(hws: list, profile: Path | None) -> list | None:
    """Per-site constants of a calibrated stack profile (``--profile``), or None."""
    if profile is None:
        return None
    from calibration.profile import load_profile_constants, read_profile

    doc = read_profile(profile)
    if "collab" in doc and "constants" not in doc:
        raise bad_value(
            str(profile),
            "collab",
            "a collab profile",
            "a stack profile (constants of the step model) with --model",
            hint="collab fit/measure-serde profiles apply to {sizes}",
        )
    return [load_profile_constants(profile, h.name, h.constants) for h in hws]


def build_cross_site(o: dict):
    """A validated :class:`perfmodel.collab_real.CrossSite` and the sweep's H values, WAN rates
    and token target, from ``sweep --model``'s options (``o``: the command's locals)."""
    from perfmodel.collab_model import WAN as WAN_TIER
    from perfmodel.collab_real import CrossSite
    from perfmodel.collab_scenario import SERDE_DEFAULT_BYTES_PER_S
    from perfmodel.collab_text import hardware_by_name, parse_counts, parse_list, parse_rates

    clients = o["clients"]
    if isinstance(clients, bool) or not isinstance(clients, int) or clients < 1:
        raise bad_value(None, "clients", clients, "a positive number of participants")
    m = _real_model(o["model"], o["layers"], o["seq_len"])
    names = parse_list(o["client_hardware"], "client_hardware")
    if len(names) not in (1, clients):
        raise bad_value(
            None, "client_hardware", o["client_hardware"], f"one name or {clients} names"
        )
    hws = [hardware_by_name(n) for n in names] * (clients if len(names) == 1 else 1)
    per_site = {}
    for field, text, parse in (
        ("devices", o["devices"] or "8", parse_counts),
        ("batch_size", o["batch_size"] or "128", parse_counts),
        ("wan_up", o["wan_up"], parse_rates),
        ("wan_down", o["wan_down"], parse_rates),
    ):
        vals = parse(text, field)
        if vals is not None and len(vals) not in (1, clients):
            raise bad_value(None, field, text, f"1 value or one per client ({clients})")
        per_site[field] = vals
    rates = parse_rates(o["wan_bandwidth"], "wan_bandwidth")
    own = o["wan_up"] is not None or o["wan_down"] is not None
    up = per_site["wan_up"] or rates[:1]
    down = per_site["wan_down"] or up
    consts = _site_constants(hws, o["profile"])
    base = consts or [h.constants for h in hws]
    if o["wan_latency_ms"] is not None:
        if not (math.isfinite(o["wan_latency_ms"]) and o["wan_latency_ms"] >= 0):
            raise bad_value(None, "wan_latency_ms", o["wan_latency_ms"], "milliseconds >= 0")
        lat = (o["wan_latency_ms"] * units.MS,)
    else:
        lat = tuple(float(c.link_latency_s[WAN_TIER]) for c in base)
    eff = o["wan_efficiency"]
    if eff is None:
        eff = float(base[0].link_bandwidth_efficiency[WAN_TIER])
    fmt = o["serde_format"] or "none"
    if fmt == "none":
        ser = deser = math.inf
    elif fmt in SERDE_DEFAULT_BYTES_PER_S:
        ser, deser = SERDE_DEFAULT_BYTES_PER_S[fmt]
    else:
        raise bad_value(
            None, "serde_format", fmt, "none or one of " + ", ".join(SERDE_DEFAULT_BYTES_PER_S)
        )
    server = o["server_bandwidth"]
    window = math.inf
    if o["tcp_window"] is not None:
        try:
            window = units.parse_bytes(o["tcp_window"])
        except ValueError:
            window = -1.0
        if not (math.isfinite(window) and window > 0):
            raise bad_value(None, "tcp_window_bytes", o["tcp_window"], "a size like 6MiB or 4MB")
    # a site takes every knob of perf estimate, under the same option names
    knobs = estimate_knobs(**{k: o[k] for k in inspect.signature(estimate_knobs).parameters})
    knobs.update(
        tp=o["tp"],
        pp=o["pp"],
        zero_stage=o["zero"],
        recompute=o["recompute"],
        micro_batch_size=o["micro_batch"],
        sequence_parallel=o["sequence_parallel"],
        fused_attention=o["fused_attention"],
        dtype=o["dtype"] or "bf16",
    )
    cs = CrossSite(
        model=m,
        hardware=tuple(hws),
        devices=per_site["devices"],
        batch_size=per_site["batch_size"],
        constants=None if consts is None else tuple(consts),
        knobs=knobs,
        up_bytes_per_s=up,
        down_bytes_per_s=down,
        latency_s=lat,
        serialize_bytes_per_s=ser,
        deserialize_bytes_per_s=deser,
        mode=o["mode"],
        topology=o["topology"] or "ring",
        compression=o["compression"] or "fp32",
        overlap=o["overlap"],
        fragments=o["fragments"],
        wan_efficiency=eff,
        churn_rate=o["churn"],
        deadline_s=0.0 if o["deadline"] is None else o["deadline"],
        topk_fraction=o["topk_fraction"],
        server_bytes_per_s=None if server is None else parse_rates(server, "server_bandwidth")[0],
        tcp_window_bytes=window,
        window_s=o["round_window"],
    )
    if o["inner_step_time"] is not None:
        step_s = _seconds(o["inner_step_time"], "inner_step_s")
        if len(step_s) not in (1, clients):
            raise bad_value(None, "inner_step_s", o["inner_step_time"], f"1 value or {clients}")
        cs = dataclasses.replace(cs, inner_step_s=step_s)
    steps = parse_counts(o["local_steps"] or "100", "local_steps")
    tokens = None
    if o["tokens"] is not None:
        try:
            tokens = units.parse_count(o["tokens"])
        except ValueError:
            tokens = -1.0
        if not tokens > 0:
            raise bad_value(None, "tokens", o["tokens"], "a positive token count like 1T")
    return cs, steps, (None if own else rates), tokens


def _seconds(text: str, field: str) -> tuple[float, ...]:
    """Comma-separated positive seconds, e.g. ``40`` or ``40,35``."""
    try:
        vals = tuple(float(x) for x in text.split(","))
    except ValueError:
        vals = (-1.0,)
    if not all(math.isfinite(v) and v > 0 for v in vals):
        raise bad_value(None, field, text, "positive seconds, one value or one per client")
    return vals


def sweep_real(o: dict) -> None:
    """``sweep --model``: one row per (H, WAN rate), per-site shares, JSON/CSV/figure."""
    from perfmodel.collab_real import cross_site_frame, evaluate, pipeline_frame

    check_out_suffix(o["out"])
    cs, steps, rates, tokens = build_cross_site(o)
    if cs.mode == "data-parallel":
        steps = (1,)  # a round is one step: H does not apply
    if cs.mode == "pipeline":
        df, ests = pipeline_frame(cs, rates, tokens)
    else:
        res = evaluate(cs, steps, rates)
        df, ests = cross_site_frame(cs, res, tokens), res.estimates
    if o["out"] is not None:
        write_table(df, o["out"])
    if o["plot"] is not None:
        plot_tradeoff(df, o["plot"], f"{cs.model.name}, {cs.num_sites} sites, {cs.mode}")
    sites = site_records(cs, df)
    if o["json_out"]:
        print_json(
            {
                "setting": {
                    "model": cs.model.name,
                    "params": float(ests[0].to_dict()["params"]),
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
                    "tcp_window_bytes": None
                    if math.isinf(cs.tcp_window_bytes)
                    else cs.tcp_window_bytes,
                    "round_window_s": cs.window_s,
                    "knobs": cs.knobs,
                    "profile": None if o["profile"] is None else str(o["profile"]),
                },
                "inner_step_s": float(df["inner_step_s"].iloc[0]),
                "compute_utilization": float(df["compute_utilization_pct"].iloc[0]) / 100.0,
                "rows": [
                    {**{k: v for k, v in r.items() if not k.startswith("site")}, "sites": s}
                    for r, s in zip(df.to_dict(orient="records"), sites, strict=True)
                ],
            }
        )
        return
    _print_real(cs, df, sites, tokens, o["out"])


def site_records(cs, df) -> list[list[dict]]:
    """Per row of ``df``, one dict per site: its inner step, memory and shares."""
    out = []
    for _, r in df.iterrows():
        recs = []
        for i in range(cs.num_sites):
            p = f"site{i + 1}_"
            recs.append(
                {
                    "site": i + 1,
                    "hardware": cs.hardware[i].name,
                    "devices": cs.per_site("devices")[i],
                    "inner_step_s": float(r[p + "inner_step_s"]),
                    "memory_gib": float(r[p + "memory_gib"]),
                    "fits_memory": bool(r[p + "fits_memory"]),
                    "compute_utilization": float(r[p + "compute_utilization_pct"]) / 100.0,
                    "communication_share_pct": float(r[p + "communication_share_pct"]),
                    "serialization_share_pct": float(r[p + "serialization_share_pct"]),
                    "idle_share_pct": float(r[p + "idle_share_pct"]),
                    "mfu": float(r[p + "mfu"]),
                    "bytes_sent": float(r[p + "bytes_sent"]),
                    "dropped": bool(r[p + "dropped"]),
                }
            )
        out.append(recs)
    return out


def _print_real(cs, df, sites: list, tokens, out: Path | None) -> None:
    """``sweep --model`` for people: the settings table and the first setting's sites."""
    import pandas as pd

    cols = {
        "local_steps": "H",
        "wan_bandwidth_bps": "WAN Gbit/s",
        "round_s": "round s",
        "sync_s": "sync s",
        "compute_utilization_pct": "compute %",
        "communication_share_pct": "comm %",
        "serialization_share_pct": "serde %",
        "idle_share_pct": "idle %",
        "mfu": "MFU %",
        "dropped_sites": "dropped",
    }
    if tokens is not None:
        cols["time_to_train_s"] = "days to train"
    t = df[list(cols)].rename(columns=cols).copy()
    t["WAN Gbit/s"] = t["WAN Gbit/s"] / 1e9
    t["H"] = t["H"].astype(int)
    t["MFU %"] = 100.0 * t["MFU %"]
    if tokens is not None:
        t["days to train"] = t["days to train"] / 86400.0
    if t["WAN Gbit/s"].isna().all():
        t = t.drop(columns=["WAN Gbit/s"])
    # terms that are nothing in every row are left out (the JSON and --out keep them)
    t = t.drop(columns=[c for c in ("serde %", "idle %", "dropped") if (t[c].abs() < 0.05).all()])
    title = f"aisim collab sweep: {cs.model.name} on {cs.num_sites} sites, {cs.mode}"
    if cs.mode != "pipeline":
        title += f", {cs.topology}, {cs.compression}" + (", overlapped" if cs.overlap else "")
    console.print(rich_table(t, title=title, float_fmt="{:.1f}"))
    s = pd.DataFrame(sites[0])
    s["compute %"] = 100.0 * s["compute_utilization"]
    keys = ["hardware", "devices", "inner_step_s", "memory_gib", "compute %"]
    keys += ["communication_share_pct", "idle_share_pct", "dropped"]
    s = (
        s.groupby(keys, sort=False)["site"]
        .agg(lambda x: _ranges(list(x)))
        .reset_index()[["site", *keys]]
        .rename(
            columns={
                "site": "sites",
                "inner_step_s": "inner step s",
                "memory_gib": "GiB/device",
                "communication_share_pct": "comm %",
                "idle_share_pct": "idle %",
            }
        )
    )
    console.print(rich_table(s, title="sites (first setting)", float_fmt="{:.2f}"))
    idle = "a slower site or the end of the round window" if cs.window_s > 0 else "a slower site"
    console.print(
        "compute % = time in inner steps that count / wall time (device-weighted); comm % "
        f"includes a newcomer's state download; idle % = waiting for {idle} (columns "
        "that are 0 everywhere are not shown); --json and --out carry every site",
        highlight=False,
    )
    if out is not None:
        console.print(f"wrote {out}", highlight=False)


def _ranges(ids: list[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3,5"``."""
    out, start = [], ids[0]
    for a, b in zip(ids, [*ids[1:], None], strict=True):
        if b != a + 1:
            out.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ",".join(out)


def plot_tradeoff(df, path: Path, title: str = "") -> None:
    """Compute utilisation against inner steps H, one line per WAN rate (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from simbase.io import atomic_write_bytes

    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    groups = df.groupby(df["wan_bandwidth_bps"].fillna(-1.0), sort=True)
    for bw, g in groups:
        g = g.sort_values("local_steps")
        label = "sites' own links" if bw < 0 else f"{bw / 1e9:g} Gbit/s"
        ax.plot(g["local_steps"], g["compute_utilization_pct"], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("inner steps per round H")
    ax.set_ylabel("compute utilisation (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title="WAN", title_fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
