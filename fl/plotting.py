"""Figures of FL runs: test accuracy (or training loss) against rounds and simulated time.

Contract: host-side matplotlib (Agg backend); :func:`plot_accuracy` and :func:`plot_loss` take
``{label: metrics DataFrame}`` and write one PNG atomically.
"""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd

from simbase.io import atomic_write_bytes


def _save(fig, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())


def plot_accuracy(runs: dict[str, pd.DataFrame], path: Path, title: str = "") -> None:
    """Test accuracy against rounds (left) and simulated time (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for label, m in runs.items():
        m = m.dropna(subset=["test_accuracy"])
        a.plot(m["round"], m["test_accuracy"], label=label)
        b.plot(m["sim_time_s"], m["test_accuracy"], label=label)
    a.set_xlabel("round")
    b.set_xlabel("simulated time (s)")
    for ax in (a, b):
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
    a.legend()
    if title:
        fig.suptitle(title)
    _save(fig, Path(path))
    plt.close(fig)


def plot_loss(
    panels: dict[str, dict[str, pd.DataFrame]], path: Path, ylim: float | None = None
) -> None:
    """Training loss against rounds, one panel per ``{panel title: {label: metrics}}``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, (title, runs) in zip(axes[0], panels.items(), strict=True):
        for label, m in runs.items():
            ax.plot(m["round"], m["train_loss"], label=label)
        ax.set_title(title)
        ax.set_xlabel("round")
        ax.set_ylabel("training loss")
        if ylim is not None:
            ax.set_ylim(0, ylim)
        ax.grid(alpha=0.3)
        ax.legend()
    _save(fig, Path(path))
    plt.close(fig)
