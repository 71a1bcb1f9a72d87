"""Where one aisim round's time goes, per local step: fixed cost, real steps, masked steps.

For each task of :mod:`fl_peers` (all clients every round, E = 1, B = 10) this times warm rounds
of the jitted round with the local step cap (``Hyper.max_local_steps``, an array leaf, so no
recompilation) at 0 steps (the round without training: sampling, planning, bucketing, the
aggregation and the server step, plus one jit dispatch), 1 step and no cap, and counts the steps
the engine runs: every client of a chunk runs that chunk's largest step count, shorter clients
masked. ``per step`` is the round's time above the fixed cost divided by the steps run; each
timing is the best of three. It then
times the same rounds through :func:`fl.simulate` (the metrics read at each evaluation, every
``eval_every`` rounds, and at the end) to show what the CLI's wall time adds.

Usage: ``python benchmarks/fl_profile.py [--rounds N]`` (``AISIM_QUICK=1``: the first task for 2
rounds, a smoke test whose numbers mean nothing)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from fl_peers import TASKS  # noqa: E402

from fl import build, plan_cohort, simulate  # noqa: E402
from fl.build import padded_steps  # noqa: E402


def timed(b, hyper, rounds: int, repeats: int = 3) -> float:
    """Seconds per warm round (no host sync between rounds), the best of ``repeats`` runs of
    ``rounds`` rounds, because a shared machine only ever adds time."""
    state, _ = b.run_round(b.init_state, b.inputs, hyper)
    jax.block_until_ready(state)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(rounds):
            state, _ = b.run_round(state, b.inputs, hyper)
        jax.block_until_ready(state)
        best = min(best, (time.perf_counter() - t0) / rounds)
    return best


def steps_run(b) -> tuple[int, int]:
    """(real local steps, steps the chunks run including masked ones) of round 1's cohort."""
    plan = jax.device_get(
        jax.jit(lambda s: plan_cohort(b.spec, s, b.inputs, b.hyper))(b.init_state)
    )
    steps = np.sort(np.asarray(plan.steps))[::-1]
    run = padded_steps(b.spec, steps)
    return int(steps.sum()), run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    quick = os.environ.get("AISIM_QUICK") == "1"  # the docs' smoke test
    if quick:
        args.rounds = 2
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} x{len(jax.devices())}")
    for name, (cfg, _, _) in list(TASKS.items())[: 1 if quick else None]:
        b = build(cfg)
        real, run = steps_run(b)
        t = {
            cap: timed(b, dataclasses.replace(b.hyper, max_local_steps=jnp.int32(cap)), args.rounds)
            for cap in (0, 1, 2**30)
        }
        fixed, full = t[0], t[2**30]
        print(f"{name}: chunks {b.spec.segments}")
        print(
            f"  round {full * 1e3:.2f} ms: fixed {fixed * 1e3:.2f} ms, training "
            f"{(full - fixed) * 1e3:.2f} ms for {real} local steps ({run} run, "
            f"{run - real} of them masked): {(full - fixed) / run * 1e6:.2f} us per step run, "
            f"{(full - fixed) / real * 1e6:.2f} us per real step; "
            f"one step each: {(t[1] - fixed) / b.spec.slots * 1e6:.2f} us per client"
        )
        for every in (1, args.rounds):
            sim_cfg = dataclasses.replace(cfg, rounds=args.rounds, eval_every=every)
            simulate(sim_cfg, stop_after=1)  # compiles the program the timed run uses
            s = simulate(sim_cfg).summary
            print(
                f"  fl.simulate, eval every {every:>3} rounds: "
                f"{s['wall_time_s'] / args.rounds * 1e3:.2f} ms per round, client_updates_per_s "
                f"{s['client_updates_per_s']:.0f}"
            )


if __name__ == "__main__":
    main()
