"""Client updates per second: aisim's vmapped round vs a per-client loop (the FedJAX design).

Part 1 runs each federated task both ways in one process, on the same cohorts (the clients that
aisim's round ``r`` samples), with the same model, data and number of local steps per client:

- FedProx Synthetic(1,1) logistic regression, 1,000 devices (the paper's generator: lognormal
  sizes, so a cohort is heavy-tailed), 100 and 1,000 clients per round, E = 1, B = 10;
- scikit-learn digits MLP 64-200-200-10, IID over 100 and 1,000 clients, all of them per round,
  E = 5, B = 10 (the digits task of the README);
- MNIST-5k 2NN (784-200-200-10), IID over 100 clients, all per round, E = 1, B = 10.

The baseline loops over clients in Python and calls one jitted SGD step per batch, as FedJAX's
``fedavg`` does: numpy shuffles and gathers the batch, and the weighted update is accumulated
with jax ops. It trains the same model and parameters with flax's default Dense gradient, its
faster setting for an unbatched step. Both sides are warm (compiled before timing); each is
timed twice, interleaved, and the faster of its two timings is reported, because the machine is
shared. Each task is built as a 200-round run, so its round is compiled with XLA's defaults, as
a long run's is (a short run's compiles for a fast start: ``fl.build.FAST_COMPILE_FLOPS``).

On a CPU with several cores, a child process repeats the vmapped side with one host device per
core (``--xla_force_host_platform_device_count``), so that the round shards the client axis over
them as it would over GPUs; the ``sharded`` columns compare it with the same one-device loop.

Part 2 is a scale run: a 1M-client Synthetic(1,1) population, 10,000 clients per round,
reporting rounds/s and peak resident memory (``resource.getrusage``), against the loop on a
300-client cohort of the same population.

FedJAX itself, on the same task and timed the same way, is in ``benchmarks/fl_peers.py``; where
a round's time goes per local step, in ``benchmarks/fl_profile.py``.

Usage: ``python benchmarks/fl_throughput.py [--rounds N] [--skip-scale]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fl import Built, ExperimentConfig, build, cross_entropy, make_model, plan_cohort


def vmapped_round_s(b: Built, rounds: int) -> tuple[float, int]:
    """Seconds and kept clients of ``rounds`` warm vmapped rounds (round numbers 1..rounds)."""
    state = dataclasses.replace(b.init_state, round=jnp.int32(1))
    warm, _ = b.run_round(state, b.inputs, b.hyper)  # compile
    jax.block_until_ready(warm)
    t0 = time.perf_counter()
    kept = 0
    for _ in range(rounds):
        state, met = b.run_round(state, b.inputs, b.hyper)
        kept += int(met.clients_kept)
    jax.block_until_ready(state)
    return time.perf_counter() - t0, kept


def cohorts(b: Built, rounds: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(client ids, local steps, weights) of the kept clients of aisim's rounds 1..rounds."""
    plan = jax.jit(lambda s: plan_cohort(b.spec, s, b.inputs, b.hyper))
    out = []
    for r in range(1, rounds + 1):
        p = jax.device_get(plan(dataclasses.replace(b.init_state, round=jnp.int32(r))))
        k = np.asarray(p.kept)
        out.append((np.asarray(p.ids)[k], np.asarray(p.steps)[k], np.asarray(p.weight)[k]))
    return out


def make_loop(b: Built):
    """FedJAX-style round: per client, per batch, one jitted step called from Python.

    The model is aisim's, with flax's default Dense kernel gradient (``outer_product_grad=False``):
    for one client's unbatched step it is as fast or faster (digits MLP: 111 against 145 us)."""
    cfg = b.cfg
    model = make_model(
        b.model.name, b.data.input_shape, b.data.num_classes, outer_product_grad=False
    )
    opt = optax.sgd(cfg.lr)
    x_pool, y_pool = np.asarray(b.data.x_train), np.asarray(b.data.y_train)
    pop = b.data.population
    bsz = cfg.batch_size

    @jax.jit
    def step(params, opt_state, x, y, mask):
        g = jax.grad(lambda p: cross_entropy(model.apply(p, x), y, mask))(params)
        u, opt_state = opt.update(g, opt_state, params)
        return optax.apply_updates(params, u), opt_state

    rng = np.random.default_rng(0)

    def one_round(params, ids, steps, weights):
        total, wsum = jax.tree.map(jnp.zeros_like, params), 0.0
        for cid, n_steps, w in zip(ids, steps, weights, strict=True):
            rows = pop.client_rows(int(cid))
            p, o = params, opt.init(params)
            done = 0
            while done < n_steps:  # epochs: a fresh shuffle, then batches of bsz
                order = rng.permutation(rows)
                for s in range(0, len(order), bsz):
                    if done == n_steps:
                        break
                    r = order[s : s + bsz]
                    mask = np.zeros(bsz, np.float32)
                    mask[: len(r)] = 1.0
                    r = np.pad(r, (0, bsz - len(r)))
                    p, o = step(p, o, x_pool[r], y_pool[r], mask)
                    done += 1
            w = float(w)
            total = jax.tree.map(lambda t, a, a0, w=w: t + w * (a - a0), total, p, params)
            wsum += w
        return jax.tree.map(lambda a, t: a + t / max(wsum, 1e-12), params, total)

    return one_round


