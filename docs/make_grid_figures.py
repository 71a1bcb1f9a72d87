"""Figures of docs/readme/grid.md: `aisim perf grid` pictures for the README.

Writes docs/figures/grid_gpt3_175b.png (GPT-3 175B on 1024 x A100-80GB, global batch 1536,
--recompute full: Pareto front of tokens/s against memory per device, and the breakdown of the
top strategies) and docs/figures/grid_scaling_13b.png (GPT-3 13B, 64..1024 GPUs: the best
strategy per GPU count). Run: ``python docs/make_grid_figures.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    from perfmodel import plot_sweep, sweep

    out = ROOT / "docs" / "figures"
    out.mkdir(parents=True, exist_ok=True)
    result = sweep("gpt3-175b", num_gpus=1024, global_batch=1536, recompute=["full"], top=8)
    plot_sweep(result, out / "grid_gpt3_175b.png")
    result = sweep("gpt3-13b", num_gpus=[64, 128, 256, 512, 1024], global_batch=1024, top=8)
    plot_sweep(result, out / "grid_scaling_13b.png")
    print(f"wrote {out / 'grid_gpt3_175b.png'} and {out / 'grid_scaling_13b.png'}")


if __name__ == "__main__":
    main()
