"""`aisim collab`: cross-site collaborative training (sweep, fit, validate, measure-serde).

Each command parses its options, calls one library function of :mod:`collab` inside
:func:`~aisim.console.guard` (which names the option of a bad argument) and renders the result.
``sweep --model`` gives each site every strategy knob of ``aisim perf estimate``
(:func:`aisim.options.knob_options`), with ``--stack`` and ``--set``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer

from aisim.console import console, guard, print_json, rich_table, wrote
from aisim.options import FLAGS as KNOB_FLAGS
from aisim.options import JsonOpt, SetOpt, StackOpt, knob_options, with_settings
from simbase.errors import bad_value
from simbase.io import atomic_write_text, check_new_file, to_json, write_table

app = typer.Typer(no_args_is_help=True, help="Cross-site collaborative training efficiency.")
MODEL, SITES, WAN, ROUND, PLAN, OUT = "Model", "Sites", "WAN", "Round", "Planning", "Output"
# library fields -> this area's options (the rest are --field-name)
FLAGS = KNOB_FLAGS | {
    "num_gpus": "--devices", "global_batch": "--batch-size",
    "num_layers": "--layers", "model_file": "--model", "deadline_s": "--deadline",
    "churn_rate": "--churn", "up_bandwidth": "--wan-up", "down_bandwidth": "--wan-down",
    "latency": "--wan-latency-ms", "tcp_window_bytes": "--tcp-window",
    "window_s": "--round-window", "inner_step_s": "--inner-step-time",
}  # fmt: skip


# fmt: off
def _t(kind, panel: str, *names: str, help: str, metavar: str | None = None, **kw):
    """An option's type: ``kind`` with a typer option in a help panel."""
    return Annotated[kind, typer.Option(*names, rich_help_panel=panel, help=help,
                                        metavar=metavar, **kw)]


SizesOpt = _t(str, MODEL, "--sizes", metavar="SIZES", help="Model sizes without --model (standard "
            "square 8-layer MLPs), e.g. 10M,100M.")
ModelOpt = _t(str | None, MODEL, "--model", metavar="NAME|FILE", help="A model preset (llama3-8b, "
            "...) or model .json: sites that are clusters train it.")
LayersOpt = _t(int | None, MODEL, "--layers", metavar="INT", help="--model: transformer layers.")
SeqLenOpt = _t(int | None, MODEL, "--seq-len", metavar="INT", help="--model: sequence length.")
ClientsOpt = _t(int, SITES, "--clients", metavar="INT", help="Participants (sites).")
ClientHwOpt = _t(str, SITES, "--client-hardware", metavar="NAMES", help="Hardware preset (or "
               ".json) per site, comma-separated; one name: all.")
DevicesOpt = _t(str | None, SITES, "--devices", "--gpus", metavar="INTS", help="Devices per site, "
              "one value or one per site (default 1; --model 8).")
BatchOpt = _t(str | None, SITES, "--batch-size", metavar="INTS", help="Samples per device per "
            "local step (default 64); --model: sequences per site per inner step (128), also "
            "--global-batch.")
SamplesOpt = _t(str, SITES, "--local-samples", metavar="INTS", help="Local data per site "
              "(samples): one epoch per round unless --local-steps.")
StepsOpt = _t(str | None, SITES, "--local-steps", metavar="INTS", help="Local steps per round per "
            "site; --model: inner steps H to try, e.g. 10,100 (default 100).")
InnerOpt = _t(str | None, SITES, "--inner-step-time", metavar="SECONDS", help="--model: measured "
            "seconds per inner step (one or one per site), replacing the model's.")
ProfileOpt = _t(Path | None, SITES, "--profile", metavar="FILE", help="A collab profile (collab "
              "fit, measure-serde); --model: a calibrated profile (`aisim calibrate fit`).")
WanBwOpt = _t(str, WAN, "--wan-bandwidth", metavar="RATES", help="WAN line rate per site, e.g. "
            "1Gbps; --model: rates to try, every site at each.")
