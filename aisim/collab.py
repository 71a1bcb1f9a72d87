"""`aisim collab`: cross-site collaborative training efficiency (sweep, fit, measure-serde).

``sweep`` prints one row per model size with the source table's columns (total task time, and per
client the compute utilisation and the communication, serialisation and other shares) from
:func:`perfmodel.collab.sweep_frame`; ``fit`` fits the collaboration constants to such a table
(:mod:`calibration.collab_fit`) and writes a profile; ``measure-serde`` times real
serialisation of model parameters in four formats and writes their throughputs into a profile.
Rounds are an input (``--rounds``): the source's own total times imply different round counts.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import statistics
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from aisim.console import check_out_suffix, console, guard, print_json, rich_table
from simbase import units
from simbase.errors import AisimError, bad_value
from simbase.io import atomic_write_text, to_json, write_table

app = typer.Typer(no_args_is_help=True, help="Cross-site collaborative training efficiency.")

_opt = typer.Option
DEFAULT_SIZES = "10M,20M,40M,60M,80M,100M"
Clients = Annotated[int, _opt(help="Participants (sites).")]
ClientHw = Annotated[
    str, _opt(help="Hardware preset (or .json file) per client, comma-separated; one name = all.")
]
Devices = Annotated[str, _opt(help="Devices per site (one value or one per client).")]
Batch = Annotated[str, _opt(help="Samples per device per local step.")]
Samples = Annotated[
    str, _opt(help="Local data size per site (samples); one epoch per round unless --local-steps.")
]
Steps = Annotated[
    str | None, _opt(help="Local optimiser steps per round per site (overrides --local-samples).")
]
WanBw = Annotated[
    str, _opt(help="WAN line rate per site, e.g. 1Gbps (one value or one per client).")
]
WanUp = Annotated[
    str | None, _opt(help="Asymmetric links: upload line rate per site (default --wan-bandwidth).")
]
WanDown = Annotated[
    str | None,
    _opt(help="Asymmetric links: download line rate per site (default --wan-bandwidth)."),
]
WanLat = Annotated[
    float | None, _opt(help="One-way WAN latency in milliseconds (default: the preset's).")
]
Mode = Annotated[str, _opt(help="fedavg, data-parallel or pipeline.")]
Topology = Annotated[str, _opt(help="server (parameter server) or ring.")]
Compression = Annotated[str, _opt(help="Payload: none (fp32), fp16, int8 or topk.")]
TopK = Annotated[float, _opt(help="Fraction of entries top-k keeps.")]
Micro = Annotated[int, _opt(help="Pipeline mode: microbatches per step.")]
AggHw = Annotated[str, _opt(help="Hardware preset (or .json) of the parameter server.")]
Dtype = Annotated[str, _opt(help="Compute dtype at the sites.")]
Serde = Annotated[str, _opt(help="Serialisation format: numpy, msgpack, protobuf or pickle.")]
Profile = Annotated[
    Path | None, _opt(help="A collab profile (from `collab fit` or `collab measure-serde`).")
]
JsonOut = Annotated[bool, _opt("--json", help="Print one JSON document.")]


def _split(text: str, option: str) -> list[str]:
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not parts:
        raise bad_value("command line", option, text, "a comma-separated list")
    return parts


def _rates(text: str | None, option: str) -> tuple[float, ...] | None:
    if text is None:
        return None
    out = []
    for p in _split(text, option):
        try:
            v = units.parse_bitrate(p)
        except ValueError:
            raise bad_value(
                "command line", option, p, "a positive link speed like 1Gbps or 100Mbps"
            ) from None
        if not v > 0:
            raise bad_value(
                "command line", option, p, "a positive link speed like 1Gbps or 100Mbps"
            )
        out.append(v)
    return tuple(out)


def _numbers(text: str | None, option: str, integer: bool = True) -> tuple[float, ...] | None:
    if text is None:
        return None
    out = []
    for p in _split(text, option):
        try:
            v = units.parse_count(p)
        except ValueError:
            raise bad_value("command line", option, p, "positive numbers like 64 or 60k") from None
        if v <= 0 or (integer and v != int(v)):
            raise bad_value(
                "command line", option, p, "positive integers" if integer else "positive numbers"
            )
        out.append(int(v) if integer else v)
    return tuple(out)


def _sizes(text: str, option: str = "--sizes") -> list[str]:
    sizes = _split(text, option)
    for s in sizes:
        try:
            if units.parse_count(s) < 8:
                raise ValueError
        except ValueError:
            raise bad_value(
                "command line", option, s, "parameter counts like 10M,100M or 1.5B"
            ) from None
    return sizes


def _hardware(name: str):
    from aisim.common import resolve_hardware

    if name.lower().endswith(".json"):
        return resolve_hardware(hardware_file=Path(name))
    return resolve_hardware(name)


def build_scenario(
    *,
    clients: int,
    client_hardware: str,
    devices: str,
    batch_size: str,
    local_samples: str,
    local_steps: str | None,
    wan_bandwidth: str,
    wan_up: str | None,
    wan_down: str | None,
    wan_latency_ms: float | None,
    mode: str,
    topology: str,
    compression: str,
    topk_fraction: float,
    microbatches: int,
    aggregator_hardware: str,
    dtype: str,
    serde_format: str,
    profile: Path | None,
):
    """A validated :class:`perfmodel.collab.Scenario` from the command-line strings."""
    from perfmodel import collab

    if clients < 1:
        raise bad_value("command line", "--clients", clients, "a positive number of participants")
    if serde_format not in collab.SERDE_FORMATS:
        raise bad_value(
            "command line",
            "--serde-format",
            serde_format,
            "one of " + ", ".join(collab.SERDE_FORMATS),
        )
    names = _split(client_hardware, "--client-hardware")
    if len(names) not in (1, clients):
        raise bad_value(
            "command line", "--client-hardware", client_hardware, f"one name or {clients} names"
        )
    hws = [_hardware(n) for n in names] * (clients if len(names) == 1 else 1)
    if wan_latency_ms is not None and not (math.isfinite(wan_latency_ms) and wan_latency_ms >= 0):
        raise bad_value(
            "command line",
            "--wan-latency-ms",
            wan_latency_ms,
            "a non-negative number of milliseconds",
        )
    bw = _rates(wan_bandwidth, "--wan-bandwidth")
    ser, deser = collab.SERDE_DEFAULT_BYTES_PER_S[serde_format]
    sc = collab.Scenario(
        hardware=tuple(hws),
        aggregator=_hardware(aggregator_hardware),
        devices=_numbers(devices, "--devices"),
        micro_batch_size=_numbers(batch_size, "--batch-size"),
        local_samples=_numbers(local_samples, "--local-samples"),
        local_steps=_numbers(local_steps, "--local-steps"),
        up_bytes_per_s=_rates(wan_up, "--wan-up") or bw,
        down_bytes_per_s=_rates(wan_down, "--wan-down") or bw,
        latency_s=None if wan_latency_ms is None else wan_latency_ms * units.MS,
        serialize_bytes_per_s=ser,
        deserialize_bytes_per_s=deser,
        mode=mode,
        topology=topology,
        compression=compression,
        topk_fraction=topk_fraction,
        num_microbatches=microbatches,
        dtype=dtype,
    )
    for name in (
        "devices",
        "micro_batch_size",
        "local_samples",
        "local_steps",
        "up_bytes_per_s",
        "down_bytes_per_s",
    ):
        sc.per_site(name)  # one value or one per client
    if profile is not None:
        from calibration.collab_fit import apply_profile

        sc = apply_profile(sc, profile, serde_format, keep_latency=wan_latency_ms is not None)
    return sc


_SCENARIO_DEFAULTS = dict(
    clients=2,
    client_hardware="a100-80gb",
    devices="1",
    batch_size="64",
    local_samples="60000",
    local_steps=None,
    wan_bandwidth="1Gbps",
    wan_up=None,
    wan_down=None,
    wan_latency_ms=None,
    mode="fedavg",
    topology="server",
    compression="none",
    topk_fraction=0.01,
    microbatches=8,
    aggregator_hardware="cpu-host",
    dtype="fp32",
    serde_format="msgpack",
)


def share_columns(num_sites: int) -> list[str]:
    """The printed columns: the source table's, plus each client's other share."""
    cols = ["model_params", "total_task_time_s"]
    for i in range(1, num_sites + 1):
        cols += [
            f"client{i}_compute_utilization_pct",
            f"client{i}_communication_share_pct",
            f"client{i}_serialization_share_pct",
            f"client{i}_other_share_pct",
        ]
    return cols


_SHORT = {
    "compute_utilization_pct": "compute %",
    "communication_share_pct": "comm %",
    "serialization_share_pct": "serde %",
    "other_share_pct": "other %",
}


def short_names(df):
    """The frame with ``client{i}_..._pct`` shortened to ``c{i} compute %`` etc., for people."""
    import re

    def short(c: str) -> str:
        m = re.fullmatch(r"client(\d+)_(.*)", c)
        if m and m.group(2) in _SHORT:
            return f"c{m.group(1)} {_SHORT[m.group(2)]}"
        return {"total_task_time_s": "total s", "round_time_s": "round s"}.get(c, c)

    return df.rename(columns=short)


def long_shares(df, num_sites: int):
    """One row per (size, client): the shares, for tables of more than two clients."""
    import pandas as pd

    recs = []
    for _, r in df.iterrows():
        for i in range(1, num_sites + 1):
            recs.append(
                {
                    "model_params": r["model_params"],
                    "client": i,
                    "total s": r["total_task_time_s"],
                    **{_SHORT[k]: r[f"client{i}_{k}"] for k in _SHORT},
                }
            )
    return pd.DataFrame(recs)


def plot_shares(df, num_sites: int, path: Path, title: str = "") -> None:
    """Stacked bars of each client's shares per model size, one panel per client (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from simbase.io import atomic_write_bytes

    terms = [
        ("compute_utilization_pct", "compute", "#4c72b0"),
        ("communication_share_pct", "communication", "#dd8452"),
        ("serialization_share_pct", "serialisation", "#55a868"),
        ("other_share_pct", "other", "#8c8c8c"),
    ]
    fig, axes = plt.subplots(
        1, num_sites, figsize=(4.2 * num_sites, 3.8), sharey=True, squeeze=False
    )
    x = np.arange(len(df))
    for i, ax in enumerate(axes[0]):
        bottom = np.zeros(len(df))
        for col, label, color in terms:
            v = df[f"client{i + 1}_{col}"].to_numpy(float)
            ax.bar(x, v, bottom=bottom, color=color, label=label, width=0.7)
            bottom += v
        ax.set_xticks(x, df["model_params"].tolist())
        ax.set_title(f"client {i + 1}")
        ax.set_xlabel("model parameters")
    axes[0][0].set_ylabel("share of the round (%)")
    axes[0][-1].legend(loc="lower right", fontsize=8, framealpha=0.9)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


