"""Throughput of the whole-grid strategy search (issue 3), printed from one run.

Measures, after compilation:
  1. configurations per second of the jitted grid evaluation (``evaluate_grid``: one
     ``jit(vmap(step_time))``) on the GPT-3 175B / 1024 x A100-80GB grid tiled to ``--rows`` rows,
     with the arrays already on the device, with all outputs and with the on-device top-k
     reduction that ``aisim perf grid`` runs (which also gathers the chosen rows' breakdowns);
  2. the compile options of small grids (``perfmodel.search.evaluate.compile_options``): the CLI grid's
     bucket compiled and run with XLA's defaults and with the fast compilation, and the grid size
     up to which the fast compilation pays;
  3. the same step function called one strategy at a time from a Python loop (jitted, on a
     sample), and the ratio;
  4. the per-configuration rate of a one-at-a-time evaluator: Calculon's ~8 ms per
     configuration, the figure quoted in issue 3 (not measured here);
  5. the wall time of the whole ``aisim perf grid --model gpt3-175B --gpus 1024
     --global-batch 1536`` search, the first call (with compilation) and the next (compiled);
  6. the command line as a user runs it cold (a fresh process, an empty compilation cache, and
     aisim's bytecode written, as after any first run): the default ``aisim perf grid`` and a
     DeepSeek-V3 grid on 2048 H100, against a fresh process that imports JAX and runs one
     jitted op (the floor of any JAX command).

Usage: ``python benchmarks/grid_throughput.py [--rows 2097152] [--loop 300] [--devices N]``
(``--devices N`` splits the host CPU into N JAX devices, so the sharded grid uses N cores).
``AISIM_QUICK=1`` shrinks the defaults to smoke-test sizes (the README test), and with ``--devices`` skips
part 6; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CALCULON_S_PER_CONFIG = 8e-3  # issue 3: "Calculon takes about 8 ms per configuration"


def main() -> None:
    quick = (
        os.environ.get("AISIM_QUICK") == "1"
    )  # smoke-test sizes (the README test); not for numbers
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--rows",
        type=int,
        default=1 << (16 if quick else 21),
        help="grid rows for the throughput measurement",
    )
    ap.add_argument(
        "--loop",
        type=int,
        default=20 if quick else 300,
        help="strategies in the one-at-a-time Python loop",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1 if quick else 5,
        help="timed repeats (the best is reported)",
    )
    ap.add_argument(
        "--devices", type=int, default=0, help="split the host CPU into this many JAX devices"
    )
    args = ap.parse_args()
    if args.devices:
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + f" --xla_force_host_platform_device_count={args.devices}"
        ).strip()
    sys.path.insert(0, str(ROOT))

    import jax
    import numpy as np

    from perfmodel import (
        StrategyGrid,
        enumerate_strategies,
        evaluate_grid,
        load_hardware,
        load_model,
        step_time,
        sweep,
    )

    # the on-device reduction's parts and the compile options, timed one by one (internals,
    # not public API)
    from perfmodel.search import evaluate as ev
    from perfmodel.search import reduce as srch
    from perfmodel.search.evaluate import _evaluate_grid

    m, hw = load_model("gpt3-175b"), load_hardware("a100-80gb")
    spec = m.spec
    grid = enumerate_strategies(
        num_layers=96,
        num_heads=96,
        num_kv_heads=96,
        num_gpus=1024,
        global_batch=1536,
        gpus_per_node=8,
    )
    reps = -(-args.rows // len(grid))
    big = StrategyGrid({k: np.tile(v, reps)[: args.rows] for k, v in grid.columns.items()}, {})
    print(
        f"jax {jax.__version__}, backend {jax.default_backend()}, {len(jax.devices())} device(s), "
        f"{os.cpu_count()} CPU core(s)"
    )
    print(
        f"grid: GPT-3 175B, 1024 x A100-80GB, global batch 1536: {len(grid)} strategies; "
        f"tiled to {args.rows} rows for the throughput measurement"
    )

    def best_of(fn):
        jax.block_until_ready(fn())  # warm: the first call after compiling also allocates
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            jax.block_until_ready(fn())
            times.append(time.perf_counter() - t)
        return min(times)

    # 1a. all outputs, arrays already on the device (evaluate_grid places them; reuse them)
    sharding = jax.sharding.NamedSharding(
        jax.sharding.Mesh(np.asarray(jax.devices()), ("n",)), jax.sharding.PartitionSpec("n")
    )
    placed = jax.tree.map(lambda a: jax.device_put(a, sharding), big.strategy())
    t = time.perf_counter()
    outputs = len(
        jax.tree.leaves(
            jax.block_until_ready(
                _evaluate_grid(step_time, None, spec, hw.spec, hw.constants, placed, None, ())
            )
        )
    )
    compile_full = time.perf_counter() - t
    dt_full = best_of(
        lambda: _evaluate_grid(step_time, None, spec, hw.spec, hw.constants, placed, None, ())
    )
    # 1b. evaluation + on-device top-k / per-point best / Pareto, as `aisim perf grid` runs it
    point, points = srch.sweep_points(big)
    reduce = srch._reducer(10, len(points), 256, "throughput")
    zero3 = (big.columns["zero_stage"] == 3).astype(np.float32)
    row_args = tuple(jax.device_put(a, sharding) for a in (point.astype(np.float32), zero3))
    n = jax.numpy.asarray(len(big), jax.numpy.int32)
    t = time.perf_counter()
    jax.block_until_ready(
        _evaluate_grid(step_time, reduce, spec, hw.spec, hw.constants, placed, n, row_args)
    )
    compile_red = time.perf_counter() - t
    dt_red = best_of(
        lambda: _evaluate_grid(step_time, reduce, spec, hw.spec, hw.constants, placed, n, row_args)
    )
    reduce_topk = srch._reducer(
        10, len(points), 0, "throughput"
    )  # the same without the Pareto sort
    jax.block_until_ready(
        _evaluate_grid(step_time, reduce_topk, spec, hw.spec, hw.constants, placed, n, row_args)
    )
    dt_topk = best_of(
        lambda: _evaluate_grid(
            step_time, reduce_topk, spec, hw.spec, hw.constants, placed, n, row_args
        )
    )
    # 1c. from numpy columns, including the host -> device transfer of the grid
    dt_host = best_of(lambda: evaluate_grid(spec, hw.spec, hw.constants, big.strategy()))

    # 2. the compile options for small grids (perfmodel.search.evaluate.compile_options): the CLI's
    # grid padded to its bucket, compiled and run with XLA's defaults and with the fast compile
    small_rows = srch.bucket_rows(len(grid))
    small = StrategyGrid(
        {k: np.resize(v, small_rows) for k, v in grid.columns.items()}, {}
    ).strategy()
    small_point = np.resize(srch.sweep_points(grid)[0], small_rows).astype(np.float32)
    small_args = (
        spec,
        hw.spec,
        hw.constants,
        small,
        jax.numpy.asarray(len(grid), jax.numpy.int32),
        (small_point, np.zeros(small_rows, np.float32)),
    )
    reduce_small = srch._reducer(10, len(srch.sweep_points(grid)[1]), 256, "throughput")
    trade = {}
    for label, options in (("XLA defaults", None), ("fast compile", ev._FAST_COMPILE)):
        jitted = jax.jit(ev._evaluate_grid_impl, static_argnums=(0, 1), compiler_options=options)
        t = time.perf_counter()
        jax.block_until_ready(jitted(step_time, reduce_small, *small_args))
        compile_s = time.perf_counter() - t
        run_s = best_of(lambda j=jitted: j(step_time, reduce_small, *small_args))
        trade[label] = (compile_s, run_s)

    # 3. one at a time from Python, the same step function jitted
    one = jax.jit(step_time)
    rng = np.random.default_rng(0)
    every = grid.strategy()  # the grid's rows, with its stack and scope (one compiled program)
    sample = [
        jax.tree.map(lambda a, i=i: a[i], every)
        for i in rng.choice(len(grid), size=args.loop, replace=False)
    ]
    jax.block_until_ready(one(spec, hw.spec, hw.constants, sample[0]))
    t = time.perf_counter()
    for s in sample:
        jax.block_until_ready(one(spec, hw.spec, hw.constants, s).step_time_s)
    dt_loop = (time.perf_counter() - t) / len(sample)

    rate = {
        "full": args.rows / dt_full,
        "reduced": args.rows / dt_red,
        "topk": args.rows / dt_topk,
        "host": args.rows / dt_host,
    }
    print()
    print(f"grid evaluation after compilation (best of {args.repeats}):")
    print(
        f"  all {outputs} outputs, arrays on device      {rate['full'] / 1e6:8.2f} M configs/s  "
        f"({dt_full * 1e3:.0f} ms for {args.rows} rows; compile {compile_full:.2f} s)"
    )
    print(
        f"  + on-device top-k, best per point     {rate['topk'] / 1e6:8.2f} M configs/s  ({dt_topk * 1e3:.0f} ms)"
    )
    print(
        f"  + top-k, best per point, Pareto sort  {rate['reduced'] / 1e6:8.2f} M configs/s  "
        f"({dt_red * 1e3:.0f} ms; compile {compile_red:.2f} s)"
    )
    print(
        f"  from numpy, incl. host->device copy   {rate['host'] / 1e6:8.2f} M configs/s  ({dt_host * 1e3:.0f} ms)"
    )
    print(f"compile options for a {small_rows}-row grid (the search below), compile + run:")
    for label, (compile_s, run_s) in trade.items():
        print(
            f"  {label:<14} compile {compile_s:6.2f} s, run {run_s * 1e3:7.1f} ms "
            f"({run_s / small_rows * 1e6:.2f} us/row)"
        )
    (c_def, r_def), (c_fast, r_fast) = trade["XLA defaults"], trade["fast compile"]
    per_row = (r_fast - r_def) / small_rows
    if per_row > 0:
        print(
            f"  the fast compile saves {c_def - c_fast:.2f} s and costs {per_row * 1e6:.2f} us/row: "
            f"it pays up to ~{(c_def - c_fast) / per_row:,.0f} rows (used up to "
            f"{ev.FAST_COMPILE_ROWS:,})"
        )
    print(
        f"python loop, jit(step_time) per call    {1 / dt_loop:8.0f} configs/s  ({dt_loop * 1e6:.0f} us each, "
        f"{args.loop} strategies)"
    )
    print(f"  grid (all outputs) / python loop      {rate['full'] * dt_loop:8.0f} x")
    print(
        f"Calculon one at a time (issue figure)   {1 / CALCULON_S_PER_CONFIG:8.0f} configs/s  (~8 ms each, quoted)"
    )
    print(f"  grid (all outputs) / Calculon         {rate['full'] * CALCULON_S_PER_CONFIG:8.0f} x")

    # 5. the whole search, as the CLI runs it (enumerate, evaluate, reduce, frames)
    t = time.perf_counter()
    res = sweep("gpt3-175B", num_gpus=1024, global_batch=1536)
    first = time.perf_counter() - t
    steady = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        res = sweep("gpt3-175B", num_gpus=1024, global_batch=1536)
        steady.append(time.perf_counter() - t)
    b = res.best
    print()
    print("aisim perf grid --model gpt3-175B --gpus 1024 --global-batch 1536:")
    print(
        f"  {res.evaluated} strategies evaluated, {res.feasible} feasible; best dp{b['dp']} tp{b['tp']} "
        f"pp{b['pp']} mbs{b['micro_batch_size']} {b['schedule']} v{b['interleave']} zero{b['zero_stage']} "
        f"{b['recompute']}: {b['tokens_per_s']:.4g} tokens/s, MFU {100 * b['mfu']:.1f}%"
    )
    print(f"  first call (compile + search)  {first:6.2f} s")
    print(
        f"  compiled search (best of {args.repeats})    {min(steady):6.3f} s  -> compilation ~ "
        f"{first - min(steady):.2f} s"
    )

    if quick and args.devices:
        return  # the cold commands start fresh processes, whatever --devices says: the smoke
        # test (AISIM_QUICK=1) times them once, in its run without --devices
    cold_commands(1 if quick else 3)


COLD = {
    "aisim perf grid (GPT-3 175B, 1024 x A100)": ["perf", "grid"],
    "aisim perf grid --model deepseek-v3 --hardware h100-sxm --gpus 2048 --global-batch 15360": [
        "perf", "grid", "--model", "deepseek-v3", "--hardware", "h100-sxm", "--gpus", "2048",
        "--global-batch", "15360",
    ],
}  # fmt: skip
JAX_FLOOR = (
    "import jax, jax.numpy as jnp; jax.jit(lambda x: x + 1)(jnp.ones(3)).block_until_ready()"
)


def _cold_s(args: list[str], repeats: int) -> float:
    """Best wall time of ``python ARGS`` in a fresh process with an empty compilation cache."""
    best = float("inf")
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=cache)
            t = time.perf_counter()
            subprocess.run([sys.executable, *args], env=env, check=True, capture_output=True)
            best = min(best, time.perf_counter() - t)
    return best


def _write_bytecode() -> None:
    """Compile aisim's packages to ``__pycache__`` as Python does on a first run, so that a
    machine with ``PYTHONDONTWRITEBYTECODE`` set does not time compiling the sources."""
    import compileall

    for pkg in ("aisim", "perfmodel", "fl", "calibration", "collab", "simbase"):
        compileall.compile_dir(ROOT / pkg, quiet=1)


def cold_commands(repeats: int) -> None:
    """Part 6: the commands as a user starts them, cold (best of ``repeats``)."""
    _write_bytecode()
    floor = _cold_s(["-c", JAX_FLOOR], repeats)
    print()
    print(f"cold command line (fresh process, empty compilation cache; best of {repeats}):")
    print(f"  python: import jax, one jitted op        {floor:6.2f} s")
    for name, args in COLD.items():
        t = _cold_s(["-m", "aisim", *args], repeats)
        print(f"  {name}")
        print(f"  {'':40} {t:6.2f} s  ({t / floor:.1f} x the JAX floor)")


if __name__ == "__main__":
    main()