WanUpOpt = _t(str | None, WAN, "--wan-up", metavar="RATES", help="Upload line rate per site.")
WanDownOpt = _t(str | None, WAN, "--wan-down", metavar="RATES", help="Download line rate per site.")
LatencyOpt = _t(float | None, WAN, "--wan-latency-ms", metavar="MS", help="One-way WAN latency in "
              "ms (default: the preset's).")
WanEffOpt = _t(float | None, WAN, "--wan-efficiency", metavar="FRACTION", help="--model: achieved "
             "fraction of the line rate (default: the preset's).")
TcpOpt = _t(str | None, WAN, "--tcp-window", metavar="BYTES", help="--model: bytes a link keeps in "
          "flight, e.g. 6MiB: caps it at window / round trip.")
ServerOpt = _t(str | None, WAN, "--server-bandwidth", metavar="RATE", help="--model, server: the "
             "server's line rate (default: the fastest site's).")
ModeOpt = _t(str, ROUND, "--mode", metavar="NAME", help="fedavg, data-parallel or pipeline; "
           "--model adds diloco and streaming-diloco.")
TopologyOpt = _t(str | None, ROUND, "--topology", metavar="NAME", help="server or ring (default "
               "server; --model ring).")
CompressionOpt = _t(str | None, ROUND, "--compression", metavar="NAME", help="none, fp16, int8 or "
                  "topk; --model adds fp32 and bf16.")
TopkOpt = _t(float, ROUND, "--topk-fraction", metavar="FRACTION", help="Fraction of entries top-k "
           "keeps.")
MicroOpt = _t(int | None, "Batching", "--microbatches", hidden=True, help="The earlier spelling of "
            "--num-microbatches.")
SerdeOpt = _t(str | None, ROUND, "--serde-format", metavar="NAME", help="numpy, msgpack (default), "
            "protobuf or pickle; --model: none (default) too.")
AggOpt = _t(str, ROUND, "--aggregator-hardware", metavar="NAME", help="The parameter server's "
          "preset.")
FragmentsOpt = _t(int, ROUND, "--fragments", metavar="INT", help="streaming-diloco: fragments F.")
OverlapOpt = _t(bool, ROUND, "--overlap", show_default=False, help="--model: the sync runs under "
              "the next inner steps (default: blocking).")
ChurnOpt = _t(float, ROUND, "--churn", metavar="FRACTION", help="--model: fraction of sites "
            "replaced per round (a newcomer downloads the state).")
DeadlineOpt = _t(float | None, ROUND, "--deadline", metavar="SECONDS", help="--model: seconds of "
               "inner steps after which a site is dropped.")
WindowOpt = _t(float, ROUND, "--round-window", metavar="SECONDS", help="--model: the round's fixed "
             "length in seconds, as a protocol sets it (0: none).")
RoundsOpt = _t(float, PLAN, "--rounds", metavar="NUMBER", help="Rounds of the task (total time).")
TokensOpt = _t(str | None, PLAN, "--tokens", metavar="COUNT", help="--model: tokens to train, e.g. "
             "1T (adds the time to train).")
OutOpt = _t(Path | None, OUT, "--out", metavar="FILE", help="Write every column (.csv, .parquet, "
          ".json).")
PlotOpt = _t(Path | None, OUT, "--plot", metavar="FILE", help="Write a PNG (shares per size, or "
           "utilisation against H and bandwidth).")
FitOutOpt = _t(Path | None, OUT, "--out", metavar="FILE", help="Write the fitted profile (JSON).")
FitRoundsOpt = _t(float | None, PLAN, "--rounds", metavar="NUMBER", help="Rounds behind each total "
                "time (fills a blank 'rounds' column).")
FitMicroOpt = _t(int | None, "Batching", "--num-microbatches", metavar="INT", help="Pipeline "
                 "mode: microbatches per step (default 8).")