@app.command("sweep")
def sweep(
    sizes: Annotated[
        str, _opt(help="Model sizes (standard square 8-layer MLPs), e.g. 10M,100M.")
    ] = DEFAULT_SIZES,
    clients: Clients = 2,
    client_hardware: ClientHw = "a100-80gb",
    devices: Devices = "1",
    batch_size: Batch = "64",
    local_samples: Samples = "60000",
    local_steps: Steps = None,
    wan_bandwidth: WanBw = "1Gbps",
    wan_up: WanUp = None,
    wan_down: WanDown = None,
    wan_latency_ms: WanLat = None,
    mode: Mode = "fedavg",
    topology: Topology = "server",
    compression: Compression = "none",
    topk_fraction: TopK = 0.01,
    microbatches: Micro = 8,
    aggregator_hardware: AggHw = "cpu-host",
    dtype: Dtype = "fp32",
    serde_format: Serde = "msgpack",
    rounds: Annotated[float, _opt(help="Rounds of the task (total = rounds x round time).")] = 1.0,
    profile: Profile = None,
    json_out: JsonOut = False,
    out: Annotated[Path | None, _opt(help="Write every column (.csv, .parquet or .json).")] = None,
    plot: Annotated[
        Path | None, _opt(help="Write a PNG of the shares as stacked bars per size.")
    ] = None,
) -> None:
    """One row per model size: total task time and each client's shares of the round."""
    with guard():
        from perfmodel.collab import sweep_frame

        check_out_suffix(out)
        if not (math.isfinite(rounds) and rounds > 0):
            raise bad_value("command line", "--rounds", rounds, "a positive number of rounds")
        size_list = _sizes(sizes)
        sc = build_scenario(
            **{k: v for k, v in locals().items() if k in _SCENARIO_DEFAULTS}, profile=profile
        )
        df = sweep_frame(sc, size_list, rounds)
        if out is not None:
            write_table(df, out)
        if plot is not None:
            plot_shares(df, sc.num_sites, plot, f"{mode}, {topology}, {wan_bandwidth} WAN")
        cols = share_columns(sc.num_sites)
        if json_out:
            print_json(
                {
                    "setting": {
                        "mode": mode,
                        "topology": topology,
                        "compression": compression,
                        "clients": sc.num_sites,
                        "hardware": [h.name for h in sc.hardware],
                        "aggregator": sc.aggregator.name,
                        "wan_bandwidth": wan_bandwidth,
                        "rounds": rounds,
                        "serde_format": serde_format,
                        "profile": None if profile is None else str(profile),
                    },
                    "rows": df.to_dict(orient="records"),
                }
            )
            return
        title = (
            f"aisim collab sweep: {mode}, {topology}, {sc.num_sites} clients, {rounds:g} round(s)"
        )
        shown = short_names(df[cols]) if sc.num_sites <= 2 else long_shares(df, sc.num_sites)
        console.print(rich_table(shown, title=title, float_fmt="{:.2f}"))
        console.print(
            "shares of one synchronous round (comm includes waiting); total = rounds x round "
            "time; --json/--out name them client{i}_*_pct",
            highlight=False,
        )
        if out is not None:
            console.print(f"wrote {out}", highlight=False)


