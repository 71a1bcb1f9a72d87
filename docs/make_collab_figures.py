"""Draws docs/figures/collab_shares.png and prints the README's side-by-side table.

The source document's 2-client MLP table (calibration/data/seed_collab_mlp_2clients.csv) is fitted with
aisim's collaboration model (calibration.collab_fit), the fitted scenario is swept over 10M-100M
(the 40M row is a prediction), and again with a 10x faster WAN. Top row: aisim's shares of one
round as stacked bars, with the source's cumulative shares as black ticks; bottom row: the same
clients on a 10 Gbit/s WAN. Runtime: about half a minute on 2 CPU cores.
Usage: ``python docs/make_collab_figures.py``
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from calibration import fit_collab, load_collab_table  # noqa: E402
from perfmodel import collab, load_hardware  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "calibration" / "data" / "seed_collab_mlp_2clients.csv"
OUT = ROOT / "docs" / "figures" / "collab_shares.png"
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


def main() -> None:
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