FitClientsOpt = _t(int | None, SITES, "--clients", metavar="INT", help="Participants (default: the "
                 "table's).")
DtypeOpt = _t(str, SITES, "--dtype", metavar="NAME", help="Compute dtype at the sites.")
TableOutOpt = _t(Path | None, OUT, "--table-out", metavar="FILE", help="Write the fitted-vs-given "
               "table (.csv, .parquet or .json).")
WideOpt = _t(bool, OUT, "--wide", help="Show every column.")
ParamsOpt = _t(str, MODEL, "--params", metavar="SIZES", help="Model sizes whose fp32 weights are "
             "timed, e.g. 10M,100M.")
FormatsOpt = _t(str, ROUND, "--formats", metavar="NAMES", help="Formats among numpy, msgpack, "
              "protobuf, pickle.")
RepeatsOpt = _t(int, ROUND, "--repeats", metavar="INT", help="Timings per size and format (the "
              "median is kept).")
ProfileOutOpt = _t(Path | None, OUT, "--out", metavar="FILE", help="Write the profile (JSON) that "
                 "`collab sweep --profile` reads.")
# fmt: on


def _check_paths(out=None, plot=None, table_out=None, json_out=None) -> None:
    """Output paths are files of the right kind (not folders), checked before any work."""
    tables = (".csv", ".parquet", ".json")
    for path, field, suffixes in (
        (out, "out", tables), (json_out, "out", (".json",)), (plot, "plot", (".png",)),
        (table_out, "table_out", tables),
    ):  # fmt: skip
        if path is None:
            continue
        check_new_file(path, field)
        if path.suffix.lower() not in suffixes:
            raise bad_value(None, field, str(path), "a file name ending in " + ", ".join(suffixes))


def _library_args(params: dict, *own: str) -> dict:
    """A command's parameters (its ``locals()`` on entry) but ``own``, the ones the command
    handles itself: the rest are the library function's keyword arguments, by the same names."""
    return {k: v for k, v in params.items() if k not in own}


@app.command("sweep")
@knob_options(exclude=("num_gpus",))
def sweep(
    knobs: dict,
    sizes: SizesOpt = "10M,20M,40M,60M,80M,100M",
    model: ModelOpt = None,
    layers: LayersOpt = None,
    seq_len: SeqLenOpt = None,
    clients: ClientsOpt = 2,
    client_hardware: ClientHwOpt = "a100-80gb",
    devices: DevicesOpt = None,
    batch_size: BatchOpt = None,
    local_samples: SamplesOpt = "60000",
    local_steps: StepsOpt = None,
    inner_step_time: InnerOpt = None,
    profile: ProfileOpt = None,
    stack: StackOpt = None,
    settings: SetOpt = None,
    wan_bandwidth: WanBwOpt = "1Gbps",
    wan_up: WanUpOpt = None,
    wan_down: WanDownOpt = None,
    wan_latency_ms: LatencyOpt = None,
    wan_efficiency: WanEffOpt = None,
    tcp_window: TcpOpt = None,
    server_bandwidth: ServerOpt = None,
    mode: ModeOpt = "fedavg",
    topology: TopologyOpt = None,
    compression: CompressionOpt = None,
    topk_fraction: TopkOpt = 0.01,
    microbatches: MicroOpt = None,
    fragments: FragmentsOpt = 1,
    overlap: OverlapOpt = False,
    churn: ChurnOpt = 0.0,
    deadline: DeadlineOpt = None,
    round_window: WindowOpt = 0.0,
    aggregator_hardware: AggOpt = "cpu-host",
    serde_format: SerdeOpt = None,
    rounds: RoundsOpt = 1.0,
    tokens: TokensOpt = None,
    json_out: JsonOpt = False,
    out: OutOpt = None,
    plot: PlotOpt = None,
) -> None:
    """One row per model size (square MLPs), or with --model one row per inner-step count and
    WAN rate: round time, compute utilisation and each site's shares of the round."""
    args = _library_args(locals(), "knobs", "settings", "microbatches", "json_out", "out", "plot")
    import collab
    from collab.figures import plot_sweep

    with guard(FLAGS):
        _check_paths(out=out, plot=plot)
        if microbatches is not None:  # the earlier spelling of --num-microbatches
            knobs = {"num_microbatches": microbatches} | knobs
        result = collab.run_sweep(knobs=with_settings(knobs, settings), **args)
        if out is not None:
            write_table(result.frame, out)
        if plot is not None:
            plot_sweep(result, plot)
        if json_out:
            print_json(result.document())
            return
        (_print_sizes if result.kind == "sizes" else _print_model)(result)
        wrote(out, plot)


