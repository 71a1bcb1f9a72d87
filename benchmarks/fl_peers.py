"""aisim against FedJAX, Flower and pfl-research on the same tasks, trained and timed the same way.

The tasks: scikit-learn digits, Dirichlet(0.5) label skew over 100 clients (aisim's
per-class partition, the same clients on both sides), all 100 clients every round, the MLP
64-200-200-10, FedAvg with E = 1 local epoch, B = 10, client SGD lr 0.1, server lr 1, 300 rounds;
and FedProx's Synthetic(1,1) over 1,000 devices (lognormal sizes), all of them every round,
multinomial logistic regression, E = 1, B = 10, lr 0.01, 10 rounds.
Both sides start from their own initialisation, run one untimed round (compilation), then
``rounds - 1`` timed rounds, and block on the final model; client updates per second are
clients trained / timed seconds, and the test accuracy is that of the final model on the same
360 test images. On a CPU with several cores, a child process repeats aisim's run with one host
device per core (``--xla_force_host_platform_device_count``), so that its round shards the client
axis over the cores, as ``aisim fl run`` does under that flag (row ``aisim Nd``); FedJAX keeps
one device (its jit backend runs one client at a time on one core; its pmap backend calls
``jax.device_put_sharded``, which JAX has removed), and Flower runs one Ray actor per core.

FedJAX (``pip install fedjax dm-haiku tabulate jmp --no-deps``; not a dependency of aisim) is
written for older JAX: :func:`fedjax_shim` puts back the ``jax.tree_*`` aliases that JAX 0.6
removed, here, not in aisim. Flower (``flwr[simulation]``, with Ray) pins ``typer``, ``rich``
and ``protobuf`` at other versions than aisim's, so it runs in its own interpreter:
``--flower-python PATH`` (or ``AISIM_FLOWER_PYTHON``) runs ``fl_peers_flower.py`` there on the
same clients, written to a temporary .npz, and timed the same way, for as many rounds as the
others unless ``--flower-rounds`` says fewer (its row says how many, and its accuracy is that
after its own rounds). pfl-research (``pfl[pytorch]`` with PyTorch, its best single-process
setting; it pins ``dp-accounting`` below aisim's) runs the same way in its own interpreter:
``--pfl-python PATH`` (or ``AISIM_PFL_PYTHON``) runs ``fl_peers_pfl.py`` there, for
``--pfl-rounds`` rounds (default: as many as the others).

The row ``aisim fl run`` is what users run: the command line in a child process
(``aisim fl run ... --eval-every R --json``, one device, evaluation at the end), its summary's
``client_updates_per_s`` (training time without the first round, which compiles) against the
bare jitted round of row ``aisim``.

Usage: ``python benchmarks/fl_peers.py [--rounds N] [--quick] [--flower-python PATH]
[--flower-rounds N] [--pfl-python PATH] [--pfl-rounds N]`` (``AISIM_QUICK=1`` = ``--quick``:
the first task only, for 4 rounds, a smoke test whose numbers mean nothing)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from fl import ExperimentConfig, build

DIGITS = ExperimentConfig(
    dataset="digits",
    clients=100,
    clients_per_round=100,
    partition="dirichlet",
    dirichlet_alpha=0.5,
    local_epochs=1,
    batch_size=10,
    lr=0.1,
    devices="server",
)
SYNTHETIC = ExperimentConfig(
    dataset="synthetic",
    clients=1000,
    clients_per_round=1000,
    local_epochs=1,
    batch_size=10,
    lr=0.01,
    devices="server",
)
TASKS = {  # name: (config, rounds, quick rounds)
    "digits MLP 64-200-200-10, Dirichlet(0.5), 100 of 100 clients": (DIGITS, 300, 4),
    "synthetic(1,1) logreg, 1,000 of 1,000 clients": (SYNTHETIC, 10, 2),
}
FLOWER_SCRIPT = Path(__file__).with_name("fl_peers_flower.py")
PFL_SCRIPT = Path(__file__).with_name("fl_peers_pfl.py")
PFL_HOWTO = (
    "python3 -m venv ../pfl-venv && ../pfl-venv/bin/pip install torch 'pfl[pytorch]' "
    "(outside the repository), then --pfl-python ../pfl-venv/bin/python"
)
FLOWER_HOWTO = (
    'python3 -m venv ../flwr-venv && ../flwr-venv/bin/pip install "flwr[simulation]" jax '
    "numpy scikit-learn (outside the repository), then --flower-python ../flwr-venv/bin/python"
)


def fedjax_shim() -> None:
    """The ``jax.tree_*`` and ``jax.tree_util.tree_multimap`` names FedJAX 0.0.17 calls."""
    for name in ("map", "leaves", "flatten", "unflatten", "structure", "reduce"):
        if not hasattr(jax, "tree_" + name):
            setattr(jax, "tree_" + name, getattr(jax.tree, name))
    if not hasattr(jax.tree_util, "tree_multimap"):
        jax.tree_util.tree_multimap = jax.tree.map


@dataclasses.dataclass
class Result:
    name: str
    updates_per_s: float
    accuracy: float
    timed_s: float
    rounds: int = 0


def run_aisim(cfg: ExperimentConfig, rounds: int) -> Result:
    """aisim's jitted round, ``rounds`` rounds (the first untimed)."""
    b = build(dataclasses.replace(cfg, rounds=rounds))
    state, met = b.run_round(b.init_state, b.inputs, b.hyper)  # compiles
    jax.block_until_ready(state)
    kept = 0
    t0 = time.perf_counter()
    for _ in range(rounds - 1):
        state, met = b.run_round(state, b.inputs, b.hyper)
        kept += met.clients_kept  # stays on the device: no host sync per round
    jax.block_until_ready(state)
    dt = time.perf_counter() - t0
    _, acc = b.evaluate(state.params, *b.eval_sets[1])
    return Result("aisim", int(kept) / dt, float(acc), dt, rounds)


