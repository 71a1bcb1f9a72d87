"""Flower's simulation engine on a partition that ``fl_peers.py`` wrote: the Flower row of its table.

Run by ``benchmarks/fl_peers.py --flower-python PATH`` in a separate interpreter (Flower with Ray,
JAX, NumPy and scikit-learn; it imports nothing from aisim), because ``flwr[simulation]`` pins
``typer``, ``rich`` and ``protobuf`` at other versions than aisim's. The partition file (.npz)
holds the training rows, each client's rows, the test set and the hyper-parameters, so every
simulator sees the same clients.

Flower's Message API: a :class:`flwr.clientapp.ClientApp` whose ``train`` runs E epochs of plain
SGD (a jitted JAX step per batch of B shuffled rows, the last batch short, mean cross-entropy) on
its client's rows and answers with the model and its number of examples; a
:class:`flwr.serverapp.ServerApp` runs Flower's own ``FedAvg`` strategy (every node each round,
weighted by examples, no client-side evaluation) through ``flwr.simulation.run_simulation`` on
Ray, one actor per ``--cpus-per-client`` cores. Timing matches the other rows: round 1 is untimed
(Ray actors start, JAX compiles every batch shape); the clock runs from the end of round 1's
aggregation to the end of round R's (Flower calls ``evaluate_fn`` after each round; nothing else
is done there until the last round), so it covers R - 1 rounds of sending the model, training on
the actors, replying and aggregating. Client updates per second = clients x (R - 1) / timed
seconds; accuracy is that of the final global model on the test set.

Usage: ``python fl_peers_flower.py PARTITION.npz RESULT.json --rounds R [--cpus-per-client C]``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time

import flwr
import jax
import jax.numpy as jnp
import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation

_DATA: dict[str, dict[str, np.ndarray]] = {}  # partition path -> arrays, once per Ray actor


def load_partition(path: str) -> dict[str, np.ndarray]:
    """The partition's arrays, read once per process."""
    if path not in _DATA:
        with np.load(path) as z:
            _DATA[path] = {k: z[k] for k in z.files}
    return _DATA[path]


def init_params(key: jax.Array, sizes: list[int]) -> list[jax.Array]:
    """Weights ~ truncated normal with std 1/sqrt(fan_in) (haiku's Linear default), biases 0."""
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        key, sub = jax.random.split(key)
        w = jax.random.truncated_normal(sub, -2.0, 2.0, (fan_in, fan_out)) / np.sqrt(fan_in)
        params += [w.astype(jnp.float32), jnp.zeros((fan_out,), jnp.float32)]
    return params


def forward(params: list[jax.Array], x: jax.Array) -> jax.Array:
    """Logits of the MLP (ReLU between layers; no hidden layer = logistic regression)."""
    n_layers = len(params) // 2
    for i in range(n_layers):
        x = x @ params[2 * i] + params[2 * i + 1]
        if i < n_layers - 1:
            x = jax.nn.relu(x)
    return x


def loss(params: list[jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy over the batch."""
    logp = jax.nn.log_softmax(forward(params, x))
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


@jax.jit
def sgd_step(params: list[jax.Array], x: jax.Array, y: jax.Array, lr: jax.Array):
    """One step of plain SGD."""
    grads = jax.grad(loss)(params, x, y)
    return [p - lr * g for p, g in zip(params, grads, strict=True)]


def local_train(
    params: list[np.ndarray], d: dict[str, np.ndarray], client: int, server_round: int
) -> tuple[list[np.ndarray], int]:
    """E epochs of SGD over one client's rows, shuffled each epoch; the model and the row count."""
    rows = d["rows"][d["offsets"][client] : d["offsets"][client + 1]]
    b, lr = int(d["batch_size"]), jnp.float32(d["lr"])
    rng = np.random.default_rng([int(d["seed"]), server_round, client])
    p = [jnp.asarray(a) for a in params]
    for _ in range(int(d["local_epochs"])):
        order = rng.permutation(rows)
        for s in range(0, len(order), b):
            idx = order[s : s + b]
            p = sgd_step(p, d["x_train"][idx], d["y_train"][idx], lr)
    return [np.asarray(a) for a in p], len(rows)


def accuracy(params: list[np.ndarray], d: dict[str, np.ndarray]) -> float:
    """Share of test rows whose arg-max logit is the label."""
    logits = forward([jnp.asarray(a) for a in params], d["x_test"])
    return float(np.mean(np.asarray(jnp.argmax(logits, axis=1)) == d["y_test"]))


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """Train on this node's client (``partition-id``) and answer with the model and its size."""
    cfg = msg.content["config"]
    d = load_partition(str(cfg["partition"]))
    client = int(context.node_config["partition-id"])
    params = msg.content["arrays"].to_numpy_ndarrays()
    new, n = local_train(params, d, client, int(cfg["server-round"]))
    content = RecordDict({"arrays": ArrayRecord(new), "metrics": MetricRecord({"num-examples": n})})
    return Message(content=content, reply_to=msg)


def make_server_app(path: str, rounds: int, out: dict):
    """The ServerApp: Flower's FedAvg over every node, stamping the clock after each round."""
    d = load_partition(path)
    n_clients = len(d["offsets"]) - 1
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        sizes = [int(d["x_train"].shape[1]), *map(int, d["hidden"]), int(d["num_classes"])]
        init = init_params(jax.random.PRNGKey(int(d["seed"])), sizes)
        stamps: dict[int, float] = {}

        def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            stamps[server_round] = time.perf_counter()
            if server_round == rounds:
                out["accuracy"] = accuracy(arrays.to_numpy_ndarrays(), d)
            return None

        strategy = FedAvg(
            fraction_train=1.0,
            fraction_evaluate=0.0,
            min_train_nodes=n_clients,
            min_available_nodes=n_clients,
        )
        strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord([np.asarray(a) for a in init]),
            num_rounds=rounds,
            train_config=ConfigRecord({"partition": path}),
            evaluate_fn=evaluate_fn,
        )
        out["timed_s"] = stamps[rounds] - stamps[1]
        out["updates"] = n_clients * (rounds - 1)

    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("partition", help="the .npz that fl_peers.py wrote")
    ap.add_argument("result", help="where to write the JSON result")
    ap.add_argument("--rounds", type=int, required=True, help="rounds, the first untimed (>= 2)")
    ap.add_argument("--cpus-per-client", type=float, default=1.0, help="Ray cores per actor")
    args = ap.parse_args()
    if args.rounds < 2:
        ap.error(f"--rounds = {args.rounds}: expected at least 2 (the first is untimed)")
    logging.getLogger("flwr").setLevel(logging.WARNING)  # one INFO block per round otherwise
    d = load_partition(args.partition)
    n_clients = len(d["offsets"]) - 1
    cores = os.cpu_count() or 1
    out: dict = {}
    run_simulation(
        server_app=make_server_app(args.partition, args.rounds, out),
        client_app=client_app,
        num_supernodes=n_clients,
        backend_config={
            "client_resources": {"num_cpus": args.cpus_per_client, "num_gpus": 0.0},
            "init_args": {"num_cpus": cores, "log_to_driver": False},
        },
    )
    if "timed_s" not in out:
        raise SystemExit("error: Flower's simulation ended before its last round")
    out.update(
        flwr=flwr.__version__,
        actors=max(1, int(cores / args.cpus_per_client)),
        updates_per_s=out["updates"] / out["timed_s"],
        rounds=args.rounds,
    )
    with open(args.result, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    import fl_peers_flower  # the apps by module name, so Ray's actors import them, not unpickle

    fl_peers_flower.main()
