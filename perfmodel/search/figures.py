"""Figures of a strategy sweep (matplotlib, imported only when a figure is drawn).

Contract: :func:`plot_sweep` draws a :class:`~perfmodel.search.sweep.SweepResult` (or its JSON
document) and writes one PNG atomically (:func:`simbase.io.atomic_write_bytes`), so an
interrupted run leaves no half-written file.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from perfmodel.search.sweep import SweepResult
from perfmodel.step.breakdown import BREAKDOWN_TERMS
from simbase import units
from simbase.io import atomic_write_bytes
from simbase.units import format_count


def plot_sweep(result: SweepResult | dict[str, Any], path: str | Path) -> None:
    """Writes a PNG of a sweep: the Pareto front of tokens/s against memory per device with the
    top strategies, a stacked bar of the top strategies' step-time breakdown, and, when the GPU
    count was swept, the best strategy per GPU count with its Pareto front.

    Args:
      result: a :class:`SweepResult` or its ``to_dict()`` document.
      path: the PNG to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = result.to_dict() if isinstance(result, SweepResult) else result
    panels = 3 if doc.get("pareto_gpus") else 2
    fig, axes = plt.subplots(1, panels, figsize=(6.0 * panels, 4.6))
    _memory_panel(axes[0], doc)
    _breakdown_panel(axes[1], doc["top"])
    if panels == 3:
        _scaling_panel(axes[2], doc)
    best = doc["best"]
    fig.suptitle(
        f"{best['model']} on {best['hardware']}, global batch {best['global_batch_size']} "
        f"[{best['cost_model']}]"
    )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def _gib(r: dict) -> float:
    return r["memory"]["total_bytes"] / units.GIB


def _memory_panel(ax, doc: dict) -> None:
    """Throughput against memory per device: the Pareto front and the top strategies."""
    front, top = doc["pareto"], doc["top"]
    ax.plot(
        [_gib(r) for r in front],
        [r["tokens_per_s"] for r in front],
        "o-",
        color="tab:blue",
        label="Pareto front",
    )
    ax.plot(
        [_gib(r) for r in top],
        [r["tokens_per_s"] for r in top],
        "x",
        color="tab:red",
        label=f"top {len(top)}",
    )
    ax.set_xlabel("memory per device (GiB)")
    ax.set_ylabel("tokens/s")
    ax.set_title("throughput vs memory per device")
    ax.grid(alpha=0.3)
    ax.legend()


def _breakdown_panel(ax, rows: list[dict]) -> None:
    """The step-time terms of each top strategy, stacked."""
    bottom = np.zeros(len(rows))
    labels = [
        f"dp{r['dp']} tp{r['tp']} pp{r['pp']}\nmbs{r['micro_batch_size']} v{r['interleave']} "
        f"z{r['zero_stage']} {r['recompute'][:3]}"
        for r in rows
    ]
    for k in BREAKDOWN_TERMS:
        vals = np.array([r["breakdown"][k] for r in rows])
        ax.bar(range(len(rows)), vals, bottom=bottom, label=k.removesuffix("_s"))
        bottom += vals
    ax.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("seconds per step")
    ax.set_title("step-time breakdown of the top strategies")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _scaling_panel(ax, doc: dict) -> None:
    """Tokens/s of the best strategy per GPU count, and their Pareto front."""
    pts, front = doc["sweep"], doc["pareto_gpus"]
    ax.plot(
        [r["num_gpus"] for r in pts],
        [r["tokens_per_s"] for r in pts],
        ".",
        color="0.6",
        label="best per point",
    )
    ax.plot(
        [r["num_gpus"] for r in front],
        [r["tokens_per_s"] for r in front],
        "o-",
        label="Pareto front",
    )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("tokens/s")
    ax.set_title("scaling: best strategy per GPU count")
    ax.grid(alpha=0.3)
    ax.legend()


def plot_compare(doc: dict[str, Any], path: Path) -> None:
    """One figure: days, cost and energy to train per hardware, and stack where the comparison
    has several (bars; unknown ones empty)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [" ".join((r["hardware"], r.get("stack", ""))).strip() for r in doc["hardware"]]
    panels = (
        ("train_days", "days to train", 1.0),
        ("cost_usd", "cost (million USD)", 1e6),
        ("energy_mwh", "energy (MWh)", 1.0),
    )
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.4), dpi=110)
    for ax, (key, label, scale) in zip(axes, panels, strict=True):
        vals = [(r[key] or 0.0) / scale for r in doc["hardware"]]
        ax.bar(names, vals, color="tab:blue")
        ax.set_title(label, fontsize=10)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.suptitle(
        f"{doc['model']}: {format_count(doc['tokens'])} tokens on {doc['num_gpus']} GPUs",
        fontsize=10,
    )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
