"""`aisim collab`: cross-site collaborative training efficiency (sweep, fit, validate,
measure-serde).

``sweep`` prints one row per model size with the source table's columns (total task time, and per
client the compute utilisation and the communication, serialisation and other shares) from
:func:`perfmodel.collab.sweep_frame`; ``fit`` fits the collaboration constants to such a table
(:mod:`calibration.collab_fit`) and writes a profile; ``measure-serde`` times real
serialisation of model parameters in four formats and writes their throughputs into a profile.
Rounds are an input (``--rounds``): the source's own total times imply different round counts.
``sweep --model`` (real models, each site a cluster) is run by :mod:`aisim.collab_real`;
``validate`` compares the cross-site model with published runs.
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from aisim.collab_real import sweep_real
from aisim.console import (
    check_out_suffix,
    console,
    flag_names,
    guard,
    print_json,
    rich_table,
)
from aisim.perf_knobs import FLAGS as KNOB_FLAGS
from aisim.perf_knobs import (
    AttentionKernelOpt,
    CpCommOpt,
    CpOpt,
    EagerOpt,
    EpOpt,
    EtpOpt,
    FsdpFp32ParamsOpt,
    FsdpStepGatherOpt,
    GradReduceOpt,
    LogitBytesOpt,
    MoeDispatchOpt,
    MoeImbalanceOpt,
    MoeOverlapOpt,
    ParamRemaindersOpt,
    RecomputeLayersOpt,
    RecomputeModulesOpt,
    ReshardOpt,
    ShardSizeOpt,
    TpOverlapOpt,
)
from simbase import units
from simbase.errors import bad_value
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
    str,
    _opt(
        help="WAN line rate per site, e.g. 1Gbps (one value or one per client); with --model, "
        "rates to try, every site at each (per-site rates: --wan-up/--wan-down)."
    ),
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
Mode = Annotated[
    str,
    _opt(
        help="fedavg, data-parallel or pipeline; --model adds diloco and streaming-diloco "
        "(pipeline with --model: one stage per site)."
    ),
]
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


# --- the options of real models across sites (`sweep --model`)
ModelOpt = Annotated[
    str | None,
    _opt(
        "--model",
        help="A model preset (llama3-8b, ...) or a model .json file: sites train it with "
        "perfmodel's step model (then --batch-size is sequences per site per inner step).",
    ),
]
LayersOpt = Annotated[int | None, _opt(help="--model: transformer layers (overrides the preset).")]
SeqLenOpt = Annotated[
    int | None, _opt("--seq-len", help="--model: sequence length in tokens (overrides).")
]
DevicesOpt = Annotated[
    str | None,
    _opt(help="Devices per site (one value or one per client; default 1, with --model 8)."),
]
BatchOpt = Annotated[
    str | None,
    _opt(
        help="Samples per device per local step (default 64); with --model, sequences per "
        "site per inner step (default 128; one value or one per client)."
    ),
]
StepsOpt = Annotated[
    str | None,
    _opt(
        help="Local optimiser steps per round per site (overrides --local-samples); with "
        "--model, the inner steps H per round to try, e.g. 10,100,500 (default 100)."
    ),
]
TopologyOpt = Annotated[
    str | None, _opt(help="server (parameter server) or ring (default: server; --model: ring).")
]
CompressionOpt = Annotated[
    str | None,
    _opt(
        help="Payload: none (fp32), fp16, int8 or topk; --model adds fp32 and bf16 (default fp32)."
    ),
]
DtypeOpt = Annotated[
    str | None, _opt(help="Compute dtype at the sites (default fp32; --model bf16).")
]
SerdeOpt = Annotated[
    str | None,
    _opt(
        help="Serialisation format: numpy, msgpack, protobuf or pickle (default msgpack); "
        "--model also none, tensors sent as they are (its default)."
    ),
]
TpOpt = Annotated[int, _opt(help="--model: tensor-parallel degree inside a site.")]
PpOpt = Annotated[int, _opt(help="--model: pipeline-parallel degree inside a site.")]
ZeroOpt = Annotated[int, _opt(help="--model: ZeRO stage 0-3 inside a site (3 = FSDP).")]
RecomputeOpt = Annotated[
    str, _opt(help="--model: activation recomputation: none, selective, full.")
]
MicroBatchOpt = Annotated[
    int, _opt("--micro-batch", "--micro-batch-size", help="--model: samples per microbatch.")
]
SpOpt = Annotated[
    bool,
    _opt(
        "--sequence-parallel/--no-sequence-parallel", help="--model: Megatron sequence parallelism."
    ),
]
FusedOpt = Annotated[
    bool,
    _opt(
        "--fused-attention/--no-fused-attention",
        help="--model: a fused attention kernel (FlashAttention; on by default here, off in "
        "perf estimate).",
    ),
]
FragmentsOpt = Annotated[
    int, _opt(help="streaming-diloco: fragments F, one synced every H/F inner steps.")
]
OverlapOpt = Annotated[
    bool,
    _opt(
        "--overlap/--no-overlap",
        help="--model: the outer sync overlaps the next inner steps (default: blocking, as "
        "INTELLECT-1 and OpenDiLoCo ran it).",
    ),
]
ChurnOpt = Annotated[
    float,
    _opt(help="--model: fraction of sites replaced per round (a newcomer downloads the state)."),
]
DeadlineOpt = Annotated[
    float | None,
    _opt(help="--model: seconds of inner steps after which a slow site is dropped from the round."),
]
WanEffOpt = Annotated[
    float | None,
    _opt(
        help="--model: achieved fraction of the WAN line rate (default: the hardware preset's "
        "or the profile's; `collab validate` fits one)."
    ),
]
TcpWindowOpt = Annotated[
    str | None,
    _opt(
        help="--model: bytes a WAN link keeps in flight (its TCP window), e.g. 6MiB; caps each "
        "link at window / round trip (default: no cap)."
    ),
]
RoundWindowOpt = Annotated[
    float,
    _opt(
        help="--model: the round's fixed length in seconds when the protocol sets it (a chain's "
        "window, e.g. Templar's blocks_per_window x 12 s): inner steps stop at its end and the "
        "sites idle for what is left (default 0: the round lasts as long as its work)."
    ),
]
InnerStepOpt = Annotated[
    str | None,
    _opt(
        help="--model: measured seconds per inner step, one value or one per site, replacing the "
        "step model's (default: perfmodel's step time)."
    ),
]
ServerBwOpt = Annotated[
    str | None,
    _opt(help="--model, server topology: the server's line rate (default: the fastest site's)."),
]
TokensOpt = Annotated[
    str | None, _opt(help="--model: tokens to train, e.g. 1T (adds time_to_train_s).")
]

# library field names -> this area's flags (the rest are --field-name)
FLAGS = flag_names(num_microbatches="--microbatches")
SERDE_FLAGS = flag_names(sizes="--params")
REAL_FLAGS = (
    flag_names(
        num_gpus="--devices",
        global_batch="--batch-size",
        micro_batch_size="--micro-batch",
        zero_stage="--zero",
        num_layers="--layers",
        deadline_s="--deadline",
        churn_rate="--churn",
        up_bandwidth="--wan-up",
        down_bandwidth="--wan-down",
        latency="--wan-latency-ms",
        tcp_window_bytes="--tcp-window",
        window_s="--round-window",
        inner_step_s="--inner-step-time",
        model_file="--model",
    )
    | KNOB_FLAGS
)


def build_scenario(*, profile: Path | None, **options):
    """A validated :class:`perfmodel.collab.Scenario` from the command-line strings
    (:func:`perfmodel.collab.scenario_from_text`), with a profile applied."""
    from perfmodel.collab import scenario_from_text

    microbatches = options.pop("microbatches")
    sc = scenario_from_text(**options, num_microbatches=microbatches)
    if profile is not None:
        from calibration.collab_profile import apply_profile

        keep_latency = options["wan_latency_ms"] is not None
        sc = apply_profile(sc, profile, options["serde_format"], keep_latency=keep_latency)
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
    model: ModelOpt = None,
    layers: LayersOpt = None,
    seq_len: SeqLenOpt = None,
    clients: Clients = 2,
    client_hardware: ClientHw = "a100-80gb",
    devices: DevicesOpt = None,
    batch_size: BatchOpt = None,
    local_samples: Samples = "60000",
    local_steps: StepsOpt = None,
    wan_bandwidth: WanBw = "1Gbps",
    wan_up: WanUp = None,
    wan_down: WanDown = None,
    wan_latency_ms: WanLat = None,
    mode: Mode = "fedavg",
    topology: TopologyOpt = None,
    compression: CompressionOpt = None,
    topk_fraction: TopK = 0.01,
    microbatches: Micro = 8,
    aggregator_hardware: AggHw = "cpu-host",
    dtype: DtypeOpt = None,
    serde_format: SerdeOpt = None,
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    zero: ZeroOpt = 0,
    recompute: RecomputeOpt = "none",
    micro_batch: MicroBatchOpt = 1,
    sequence_parallel: SpOpt = False,
    fused_attention: FusedOpt = True,
    cp: CpOpt = 1,
    ep: EpOpt = 1,
    etp: EtpOpt = 1,
    shard_size: ShardSizeOpt = 0,
    recompute_layers: RecomputeLayersOpt = 0,
    tp_overlap: TpOverlapOpt = False,
    grad_reduce_dtype: GradReduceOpt = "auto",
    moe_imbalance: MoeImbalanceOpt = 1.0,
    moe_dispatch: MoeDispatchOpt = "alltoall",
    moe_overlap: MoeOverlapOpt = False,
    cp_comm: CpCommOpt = "p2p",
    reshard_after_forward: ReshardOpt = True,
    fsdp_step_gather: FsdpStepGatherOpt = False,
    recompute_modules: RecomputeModulesOpt = "",
    param_remainders: ParamRemaindersOpt = False,
    fsdp_fp32_params: FsdpFp32ParamsOpt = False,
    logit_bytes: LogitBytesOpt = 4.0,
    eager: EagerOpt = False,
    attention_kernel: AttentionKernelOpt = "cudnn",
    fragments: FragmentsOpt = 1,
    overlap: OverlapOpt = False,
    churn: ChurnOpt = 0.0,
    deadline: DeadlineOpt = None,
    wan_efficiency: WanEffOpt = None,
    server_bandwidth: ServerBwOpt = None,
    tcp_window: TcpWindowOpt = None,
    round_window: RoundWindowOpt = 0.0,
    inner_step_time: InnerStepOpt = None,
    tokens: TokensOpt = None,
    rounds: Annotated[float, _opt(help="Rounds of the task (total = rounds x round time).")] = 1.0,
    profile: Profile = None,
    json_out: JsonOut = False,
    out: Annotated[Path | None, _opt(help="Write every column (.csv, .parquet or .json).")] = None,
    plot: Annotated[
        Path | None,
        _opt(
            help="Write a PNG: shares per size, or (--model) utilisation against H and bandwidth."
        ),
    ] = None,
) -> None:
    """One row per model size (square MLPs), or with --model one row per inner-step count and
    WAN rate: round time, compute utilisation and each site's shares of the round."""
    if model is not None:
        with guard(REAL_FLAGS):
            sweep_real(dict(locals()))
        return
    devices = devices or "1"
    batch_size = batch_size or "64"
    topology = topology or "server"
    compression = compression or "none"
    dtype = dtype or "fp32"
    serde_format = serde_format or "msgpack"
    with guard(FLAGS):
        from perfmodel.collab import parse_sizes, sweep_frame

        check_out_suffix(out)
        check_rounds(rounds)
        size_list = parse_sizes(sizes)
        options = {k: v for k, v in locals().items() if k in _SCENARIO_DEFAULTS}
        sc = build_scenario(**options, profile=profile)
        df = sweep_frame(sc, size_list, rounds)
        if out is not None:
            write_table(df, out)
        if plot is not None:
            plot_shares(df, sc.num_sites, plot, f"{mode}, {topology}, {wan_bandwidth} WAN")
        if json_out:
            setting = _sweep_setting(sc, options, rounds, profile)
            print_json({"setting": setting, "rows": df.to_dict(orient="records")})
            return
        _print_sweep(df, sc, options, rounds, out)


