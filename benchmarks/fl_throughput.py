"""Client updates per second: aisim's vmapped round vs a per-client loop (the FedJAX design).

Part 1 runs the same federated task both ways in one process: MNIST-5k 2NN (IID, 100 clients,
E = 1, B = 10) and FedProx Synthetic(1,1) logistic regression (30 devices, E = 1, B = 10).
The baseline loops over clients in Python and calls one jitted SGD step per batch, as FedJAX's
``fedavg`` does. Part 2 is a scale run: a 1M-client Synthetic(1,1) population, 10,000 clients per
round, reporting rounds/s and peak resident memory (``resource.getrusage``).

Usage: ``python benchmarks/fl_throughput.py [--rounds N] [--skip-scale]``
"""

from __future__ import annotations

import argparse
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fl.config import ExperimentConfig
from fl.models import cross_entropy
from fl.simulation import build


def vmapped_updates_per_s(cfg: ExperimentConfig, rounds: int) -> tuple[float, object]:
    b = build(cfg)
    state, _ = b.run_round(b.init_state, b.inputs, b.hyper)  # compile
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    kept = 0
    for _ in range(rounds):
        state, met = b.run_round(state, b.inputs, b.hyper)
        kept += int(met.clients_kept)
    jax.block_until_ready(state)
    return kept / (time.perf_counter() - t0), b


def loop_updates_per_s(b, rounds: int, cohort: int | None = None) -> float:
    """FedJAX-style: per round, per client, per batch one jitted step called from Python."""
    model, cfg = b.model, b.cfg
    opt = optax.sgd(cfg.lr)
    x_pool, y_pool = np.asarray(b.data.x_train), np.asarray(b.data.y_train)
    pop = b.data.population
    bsz = cfg.batch_size
    cohort = cohort or cfg.clients_per_round
    cap = cfg.max_local_steps or 2**30

    @jax.jit
    def step(params, opt_state, x, y, mask):
        g = jax.grad(lambda p: cross_entropy(model.apply(p, x), y, mask))(params)
        u, opt_state = opt.update(g, opt_state, params)
        return optax.apply_updates(params, u), opt_state

    rng = np.random.default_rng(0)
    params = b.init_state.params

    def one_round(params):
        ids = rng.choice(pop.num_clients, cohort, replace=False)
        total, wsum = jax.tree.map(jnp.zeros_like, params), 0.0
        for cid in ids:
            rows = pop.client_rows(int(cid))
            p, o = params, opt.init(params)
            steps = 0
            for _ in range(cfg.local_epochs):
                rows = rng.permutation(rows)
                for s in range(0, len(rows), bsz):
                    if steps == cap:
                        break
                    steps += 1
                    r = rows[s : s + bsz]
                    mask = np.zeros(bsz, np.float32)
                    mask[: len(r)] = 1.0
                    r = np.pad(r, (0, bsz - len(r)))
                    p, o = step(p, o, x_pool[r], y_pool[r], mask)
            w = float(len(rows))
            total = jax.tree.map(lambda t, a, a0, w=w: t + w * (a - a0), total, p, params)
            wsum += w
        return jax.tree.map(lambda a, t: a + t / wsum, params, total)

    params = one_round(params)  # compile
    jax.block_until_ready(params)
    t0 = time.perf_counter()
    for _ in range(rounds):
        params = one_round(params)
    jax.block_until_ready(params)
    return rounds * cohort / (time.perf_counter() - t0)


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-scale", action="store_true")
    args = ap.parse_args()
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} x{len(jax.devices())}")
    tasks = {
        "mnist-5k 2NN, 100 clients/round, E=1, B=10": ExperimentConfig(
            dataset="mnist", clients=100, clients_per_round=100, local_epochs=1,
            batch_size=10, lr=0.05, devices="server"),
        "synthetic(1,1) logreg, 30 clients/round, E=1, B=10": ExperimentConfig(
            dataset="synthetic", clients=30, clients_per_round=30, local_epochs=1,
            batch_size=10, lr=0.01, devices="server"),
    }
    print(f"{'task':<52} {'vmapped':>12} {'loop':>12} {'speed-up':>9}")
    for name, cfg in tasks.items():
        v, b = vmapped_updates_per_s(cfg, args.rounds)
        loop = loop_updates_per_s(b, max(1, args.rounds // 3))
        print(f"{name:<52} {v:>10.1f}/s {loop:>10.1f}/s {v / loop:>8.1f}x", flush=True)
    if args.skip_scale:
        return
    cfg = ExperimentConfig(
        dataset="synthetic", clients=1_000_000, clients_per_round=10_000, local_epochs=1,
        batch_size=10, lr=0.01, devices="phone:0.7,laptop:0.2,edge_gpu:0.1",
        memory_budget="4GB", eval_every=1000,
    )
    t0 = time.perf_counter()
    b = build(cfg)
    setup_s = time.perf_counter() - t0
    state, _ = b.run_round(b.init_state, b.inputs, b.hyper)
    jax.block_until_ready(state)
    n = max(args.rounds, 3)
    t0 = time.perf_counter()
    sim_s = 0.0
    for _ in range(n):
        state, met = b.run_round(state, b.inputs, b.hyper)
        sim_s += float(met.round_time_s)
    jax.block_until_ready(state)
    dt = time.perf_counter() - t0
    loss, acc = b.evaluate(state.params, *b.eval_sets[1])
    pop = b.data.population
    print(
        f"scale: {pop.num_clients:,} clients (population arrays "
        f"{(pop.starts.nbytes + pop.sizes.nbytes) / 1e6:.0f} MB, pool {len(pop.order):,} rows), "
        f"{cfg.clients_per_round:,} clients/round in chunks of {b.spec.chunk:,}: "
        f"{n / dt:.2f} rounds/s, {n * cfg.clients_per_round / dt:,.0f} client updates/s, "
        f"peak RSS {peak_rss_gb():.2f} GB (setup {setup_s:.1f} s); "
        f"simulated {sim_s / n:.1f} s/round; test accuracy after {n + 1} rounds {float(acc):.3f}"
    )
    loop = loop_updates_per_s(b, 1, cohort=300)
    v = n * cfg.clients_per_round / dt
    print(f"{'scale task, same population: per-client loop':<52} {v:>10.1f}/s {loop:>10.1f}/s "
          f"{v / loop:>8.1f}x")


if __name__ == "__main__":
    main()
