"""Figures of a collaboration sweep (PNG): where each client's round goes per model size, and
compute utilisation against inner steps H and WAN rate for a real model.

Contract: :func:`plot_sweep` draws a :class:`collab.SweepResult` to a PNG file, written
atomically (:func:`simbase.io.atomic_write_bytes`); matplotlib runs headless (Agg).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd

from collab.sweeps import SweepResult
from simbase.io import atomic_write_bytes

SHARE_BARS = (
    ("compute_utilization_pct", "compute", "#4c72b0"),
    ("communication_share_pct", "communication", "#dd8452"),
    ("serialization_share_pct", "serialisation", "#55a868"),
    ("other_share_pct", "other", "#8c8c8c"),
)


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def plot_shares(df: pd.DataFrame, num_sites: int, path: Path, title: str = "") -> None:
    """Stacked bars of each client's shares per model size, one panel per client."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, num_sites, figsize=(4.2 * num_sites, 3.8), sharey=True, squeeze=False
    )
    x = np.arange(len(df))
    for i, ax in enumerate(axes[0]):
        bottom = np.zeros(len(df))
        for col, label, color in SHARE_BARS:
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
    _save(fig, path)


def plot_tradeoff(df: pd.DataFrame, path: Path, title: str = "") -> None:
    """Compute utilisation (compute / wall time) against inner steps H, one line per WAN rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    for bw, g in df.groupby(df["wan_bandwidth_bps"].fillna(-1.0), sort=True):
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
    _save(fig, path)


def plot_sweep(result: SweepResult, path: Path) -> None:
    """The figure of a sweep: shares per size (model sizes) or the H × bandwidth trade-off."""
    s = result.setting
    if result.kind == "sizes":
        title = f"{s['mode']}, {s['topology']}, {s['wan_bandwidth']} WAN"
        plot_shares(result.frame, result.num_sites, path, title)
    else:
        plot_tradeoff(result.frame, path, f"{s['model']}, {s['clients']} sites, {s['mode']}")
