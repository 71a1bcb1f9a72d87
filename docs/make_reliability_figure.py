"""Draws docs/figures/goodput_vs_job_size.png for docs/concepts/reliability.md: Llama 3 405B on
H100 (the ``h100-sxm`` preset's failure rates, asynchronous checkpoints to the parallel file
system) from 256 to 131,072 GPUs. Left: the goodput (useful over wall time), the same with the
straggler slowdown, with synchronous saves, and the Llama 3 report's 54 days on 16,384 GPUs
("higher than 90%"). Right: the job's mean time between failures and the checkpoint interval
(Daly's optimum), asynchronous and synchronous.

Run: ``python docs/make_reliability_figure.py`` (a second or two; no JAX compilation).
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from perfmodel.plan.failure_model import PROFILE, failure_model  # noqa: E402
from perfmodel.plan.reliability import checkpoint_bytes, failure_plan  # noqa: E402
from perfmodel.specs.model import load_model, total_params  # noqa: E402
from simbase.io import atomic_write_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "figures" / "goodput_vs_job_size.png"
GPUS = 2.0 ** np.arange(8, 18)  # 256 .. 131,072


def main() -> None:
    params = float(total_params(load_model("llama3-405b").spec))
    fm = failure_model("h100-sxm")
    plan = failure_plan(
        fm,
        num_gpus=GPUS,
        useful_s=np.full(GPUS.shape, 1e7),
        checkpoint_bytes=checkpoint_bytes(params, "bf16"),
    )
    sync = failure_plan(
        failure_model("h100-sxm", async_checkpoint=False),
        num_gpus=GPUS,
        useful_s=np.full(GPUS.shape, 1e7),
        checkpoint_bytes=checkpoint_bytes(params, "bf16"),
    )
    llama3 = PROFILE["checks"]["llama3"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.5, 4.0))
    left.semilogx(GPUS, 100 * plan.goodput, "o-", color="#4c72b0", label="goodput (failures)")
    left.semilogx(
        GPUS,
        100 * plan.goodput / plan.straggler_slowdown,
        "s--",
        color="#dd8452",
        label="goodput / straggler slowdown",
    )
    left.semilogx(
        GPUS, 100 * sync.goodput, ":", color="#4c72b0", label="goodput, synchronous saves"
    )
    left.errorbar(
        [llama3["gpus"]],
        [100 * llama3["effective_training_time"]],
        yerr=[[0], [3]],
        lolims=True,
        fmt="k^",
        label="Llama 3, 54 days: higher than 90%",
    )
    left.set_xlabel("GPUs")
    left.set_ylabel("% of wall time")
    left.set_ylim(50, 101)
    left.grid(True, which="both", alpha=0.3)
    left.legend(loc="lower left", fontsize=8)
    left.set_title("Llama 3 405B on H100: goodput")
    right.loglog(GPUS, plan.mtbf_hours * 60, "o-", color="#c44e52", label="job MTBF")
    right.loglog(
        GPUS, plan.checkpoint_interval_s / 60, "s-", color="#55a868", label="checkpoint interval"
    )
    right.loglog(
        GPUS, sync.checkpoint_interval_s / 60, ":", color="#55a868", label="synchronous saves"
    )
    right.set_xlabel("GPUs")
    right.set_ylabel("minutes")
    right.grid(True, which="both", alpha=0.3)
    right.legend(fontsize=8)
    right.set_title("time between failures and checkpoints")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(OUT, buf.getvalue())
    for n, g, s, i in zip(
        GPUS, plan.goodput, plan.straggler_slowdown, plan.checkpoint_interval_s, strict=True
    ):
        print(f"{int(n):>7} GPUs: goodput {g:.3f}, straggler x{s:.3f}, checkpoint every {i:.0f} s")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