def run_aisim_sharded(task: str, rounds: int) -> Result | None:
    """:func:`run_aisim` in a child process with one host device per core (XLA's device count is
    fixed when a process starts), or ``None`` on a one-core or non-CPU host."""
    cores = os.cpu_count() or 1
    if cores < 2 or jax.devices()[0].platform != "cpu":
        return None
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={cores}")
    cmd = [
        sys.executable,
        __file__,
        "--child",
        str(list(TASKS).index(task)),
        "--rounds",
        str(rounds),
    ]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()] or ["no output"]
        print(f"aisim {cores}d: child process failed (exit {r.returncode}): {lines[-1]}")
        return None
    res = json.loads(r.stdout.strip().splitlines()[-1])
    return Result(f"aisim {cores}d", res["updates_per_s"], res["accuracy"], res["timed_s"], rounds)


def child(task_index: int, rounds: int) -> None:
    """The child of :func:`run_aisim_sharded`: one task's :func:`run_aisim` as a JSON line."""
    cfg = list(TASKS.values())[task_index][0]
    assert len(jax.devices()) > 1, "the child process should see several host devices"
    r = run_aisim(cfg, rounds)
    print(json.dumps(dataclasses.asdict(r)))


def run_fedjax(cfg: ExperimentConfig, rounds: int) -> Result:
    """FedJAX's ``fed_avg`` on the same clients (a haiku MLP of the same shape)."""
    fedjax_shim()
    import fedjax
    import haiku as hk
    from fedjax.algorithms import fed_avg

    b = build(cfg)
    ds, pop = b.data, b.data.population
    clients = {}
    for k in range(pop.num_clients):
        r = pop.client_rows(k)
        clients[k] = {"x": ds.x_train[r], "y": ds.y_train[r]}
    data = fedjax.InMemoryFederatedData(clients)

    hidden = [200, 200] if b.model.name in ("mlp", "2nn") else []

    def forward(batch):
        return hk.nets.MLP([*hidden, ds.num_classes])(batch["x"])

    model = fedjax.create_model_from_haiku(
        transformed_forward_pass=hk.transform(forward),
        sample_batch={"x": np.zeros((1, *ds.input_shape), np.float32)},
        train_loss=lambda batch, preds: fedjax.metrics.unreduced_cross_entropy_loss(
            batch["y"], preds
        ),
        eval_metrics={"accuracy": fedjax.metrics.Accuracy()},
    )
    algorithm = fed_avg.federated_averaging(
        fedjax.model_grad(model),
        fedjax.optimizers.sgd(cfg.lr),
        fedjax.optimizers.sgd(1.0),
        fedjax.ShuffleRepeatBatchHParams(
            batch_size=cfg.batch_size, num_epochs=cfg.local_epochs, drop_remainder=False
        ),
    )
    state = algorithm.init(model.init(jax.random.PRNGKey(cfg.seed)))
    key = jax.random.PRNGKey(cfg.seed + 1)
    ids = list(range(pop.num_clients))

    def one_round(state, r):
        cohort = [(i, data.get_client(i), jax.random.fold_in(key, r * len(ids) + i)) for i in ids]
        state, _ = algorithm.apply(state, cohort)
        return state

    state = one_round(state, 0)  # compiles every batch shape
    jax.block_until_ready(state.params)
    t0 = time.perf_counter()
    for r in range(1, rounds):
        state = one_round(state, r)
    jax.block_until_ready(state.params)
    dt = time.perf_counter() - t0
    test = fedjax.ClientDataset({"x": ds.x_test, "y": ds.y_test})
    acc = fedjax.evaluate_model(model, state.params, test.padded_batch(batch_size=512))
    return Result("fedjax", len(ids) * (rounds - 1) / dt, float(acc["accuracy"]), dt, rounds)