def check_rounds(rounds: float) -> None:
    """``--rounds`` is a positive, finite number."""
    if not (math.isfinite(rounds) and rounds > 0):
        raise bad_value(None, "rounds", rounds, "a positive number of rounds")


def _sweep_setting(sc, options: dict, rounds: float, profile: Path | None) -> dict:
    """The ``setting`` block of ``sweep --json``."""
    return {
        "mode": options["mode"],
        "topology": options["topology"],
        "compression": options["compression"],
        "clients": sc.num_sites,
        "hardware": [h.name for h in sc.hardware],
        "aggregator": sc.aggregator.name,
        "wan_bandwidth": options["wan_bandwidth"],
        "rounds": rounds,
        "serde_format": options["serde_format"],
        "profile": None if profile is None else str(profile),
    }


def _print_sweep(df, sc, options: dict, rounds: float, out: Path | None) -> None:
    """The sweep for people: the shares table (long form beyond two clients) and a legend."""
    title = (
        f"aisim collab sweep: {options['mode']}, {options['topology']}, {sc.num_sites} clients, "
        f"{rounds:g} round(s)"
    )
    cols = share_columns(sc.num_sites)
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
    with guard(FLAGS):
        from calibration import fit_collab, load_collab_table
        from calibration.collab_profile import fit_profile

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
        _print_fit(result, seed, out)