@app.command("fit")
def fit(
    seed: Annotated[
        Path, typer.Argument(help="Table of model_params, total_task_time and client{i}_*_pct.")
    ],
    out: Annotated[Path | None, _opt(help="Write the fitted profile (JSON).")] = None,
    rounds: Annotated[
        float | None, _opt(help="Rounds behind each total time (fills a blank 'rounds' column).")
    ] = None,
    clients: Annotated[int | None, _opt(help="Participants (default: the table's).")] = None,
    client_hardware: ClientHw = "a100-80gb",
    devices: Devices = "1",
    batch_size: Batch = "64",
    local_samples: Samples = "60000",
    local_steps: Steps = None,
    wan_bandwidth: WanBw = "1Gbps",
    wan_up: WanUp = None,
    wan_down: WanDown = None,
    wan_latency_ms: WanLat = None,
    mode: Mode = "fedavg",
    topology: Topology = "server",
    compression: Compression = "none",
    topk_fraction: TopK = 0.01,
    microbatches: Micro = 8,
    aggregator_hardware: AggHw = "cpu-host",
    dtype: Dtype = "fp32",
    serde_format: Serde = "msgpack",
    table_out: Annotated[
        Path | None, _opt(help="Write the fitted-vs-given table (.csv, .parquet or .json).")
    ] = None,
    json_out: JsonOut = False,
) -> None:
    """Fit the collaboration constants to a table of per-client shares; print fitted vs given."""
    with guard():
        from calibration.collab_fit import fit_collab, fit_profile, load_collab_table

        check_out_suffix(out, (".json",))
        check_out_suffix(table_out)
        table = load_collab_table(seed, rounds)
        kw = {k: v for k, v in locals().items() if k in _SCENARIO_DEFAULTS}
        kw["clients"] = table.num_sites if clients is None else clients
        sc = build_scenario(**kw, profile=None)
        result = fit_collab(table, sc)
        doc = fit_profile(result, table, sc)
        if out is not None:
            atomic_write_text(out, to_json(doc) + "\n")
        if table_out is not None:
            write_table(result.table, table_out)
        rows = result.rows[
            [
                "model_params",
                "fitted",
                "given_total_task_time_s",
                "given_rounds",
                "round_time_s",
                "implied_rounds",
            ]
        ]
        if json_out:
            print_json(
                {
                    "rms_error_pp": result.rms_error_pp,
                    "fitted_percentages": result.num_fitted_values,
                    "values": result.values,
                    "table": result.table.to_dict(orient="records"),
                    "rows": result.rows.to_dict(orient="records"),
                    "profile": None if out is None else str(out),
                }
            )
            return
        console.print(
            rich_table(
                result.table,
                title=f"aisim collab fit {seed.name}: given vs aisim (pp)",
                float_fmt="{:.2f}",
            )
        )
        console.print(
            rich_table(
                rows,
                title="round time and the rounds each given total time implies",
                float_fmt="{:.4g}",
            )
        )
        console.print(
            rich_table(_values_frame(result.values), title="fitted constants", float_fmt="{:.4g}")
        )
        console.print(
            f"rms_error_pp {result.rms_error_pp:.3f} over {result.num_fitted_values} percentages"
            + (f"; wrote {out}" if out is not None else ""),
            highlight=False,
        )