def loop_round_s(b: Built, one_round, plans) -> tuple[float, int]:
    """Seconds and clients of the loop over ``plans`` (warmed up on two clients first)."""
    params = b.init_state.params
    ids, steps, w = plans[0]
    jax.block_until_ready(one_round(params, ids[:2], steps[:2], w[:2]))  # compile
    t0 = time.perf_counter()
    clients = 0
    for ids, steps, w in plans:
        params = one_round(params, ids, steps, w)
        clients += len(ids)
    jax.block_until_ready(params)
    return time.perf_counter() - t0, clients


def compare(b: Built, rounds: int, loop_rounds: int, repeats: int = 2) -> tuple[float, float]:
    """Best-of-``repeats`` client updates/s of the vmapped round and of the loop, interleaved."""
    plans = cohorts(b, loop_rounds)
    one_round = make_loop(b)
    v_best, l_best = 0.0, 0.0
    for _ in range(repeats):
        dt, kept = vmapped_round_s(b, rounds)
        v_best = max(v_best, kept / dt)
        dt, clients = loop_round_s(b, one_round, plans)
        l_best = max(l_best, clients / dt)
    return v_best, l_best


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


TASKS = {
    "synthetic(1,1) logreg, 100 of 1,000 clients, E=1": (
        ExperimentConfig(
            dataset="synthetic",
            clients=1000,
            clients_per_round=100,
            local_epochs=1,
            batch_size=10,
            lr=0.01,
            devices="server",
        ),
        3,
    ),
    "synthetic(1,1) logreg, 1,000 of 1,000 clients, E=1": (
        ExperimentConfig(
            dataset="synthetic",
            clients=1000,
            clients_per_round=1000,
            local_epochs=1,
            batch_size=10,
            lr=0.01,
            devices="server",
        ),
        1,
    ),
    "digits MLP, 100 of 100 clients, E=5": (
        ExperimentConfig(
            dataset="digits",
            clients=100,
            clients_per_round=100,
            local_epochs=5,
            batch_size=10,
            lr=0.1,
            devices="server",
        ),
        1,
    ),
    "digits MLP, 1,000 of 1,000 clients, E=5": (
        ExperimentConfig(
            dataset="digits",
            clients=1000,
            clients_per_round=1000,
            local_epochs=5,
            batch_size=10,
            lr=0.1,
            devices="server",
        ),
        1,
    ),
    "mnist-5k 2NN, 100 of 100 clients, E=1": (
        ExperimentConfig(
            dataset="mnist",
            clients=100,
            clients_per_round=100,
            local_epochs=1,
            batch_size=10,
            lr=0.05,
            devices="server",
        ),
        1,
    ),
}


SCALE = ExperimentConfig(
    dataset="synthetic",
    clients=1_000_000,
    clients_per_round=10_000,
    local_epochs=1,
    batch_size=10,
    lr=0.01,
    devices="phone:0.7,laptop:0.2,edge_gpu:0.1",
    memory_budget="4GB",
    eval_every=1000,
)


def sharded_rates(tasks: dict, rounds: int, scale: bool) -> tuple[int, dict]:
    """Vmapped client updates/s with the client axis sharded over one host CPU device per core,
    measured in a child process (XLA's device count is fixed when a process starts). The loop is
    not run there: with several host devices its per-step dispatch is several times slower, so
    it keeps its best setting, the one-device parent process."""
    cores = os.cpu_count() or 1
    if cores < 2 or jax.devices()[0].platform != "cpu":
        return cores, {}
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={cores}")
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--rounds",
        str(rounds),
        "--tasks",
        ",".join(str(i) for i, name in enumerate(TASKS) if name in tasks),
    ] + ([] if scale else ["--skip-scale"])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:  # report and carry on with the one-device columns
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"sharded child process failed (exit {out.returncode}): {tail}")
        return cores, {}
    return cores, json.loads(out.stdout.strip().splitlines()[-1])