SHARES = {"compute_utilization_pct": "compute %", "compute_share_of_busy_pct": "compute/busy %",
          "communication_share_pct": "comm %", "serialization_share_pct": "serde %",
          "other_share_pct": "other %"}  # fmt: skip


def _print_sizes(result) -> None:
    """The sizes sweep for people: one row per size and client, and a legend."""
    s = result.setting
    names = {"model_params": "size", "total_task_time_s": "total s"} | SHARES
    title = f"aisim collab sweep: {s['mode']}, {s['topology']}, {s['clients']} clients, "
    title += f"{s['rounds']:g} round(s)"
    table = _same_busy(result.client_shares().rename(columns=names))
    console.print(rich_table(table, title=title, float_fmt="{:.2f}"))
    console.print(
        "shares of one synchronous round: compute % = compute / wall time; compute/busy % = "
        "compute / (wall time - waiting), shown where a client waits; comm % includes waiting; "
        "total = rounds x round time; --json/--out: client{i}_*_pct",
        highlight=False,
    )


def _same_busy(t: pd.DataFrame) -> pd.DataFrame:
    """The table without its compute/busy % column where nobody waits (it equals compute %)."""
    same = (t["compute/busy %"] - t["compute %"]).abs().max() < 0.005
    return t.drop(columns=["compute/busy %"]) if same else t


def _print_model(result) -> None:
    """A real model's sweep for people: the settings, the first setting's sites, a legend."""
    s, df = result.setting, result.frame
    cols = {"local_steps": "H", "wan_bandwidth_bps": "WAN Gbit/s", "round_s": "round s",
            "sync_s": "sync s", "compute_utilization_pct": "compute %", "compute_share_of_busy_pct":
            "compute/busy %", "communication_share_pct": "comm %", "serialization_share_pct":
            "serde %", "idle_share_pct": "idle %", "mfu": "MFU %", "dropped_sites": "dropped"}  # fmt: skip
    if s["tokens"] is not None:
        cols["time_to_train_s"] = "days to train"
    t = df[list(cols)].rename(columns=cols)
    t = t.assign(**{"WAN Gbit/s": t["WAN Gbit/s"] / 1e9, "H": t["H"].astype(int)})
    t["MFU %"] *= 100.0
    t.loc[:, t.columns == "days to train"] /= 86400.0
    if t["WAN Gbit/s"].isna().all():
        t = t.drop(columns=["WAN Gbit/s"])
    # terms that are nothing in every row are left out (the JSON and --out keep them)
    t = t.drop(columns=[c for c in ("serde %", "idle %", "dropped") if (t[c].abs() < 0.05).all()])
    t = _same_busy(t)
    title = f"aisim collab sweep: {s['model']} on {s['clients']} sites, {s['mode']}"
    if s["mode"] != "pipeline":
        title += f", {s['topology']}, {s['compression']}" + (", overlapped" if s["overlap"] else "")
    console.print(rich_table(t, title=title, float_fmt="{:.1f}"))
    shown = result.site_groups().rename(columns={
        "devices": "GPUs", "inner_step_s": "step s", "memory_gib": "GiB/GPU",
        "compute_utilization": "compute %", "compute_share_of_busy": "compute/busy %",
        "communication_share_pct": "comm %", "idle_share_pct": "idle %",
    })  # fmt: skip
    shown[["compute %", "compute/busy %"]] *= 100.0
    shown["sites"] += shown.pop("dropped").map({True: " dropped", False: ""})
    console.print(rich_table(_same_busy(shown), title="sites (first setting)", float_fmt="{:.2f}"))
    idle = "a slower site" + (" or the end of the round window" if s["round_window_s"] else "")
    console.print(
        "compute % = time in inner steps that count / wall time; compute/busy % = compute / "
        "(wall time - idle), as published runs count it (both device-weighted), shown where a "
        f"site idles; comm % includes a newcomer's state download; idle % = waiting for {idle}; "
        "columns that are 0 everywhere are not shown; --json and --out carry every site",
        highlight=False,
    )
    for a in result.auto_sites():
        console.print(f"site {a['sites']} ({a['hardware']}) auto: {a['auto']}", highlight=False)
    for u in result.unfit_sites():
        console.print(
            f"[red]warning: site {u['sites']} ({u['hardware']}) needs {u['memory_gib']:.1f} GiB "
            f"per device, more than its {u['capacity_gib']:.0f} GiB: the strategy does not "
            "fit[/red]",
            highlight=False,
        )