def write_partition(cfg: ExperimentConfig, path: Path) -> None:
    """The task's clients, test set and hyper-parameters as an .npz that Flower's side reads."""
    b = build(cfg)
    ds, pop = b.data, b.data.population
    rows = [pop.client_rows(k) for k in range(pop.num_clients)]
    np.savez(
        path,
        x_train=np.asarray(ds.x_train, np.float32),
        y_train=np.asarray(ds.y_train, np.int32),
        rows=np.concatenate(rows).astype(np.int64),
        offsets=np.cumsum([0] + [len(r) for r in rows]).astype(np.int64),
        x_test=np.asarray(ds.x_test, np.float32),
        y_test=np.asarray(ds.y_test, np.int32),
        hidden=np.array([200, 200] if b.model.name in ("mlp", "2nn") else [], np.int64),
        num_classes=ds.num_classes,
        lr=cfg.lr,
        batch_size=cfg.batch_size,
        local_epochs=cfg.local_epochs,
        seed=cfg.seed,
    )


def peer_version(python: str, probe: str) -> str:
    """What ``probe`` prints in ``python`` (a version), or why that interpreter cannot run it."""
    try:
        r = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    except OSError as e:
        return e.strerror or "cannot be run"
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()] or [f"exit {r.returncode}"]
        return lines[-1]
    return r.stdout.strip()


PEERS = {  # name: (script, version probe, its prefix, how to install)
    "flower": (
        FLOWER_SCRIPT,
        "import flwr, jax, sklearn, ray; print('flwr', flwr.__version__)",
        "flwr ",
        FLOWER_HOWTO,
    ),
    "pfl": (
        PFL_SCRIPT,
        "import pfl, torch; print('pfl', pfl.__version__, 'torch', torch.__version__)",
        "pfl ",
        PFL_HOWTO,
    ),
}


def run_peer(name: str, cfg: ExperimentConfig, rounds: int, python: str) -> Result | None:
    """A peer's simulation (its script in ``python``) on the same clients."""
    script = PEERS[name][0]
    with tempfile.TemporaryDirectory(prefix=f"fl_peers_{name}_") as tmp:
        part, out = Path(tmp) / "partition.npz", Path(tmp) / "result.json"
        write_partition(cfg, part)
        cmd = [python, str(script), str(part), str(out), "--rounds", str(rounds)]
        env = dict(os.environ, PYTHONPATH="")  # nothing of aisim's environment in the peer's
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0 or not out.is_file():
            lines = [ln for ln in r.stderr.splitlines() if ln.strip()] or ["no output"]
            print(f"{name}: failed (exit {r.returncode}): {lines[-1]}")
            return None
        res = json.loads(out.read_text())
    return Result(name, res["updates_per_s"], res["accuracy"], res["timed_s"], rounds)


CLI_FLAGS = (
    "dataset",
    "clients",
    "clients_per_round",
    "partition",
    "dirichlet_alpha",
    "local_epochs",
    "batch_size",
    "lr",
    "devices",
    "seed",
)