def child(tasks: dict, rounds: int, scale: bool) -> None:
    """The child of :func:`sharded_rates`: prints ``{task: client updates/s}`` (best of two) as JSON."""
    configs = {name: cfg for name, (cfg, _) in tasks.items()} | ({"scale": SCALE} if scale else {})
    rates = {}
    for name, cfg in configs.items():
        b = build(cfg)
        assert b.spec.mesh is not None, "the child process should see several host devices"
        rates[name] = max(kept / dt for dt, kept in (vmapped_round_s(b, rounds) for _ in range(2)))
    print(json.dumps(rates))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="timed vmapped rounds per repeat")
    ap.add_argument("--skip-scale", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tasks", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    tasks = TASKS
    if args.tasks is not None:
        chosen = {int(i) for i in args.tasks.split(",")}
        tasks = {k: v for i, (k, v) in enumerate(TASKS.items()) if i in chosen}
    quick = os.environ.get("AISIM_QUICK") == "1"
    if quick:  # smoke-test sizes (the README test); not for numbers
        name, (cfg, _) = next(iter(TASKS.items()))
        # one loop round, one repeat, built as the one-round run it is (fl.build compiles a
        # short run's round for a fast start; the tasks are 200-round runs, XLA's defaults)
        tasks = {name: (dataclasses.replace(cfg, rounds=1), 1)}
        args.rounds, args.skip_scale = 1, True
    if args.child:
        child(tasks, args.rounds, not args.skip_scale)
        return
    cores, sharded = (1, {}) if quick else sharded_rates(tasks, args.rounds, not args.skip_scale)
    print(
        f"jax {jax.__version__} on {jax.devices()[0].platform} x{len(jax.devices())}"
        + (
            f"; 'sharded': the vmapped round in a child process with {cores} host devices, "
            "one per core"
            if sharded
            else ""
        )
    )
    extra = f" {'sharded':>12} {'speed-up':>9}" if sharded else ""
    print(
        f"{'task (B=10, same cohorts and local steps)':<54} {'chunk':>6} {'vmapped':>12} "
        f"{'loop':>10} {'speed-up':>9}{extra}"
    )

    def row(name, chunk, v, loop, key):
        tail = f" {sharded[key]:>10.1f}/s {sharded[key] / loop:>8.1f}x" if key in sharded else ""
        print(
            f"{name:<54} {chunk:>6} {v:>10.1f}/s {loop:>8.1f}/s {v / loop:>8.1f}x{tail}", flush=True
        )

    for name, (cfg, loop_rounds) in tasks.items():
        b = build(cfg)
        v, loop = compare(b, args.rounds, loop_rounds, repeats=1 if quick else 2)
        row(name, b.spec.chunk, v, loop, name)
    if args.skip_scale:
        return
    cfg = SCALE  # the scale run of part 2
    t0 = time.perf_counter()
    b = build(cfg)
    setup_s = time.perf_counter() - t0
    state, _ = b.run_round(b.init_state, b.inputs, b.hyper)
    jax.block_until_ready(state)
    n = max(args.rounds, 3)
    t0 = time.perf_counter()
    sim_s = 0.0
    kept = 0
    for _ in range(n):
        state, met = b.run_round(state, b.inputs, b.hyper)
        sim_s += float(met.round_time_s)
        kept += int(met.clients_kept)
    jax.block_until_ready(state)
    dt = time.perf_counter() - t0
    loss, acc = b.evaluate(state.params, *b.eval_sets[1])
    pop = b.data.population
    print(
        f"scale: {pop.num_clients:,} clients (population arrays "
        f"{(pop.starts.nbytes + pop.sizes.nbytes) / 1e6:.0f} MB, pool {len(pop.order):,} rows), "
        f"{cfg.clients_per_round:,} clients/round in chunks of up to {b.spec.chunk:,}: "
        f"{n / dt:.2f} rounds/s, {kept / dt:,.0f} client updates/s, "
        f"peak RSS {peak_rss_gb():.2f} GB (setup {setup_s:.1f} s); "
        f"simulated {sim_s / n:.1f} s/round; test accuracy after {n + 1} rounds {float(acc):.3f}"
    )
    ids, steps, w = cohorts(b, 1)[0]
    loop_s, clients = loop_round_s(b, make_loop(b), [(ids[:300], steps[:300], w[:300])])
    row(
        "scale task, same population: per-client loop (300)",
        b.spec.chunk,
        kept / dt,
        clients / loop_s,
        "scale",
    )


if __name__ == "__main__":
    main()