def _values_frame(values: dict[str, float]):
    import pandas as pd

    return pd.DataFrame({"constant": list(values), "value": list(values.values())})


# --------------------------------------------------------------------- serialisation formats


def _params_tree(n_params: float, layers: int = 8) -> dict[str, np.ndarray]:
    """The standard square MLP's weights (``layers`` h x h fp32 kernels), deterministic."""
    h = max(1, round(math.sqrt(n_params / layers)))
    rng = np.random.default_rng(0)
    return {f"layer{i}": rng.standard_normal((h, h), dtype=np.float32) for i in range(layers)}


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _proto_dumps(tree: dict[str, np.ndarray]) -> bytes:
    """Protobuf wire format of ``repeated Tensor {string name = 1; repeated uint64 shape = 2
    [packed]; bytes data = 3;}`` as field 1 of the message (length-delimited fields)."""
    parts = []
    for name, a in tree.items():
        nb = name.encode()
        shape = b"".join(_varint(d) for d in a.shape)
        data = a.tobytes()
        msg = b"".join(
            [
                b"\x0a",
                _varint(len(nb)),
                nb,
                b"\x12",
                _varint(len(shape)),
                shape,
                b"\x1a",
                _varint(len(data)),
                data,
            ]
        )
        parts += [b"\x0a", _varint(len(msg)), msg]
    return b"".join(parts)


