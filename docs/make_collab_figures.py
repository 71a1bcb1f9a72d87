"""Draws docs/figures/collab_shares.png (and prints the README's side-by-side table) and
docs/figures/collab_tradeoff.png.

The source document's 2-client MLP table (calibration/data/seed_collab_mlp_2clients.csv) is fitted with
aisim's collaboration model (collab.fit), the fitted scenario is swept over 10M-100M
(the 40M row is a prediction), and again with a 10x faster WAN. Top row: aisim's shares of one
round as stacked bars, with the source's cumulative shares as black ticks; bottom row: the same
clients on a 10 Gbit/s WAN. Runtime: about half a minute on 2 CPU cores.

collab_tradeoff.png: INTELLECT-1's setting (a 10B Llama-3 on 14 sites of 8 H100, int8 ring
all-reduce; collab/data/crosssite_runs.csv) swept over the inner steps H and the WAN line
rate (the links at their line rate: without the TCP window cap the validation applies, which would
hold every rate here to the same 0.45 Gbit/s at the global round trip), blocking DiLoCo (left, with the report's three published utilisations at H = 100) and streaming
DiLoCo with 4 overlapped fragments (right).

Usage: ``python docs/make_collab_figures.py [shares] [tradeoff]`` (default: both)
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import collab
from collab import fit_collab, load_collab_table  # noqa: E402
from perfmodel import load_hardware  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "calibration" / "data" / "seed_collab_mlp_2clients.csv"
OUT = ROOT / "docs" / "figures" / "collab_shares.png"
TRADEOFF = ROOT / "docs" / "figures" / "collab_tradeoff.png"
TERMS = [
    ("compute_utilization_pct", "compute", "#4c72b0"),
    ("communication_share_pct", "communication (incl. waiting)", "#dd8452"),
    ("serialization_share_pct", "serialisation", "#55a868"),
    ("other_share_pct", "other (aggregation)", "#8c8c8c"),
]


def fitted_frames():
    """The fit, aisim's table at the source's 1 Gbit/s and the same clients at 10 Gbit/s."""
    table = load_collab_table(SEED)
    a100, cpu = load_hardware("a100-80gb"), load_hardware("cpu-host")
    sc = collab.Scenario(hardware=(a100, a100), aggregator=cpu)
    fit = fit_collab(table, sc)
    sizes = table.sizes
    tl = collab.sweep(collab.size_models(sizes), fit.sites, fit.agg, collab.make_setup())
    fast_sites = dataclasses.replace(
        fit.sites,
        up_bytes_per_s=fit.sites.up_bytes_per_s * 10,
        down_bytes_per_s=fit.sites.down_bytes_per_s * 10,
    )
    fast = collab.sweep(collab.size_models(sizes), fast_sites, fit.agg, collab.make_setup())
    return fit, collab.timeline_frame(sizes, tl), collab.timeline_frame(sizes, fast)


def side_by_side(df: pd.DataFrame) -> str:
    """Markdown: the source's value and aisim's, per size and column."""
    src = pd.read_csv(SEED).set_index("model_params")
    cols = [f"client{i}_{c}" for i in (1, 2) for c, *_ in TERMS[:3]]
    head = (
        "| size | " + " | ".join(c.replace("_pct", "").replace("client", "c") for c in cols) + " |"
    )
    lines = [head, "|" + " --- |" * (len(cols) + 1)]
    for _, r in df.iterrows():
        cells = []
        for c in cols:
            g = src.loc[r.model_params, c]
            cells.append(f"{g:.2f} / **{r[c]:.2f}**" if np.isfinite(g) else f"— / **{r[c]:.2f}**")
        lines.append(f"| {r.model_params} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tradeoff() -> None:
    """Utilisation against H and WAN rate in INTELLECT-1's setting (two round modes)."""
    from collab.published import crosssite_of_run, load_crosssite_runs

    runs = load_crosssite_runs()
    row = runs[runs["run"] == "intellect1-global"].iloc[0]
    # the line rate alone: the row's 6 MiB window would cap every rate swept here alike
    base = dataclasses.replace(crosssite_of_run(row), tcp_window_bytes=math.inf)
    hs = (1, 3, 10, 30, 100, 300, 1000)
    rates = (0.1e9, 0.5e9, 1e9, 4e9, 10e9)
    modes = (
        ("DiLoCo, blocking int8 ring all-reduce", dict(mode="diloco")),
        (
            "streaming DiLoCo, 4 fragments overlapped",
            dict(mode="streaming-diloco", fragments=4, overlap=True),
        ),
    )
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.9), sharey=True)
    for ax, (title, change) in zip(axes, modes, strict=True):
        cs = dataclasses.replace(base, **change)
        df = collab.cross_site_frame(cs, collab.evaluate(cs, hs, [r / 8 for r in rates]))
        for rate in rates:
            g = df[df["wan_bandwidth_bps"] == rate].sort_values("local_steps")
            ax.plot(
                g["local_steps"],
                g["compute_utilization_pct"],
                marker="o",
                ms=3,
                label=f"{rate / 1e9:g} Gbit/s",
            )
        ax.set_xscale("log")
        ax.set_xlabel("inner steps per round H")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    pub = runs[runs["run"].str.startswith("intellect1")]
    axes[0].scatter(
        pub["local_steps"],
        pub["published_compute_utilization_pct"],
        marker="x",
        color="black",
        zorder=5,
        label="INTELLECT-1, published",
    )
    axes[0].set_ylabel("compute utilisation (%)")
    axes[0].set_ylim(0, 101)
    axes[1].legend(fontsize=8, title="WAN per site", title_fontsize=8, loc="lower right")
    axes[0].legend(handles=axes[0].collections, fontsize=8, loc="lower right")
    fig.suptitle("10B Llama-3 on 14 sites of 8 H100 (INTELLECT-1's setting)", fontsize=10)
    fig.tight_layout()
    fig.savefig(TRADEOFF, dpi=110)
    print(f"wrote {TRADEOFF.relative_to(ROOT)}")
    print(df[["local_steps", "wan_bandwidth_bps", "compute_utilization_pct"]].round(1))