def run_cli(cfg: ExperimentConfig, rounds: int) -> Result | None:
    """``aisim fl run`` in a child process with one device and evaluation at the end: the
    summary's training rate and final accuracy."""
    args = []
    for f in CLI_FLAGS:
        v = getattr(cfg, f)
        if v != getattr(ExperimentConfig(), f) or f in ("dataset", "clients"):
            args += ["--" + f.replace("_", "-"), str(v)]
    cmd = [
        sys.executable,
        "-m",
        "aisim",
        "fl",
        "run",
        *args,
        "--rounds",
        str(rounds),
        "--eval-every",
        str(rounds),
        "--json",
    ]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()] or ["no output"]
        print(f"aisim fl run: failed (exit {r.returncode}): {lines[-1]}")
        return None
    s = json.loads(r.stdout)
    return Result(
        "aisim fl run",
        s["client_updates_per_s"],
        s["final_test_accuracy"],
        s["train_time_s"],
        rounds,
    )


def peer_pythons(args) -> dict[str, str]:
    """The peers that can run: ``{name: python}``, with a line for each that cannot."""
    ready = {}
    for name, python in (("flower", args.flower_python), ("pfl", args.pfl_python)):
        _, probe, prefix, howto = PEERS[name]
        if not python:
            print(f"{name}: not run; to run it: {howto}")
            continue
        why = peer_version(python, probe)
        if why.startswith(prefix):
            print(f"{name}: {why} in {python}")
            ready[name] = python
        else:
            print(f"{name}: not run, {python}: {why}; {howto}")
    return ready


def _args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=None, help="rounds of every task")
    ap.add_argument("--quick", action="store_true", help="the first task, 4 rounds (a smoke test)")
    for name, env in (("flower", "AISIM_FLOWER_PYTHON"), ("pfl", "AISIM_PFL_PYTHON")):
        ap.add_argument(
            f"--{name}-python",
            default=os.environ.get(env),
            help=f"a Python that runs fl_peers_{name}.py (env {env})",
        )
        ap.add_argument(
            f"--{name}-rounds",
            type=int,
            default=None,
            help=f"{name}'s rounds (>= 2; default: --rounds)",
        )
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    for name in ("flower", "pfl"):
        r = getattr(args, f"{name}_rounds")
        if r is not None and r < 2:
            ap.error(f"--{name}-rounds = {r}: expected at least 2 (one untimed)")
    args.quick = args.quick or os.environ.get("AISIM_QUICK") == "1"  # the docs' smoke test
    return args


def _task(name, cfg, rounds, args, peers, multi) -> None:
    results = [run_aisim(cfg, rounds)]
    cli = run_cli(cfg, rounds)
    if cli is not None:
        results.append(cli)
    sharded = run_aisim_sharded(name, rounds) if multi else None
    if sharded is not None:
        results.append(sharded)
    try:
        results.append(run_fedjax(cfg, rounds))
    except ImportError as e:
        print(
            f"fedjax: not installed ({e.name}); pip install fedjax dm-haiku tabulate jmp --no-deps"
        )
    for peer, python in peers.items():
        res = run_peer(peer, cfg, getattr(args, f"{peer}_rounds") or rounds, python)
        if res is not None:
            results.append(res)
    base = results[0].updates_per_s
    for r in results:
        line = (
            f"{name:<62} {r.rounds:>6} {r.name:<12} {r.updates_per_s:>10.1f} {r.accuracy:>8.3f} "
            f"{base / r.updates_per_s:>7.2f}x"
        )
        if sharded is not None:
            line += f" {sharded.updates_per_s / r.updates_per_s:>10.2f}x"
        print(line, flush=True)


def main() -> None:
    args = _args()
    if args.child is not None:
        child(args.child, args.rounds)
        return
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} x{len(jax.devices())}; E=1, B=10")
    peers = peer_pythons(args)
    cores = os.cpu_count() or 1
    multi = cores > 1 and jax.devices()[0].platform == "cpu"
    head = (
        f"{'task':<62} {'rounds':>6} {'simulator':<12} {'updates/s':>10} {'accuracy':>8} "
        f"{'aisim is':>8}"
    )
    print(head + (f" {f'aisim {cores}d is':>11}" if multi else ""))
    tasks = list(TASKS.items())[: 1 if args.quick else None]  # quick: the same paths, once
    for name, (cfg, rounds, quick_rounds) in tasks:
        _task(
            name, cfg, args.rounds or (quick_rounds if args.quick else rounds), args, peers, multi
        )


if __name__ == "__main__":
    main()