def _proto_loads(blob: bytes) -> dict[str, np.ndarray]:
    buf = memoryview(blob)
    out, pos = {}, 0
    while pos < len(buf):
        _, pos = _read_varint(buf, pos)  # tag of field 1
        length, pos = _read_varint(buf, pos)
        end, name, shape, data = pos + length, "", (), b""
        while pos < end:
            tag, pos = _read_varint(buf, pos)
            n, pos = _read_varint(buf, pos)
            field = buf[pos : pos + n]
            pos += n
            if tag >> 3 == 1:
                name = bytes(field).decode()
            elif tag >> 3 == 2:
                dims, p = [], 0
                while p < n:
                    d, p = _read_varint(field, p)
                    dims.append(d)
                shape = tuple(dims)
            else:
                data = field
        out[name] = np.frombuffer(data, np.float32).reshape(shape).copy()
    return out


def _numpy_dumps(tree):
    buf = io.BytesIO()
    np.savez(buf, **tree)
    return buf.getvalue()


def _numpy_loads(blob):
    with np.load(io.BytesIO(blob)) as z:
        return {k: z[k] for k in z.files}


def _msgpack_dumps(tree):
    from flax import serialization

    return serialization.msgpack_serialize(tree)


def _msgpack_loads(blob):
    from flax import serialization

    return serialization.msgpack_restore(blob)


SERDE = {
    "numpy": (_numpy_dumps, _numpy_loads),
    "msgpack": (_msgpack_dumps, _msgpack_loads),
    "protobuf": (_proto_dumps, _proto_loads),
    "pickle": (lambda t: pickle.dumps(t, protocol=5), pickle.loads),
}