def _print_fit(result, seed: Path, out: Path | None) -> None:
    """The fit for people: given vs fitted shares, implied rounds, the constants, the RMS."""
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


@app.command("validate")
def validate(
    runs: Annotated[
        Path | None,
        typer.Argument(help="Table of published cross-site runs (default: the shipped one)."),
    ] = None,
    out: Annotated[Path | None, _opt(help="Write the table (.csv, .parquet or .json).")] = None,
    wide: Annotated[bool, _opt("--wide", help="Show every column.")] = False,
    json_out: JsonOut = False,
) -> None:
    """Published cross-site runs (INTELLECT-1, Covenant-72B) against `sweep --model`:
    uncalibrated, then with one WAN efficiency fitted on the run marked `fit`."""
    with guard(REAL_FLAGS):
        from calibration.collab_fit import validate_crosssite

        check_out_suffix(out)
        v = validate_crosssite(runs)
        if out is not None:
            write_table(v.table, out)
        if json_out:
            print_json(
                {
                    "fitted_wan_efficiency": v.fitted_wan_efficiency,
                    "heldout_mean_abs_error_pp": v.heldout_mean_abs_error_pp,
                    "heldout_max_abs_error_pp": v.heldout_max_abs_error_pp,
                    "runs": v.table.to_dict(orient="records"),
                }
            )
            return
        cols = {
            "run": "run",
            "role": "role",
            "published_pct": "pub %",
            "uncalibrated_pct": "uncal %",
            "fitted_pct": "fit %",
            "fitted_error_pp": "err pp",
            "published_sync_s": "pub sync s",
            "fitted_sync_s": "fit sync s",
            "published_round_compute_s": "pub compute s",
            "predicted_round_compute_s": "fit compute s",
        }
        console.print(
            rich_table(
                v.table[list(cols)].rename(columns=cols),
                title="aisim collab validate: compute utilisation of published cross-site runs",
                float_fmt="{:.1f}",
                drop=["pub compute s", "fit compute s", "fit sync s", "pub sync s", "uncal %"],
                wide=wide,
            )
        )
        console.print(
            "pub = published, uncal = the preset's WAN efficiency, fit = the one fitted; "
            "err = fit − pub; sync and compute (the inner steps done) in seconds per round",
            highlight=False,
        )
        console.print(
            f"WAN efficiency fitted on the fit run: {v.fitted_wan_efficiency:.3f}; held-out "
            f"|error| mean {v.heldout_mean_abs_error_pp:.1f} pp, max "
            f"{v.heldout_max_abs_error_pp:.1f} pp",
            highlight=False,
        )
        if out is not None:
            console.print(f"wrote {out}", highlight=False)


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
    with guard(SERDE_FLAGS):
        from calibration.collab_profile import serde_profile
        from calibration.serde import check_formats, measure_serde, serde_throughputs
        from perfmodel.collab import parse_sizes
        from perfmodel.collab_text import parse_list

        check_out_suffix(out, (".json",))
        sizes = parse_sizes(params)
        fmts = check_formats(parse_list(formats, "formats"))
        if os.environ.get("AISIM_QUICK") == "1":
            sizes = [s if units.parse_count(s) <= 2e6 else "2M" for s in sizes]
            repeats = min(repeats, 2) if repeats >= 1 else repeats
        measured = measure_serde(sizes, fmts, repeats)
        results = serde_throughputs(measured)
        rows = [m.to_dict() for m in measured]
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
        _print_serde(rows, repeats, out)


def _print_serde(rows: list[dict], repeats: int, out: Path | None) -> None:
    """The measurements for people: one row per (format, size) with both throughputs."""
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