def main(argv: list[str] | None = None) -> None:
    import sys

    which = set(sys.argv[1:] if argv is None else argv) or {"shares", "tradeoff"}
    if "tradeoff" in which:
        tradeoff()
    if "shares" in which:
        shares()


def shares() -> None:
    fit, df, fast = fitted_frames()
    src = pd.read_csv(SEED)
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharey=True)
    x = np.arange(len(df))
    for row, (frame, title) in enumerate(
        ((df, "1 Gbit/s WAN (the source's setting, fitted)"), (fast, "10 Gbit/s WAN"))
    ):
        for i in range(2):
            ax = axes[row][i]
            bottom = np.zeros(len(frame))
            for col, label, color in TERMS:
                v = frame[f"client{i + 1}_{col}"].to_numpy(float)
                ax.bar(x, v, bottom=bottom, color=color, label=label, width=0.7)
                bottom += v
            if row == 0:
                cum = np.zeros(len(src))
                for col, *_ in TERMS[:3]:
                    cum = cum + src[f"client{i + 1}_{col}"].to_numpy(float)
                    ax.plot(x, cum, "_", color="black", markersize=18, mew=2)
            ax.set_xticks(x, frame["model_params"].tolist())
            ax.set_title(f"client {i + 1}: {title}", fontsize=9)
        axes[row][0].set_ylabel("share of the round (%)")
    axes[0][1].plot([], [], "_", color="black", markersize=12, mew=2, label="source (cumulative)")
    handles, labels = axes[0][1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.suptitle(
        f"aisim collab: 2-client MLP shares (fit RMS {fit.rms_error_pp:.2f} pp; 40M predicted)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT.relative_to(ROOT)}; rms_error_pp {fit.rms_error_pp:.3f}")
    print(side_by_side(df))
    print()
    keep = (
        ["model_params"] + [f"client{i}_{c}" for i in (1, 2) for c, *_ in TERMS] + ["round_time_s"]
    )
    print("10 Gbit/s WAN:")
    print(fast[keep].round(2).to_string(index=False))


if __name__ == "__main__":
    main()