def measure_serde_rows(sizes: list[str], formats: list[str], repeats: int) -> list[dict]:
    """Times serialise and deserialise of each size's fp32 weights in each format (median of ``repeats``)."""
    rows = []
    for size in sizes:
        tree = _params_tree(units.parse_count(size))
        nbytes = sum(a.nbytes for a in tree.values())
        for fmt in formats:
            dumps, loads = SERDE[fmt]
            ts, td = [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                blob = dumps(tree)
                t1 = time.perf_counter()
                back = loads(blob)
                t2 = time.perf_counter()
                ts.append(t1 - t0)
                td.append(t2 - t1)
            if not all(np.array_equal(back[k], tree[k]) for k in tree):
                raise AisimError(f"{fmt}: the round trip changed the parameters", usage=False)
            del blob, back
            rows.append(
                {
                    "format": fmt,
                    "model_params": size,
                    "params": sum(a.size for a in tree.values()),
                    "bytes": nbytes,
                    "serialize_s": statistics.median(ts),
                    "deserialize_s": statistics.median(td),
                }
            )
    for r in rows:
        r["serialize_gb_per_s"] = r["bytes"] / r["serialize_s"] / units.GIGA
        r["deserialize_gb_per_s"] = r["bytes"] / r["deserialize_s"] / units.GIGA
    return rows


@app.command("measure-serde")
def measure_serde(
    params: Annotated[
        str, _opt(help="Model sizes whose fp32 weights are timed, e.g. 10M,100M.")
    ] = "10M,100M",
    formats: Annotated[
        str, _opt(help="Formats among numpy, msgpack, protobuf, pickle.")
    ] = "numpy,msgpack,protobuf,pickle",
    repeats: Annotated[int, _opt(help="Timings per size and format (the median is kept).")] = 3,
    out: Annotated[
        Path | None, _opt(help="Write the profile (JSON) that `collab sweep --profile` reads.")
    ] = None,
    json_out: JsonOut = False,
) -> None:
    """Time real (de)serialisation of model parameters; write the throughputs into a profile.

    Each format's throughput is the total bytes over the total median time of all sizes.
    ``AISIM_QUICK=1`` caps the sizes at 2M parameters and the repeats at 2 (for tests).
    """
    with guard():
        from calibration.collab_fit import serde_profile

        check_out_suffix(out, (".json",))
        sizes = _sizes(params, "--params")
        fmts = _split(formats, "--formats")
        for f in fmts:
            if f not in SERDE:
                raise bad_value("command line", "--formats", f, "formats among " + ", ".join(SERDE))
        if repeats < 1:
            raise bad_value("command line", "--repeats", repeats, "a positive integer")
        if os.environ.get("AISIM_QUICK") == "1":
            sizes = [s if units.parse_count(s) <= 2e6 else "2M" for s in sizes]
            repeats = min(repeats, 2)
        rows = measure_serde_rows(sizes, fmts, repeats)
        results = {}
        for f in fmts:
            rs = [r for r in rows if r["format"] == f]
            total = sum(r["bytes"] for r in rs)
            results[f] = {
                "serialize_bytes_per_s": total / sum(r["serialize_s"] for r in rs),
                "deserialize_bytes_per_s": total / sum(r["deserialize_s"] for r in rs),
            }
        doc = serde_profile(results, rows)
        if out is not None:
            atomic_write_text(out, to_json(doc) + "\n")
        if json_out:
            print_json(
                {
                    "serde": results,
                    "measurements": rows,
                    "profile": None if out is None else str(out),
                }
            )
            return
        import pandas as pd

        df = pd.DataFrame(rows)[
            [
                "format",
                "model_params",
                "bytes",
                "serialize_s",
                "deserialize_s",
                "serialize_gb_per_s",
                "deserialize_gb_per_s",
            ]
        ]
        console.print(
            rich_table(
                df,
                title=f"aisim collab measure-serde (fp32 weights, median of {repeats})",
                float_fmt="{:.4g}",
            )
        )
        if out is not None:
            console.print(f"wrote {out}", highlight=False)