@app.command("fit")
def fit(
    seed: Annotated[
        Path, typer.Argument(help="Table of model_params, total_task_time and client{i}_*_pct.")
    ],
    clients: FitClientsOpt = None,
    client_hardware: ClientHwOpt = "a100-80gb",
    devices: DevicesOpt = None,
    batch_size: BatchOpt = None,
    local_samples: SamplesOpt = "60000",
    local_steps: StepsOpt = None,
    wan_bandwidth: WanBwOpt = "1Gbps",
    wan_up: WanUpOpt = None,
    wan_down: WanDownOpt = None,
    wan_latency_ms: LatencyOpt = None,
    mode: ModeOpt = "fedavg",
    topology: TopologyOpt = None,
    compression: CompressionOpt = None,
    topk_fraction: TopkOpt = 0.01,
    num_microbatches: FitMicroOpt = None,
    microbatches: MicroOpt = None,
    aggregator_hardware: AggOpt = "cpu-host",
    dtype: DtypeOpt = "fp32",
    serde_format: SerdeOpt = None,
    rounds: FitRoundsOpt = None,
    out: FitOutOpt = None,
    table_out: TableOutOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Fit the collaboration constants to a table of per-client shares; print fitted vs given."""
    args = _library_args(locals(), "seed", "microbatches", "out", "table_out", "json_out")
    args["num_microbatches"] = num_microbatches or microbatches
    import collab

    with guard(FLAGS):
        _check_paths(table_out=table_out, json_out=out)
        result, doc = collab.fit_from_text(seed, **args)
        if out is not None:
            atomic_write_text(out, to_json(doc) + "\n")
        if table_out is not None:
            write_table(result.table, table_out)
        if json_out:
            print_json(result.document() | {"profile": None if out is None else str(out)})
            return
        keep = ["model_params", "fitted", "given_total_task_time_s", "given_rounds"]
        title = f"aisim collab fit {seed.name}: given vs aisim (pp)"
        console.print(rich_table(result.table, title=title, float_fmt="{:.2f}"))
        console.print(rich_table(
            result.rows[[*keep, "round_time_s", "implied_rounds"]], float_fmt="{:.4g}",
            title="round time and the rounds each given total time implies",
        ))  # fmt: skip
        values = pd.DataFrame({"constant": list(result.values), "value": result.values.values()})
        console.print(rich_table(values, title="fitted constants", float_fmt="{:.4g}"))
        console.print(
            f"rms_error_pp {result.rms_error_pp:.3f} over {result.num_fitted_values} percentages"
            + (f"; wrote {out}" if out is not None else ""),
            highlight=False,
        )
        wrote(table_out)


@app.command("validate")
def validate(
    runs: Annotated[
        Path | None,
        typer.Argument(help="Table of published cross-site runs (default: the shipped one)."),
    ] = None,
    out: OutOpt = None,
    wide: WideOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Published cross-site runs (INTELLECT-1, Covenant-72B) against `sweep --model`, each under
    its source's definition of utilisation: uncalibrated, then with one WAN efficiency fitted
    on the run marked `fit`."""
    import collab

    with guard(FLAGS):
        _check_paths(out=out)
        v = collab.validate_crosssite(runs)
        if out is not None:
            write_table(v.table, out)
        if json_out:
            print_json(v.document())
            return
        cols = {"run": "run", "role": "role", "published_pct": "pub %", "uncalibrated_pct":
                "uncal %", "fitted_pct": "fit %", "fitted_error_pp": "err pp", "published_sync_s":
                "pub sync s", "fitted_sync_s": "fit sync s", "fitted_compute_utilization_pct":
                "fit compute/wall %", "published_round_compute_s": "pub compute s",
                "predicted_round_compute_s": "fit compute s"}  # fmt: skip
        drop = ["fit compute s", "pub compute s", "fit compute/wall %", "fit sync s", "pub sync s"]
        title = "aisim collab validate: compute utilisation of published cross-site runs"
        table = v.table[list(cols)].rename(columns=cols)
        console.print(
            rich_table(table, title=title, float_fmt="{:.1f}", drop=[*drop, "uncal %"], wide=wide)
        )
        used = ", ".join(sorted(set(v.table["definition"])))
        console.print(
            f"pub = published, as its source defines it ({used}: compute / (compute + "
            "communication)); uncal = the preset's WAN efficiency, fit = the one fitted; err = "
            "fit − pub; sync and compute (the inner steps done) in seconds per round",
            highlight=False,
        )
        console.print(
            f"WAN efficiency fitted on the fit run: {v.fitted_wan_efficiency:.3f}; held-out "
            f"|error| mean {v.heldout_mean_abs_error_pp:.1f} pp, max "
            f"{v.heldout_max_abs_error_pp:.1f} pp",
            highlight=False,
        )
        wrote(out)


@app.command("measure-serde")
def measure_serde(
    params: ParamsOpt = "10M,100M",
    formats: FormatsOpt = "numpy,msgpack,protobuf,pickle",
    repeats: RepeatsOpt = 3,
    out: ProfileOutOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Time real (de)serialisation of model parameters; write the throughputs into a profile.

    Each format's throughput is the total bytes over the total median time of all sizes.
    ``AISIM_QUICK=1`` caps the sizes at 2M parameters and the repeats at 2 (for tests).
    """
    from collab.settings import measure_serde_profile

    with guard(FLAGS | {"sizes": "--params"}):
        _check_paths(json_out=out)
        quick = os.environ.get("AISIM_QUICK") == "1"
        doc, repeats = measure_serde_profile(params, formats, repeats, quick)
        if out is not None:
            atomic_write_text(out, to_json(doc) + "\n")
        rows = doc["collab"]["serde_measurements"]
        if json_out:
            print_json({"serde": doc["collab"]["serde"], "measurements": rows,
                        "profile": None if out is None else str(out)})  # fmt: skip
            return
        cols = {"format": "format", "model_params": "size", "bytes": "bytes", "serialize_s":
                "ser s", "deserialize_s": "deser s", "serialize_gb_per_s": "ser GB/s",
                "deserialize_gb_per_s": "deser GB/s"}  # fmt: skip
        df = pd.DataFrame(rows)[list(cols)].rename(columns=cols)
        title = f"aisim collab measure-serde (fp32 weights, median of {repeats})"
        console.print(rich_table(df, title=title, float_fmt="{:.4g}"))
        wrote(out)
