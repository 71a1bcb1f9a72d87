"""aisim on the CIFAR-10 setup that pfl-research publishes its simulator speed on, ready for a GPU.

The setup (pfl-research, ``benchmarks/image_classification/configs/baseline.yaml``, CIFAR-10
IID): 1,000 users of 50 images each, a cohort of 50 users per central iteration, 1,500 central
iterations, one local epoch of SGD with batch 10 and learning rate 0.1, central SGD with
learning rate 1, updates weighted equally (every user holds 50 images), pfl's ``simple_cnn``
(``--model simple-cnn``; without its dropout). The images are CIFAR-10's own when
``--data-dir`` holds its Python pickles (``cifar-10-batches-py/``), else random data of
CIFAR-10's shapes (32×32×3 floats, 10 classes), which times the same work (its accuracy means
nothing). Evaluation runs once, at the end.

It prints the device, the wall time of the run (building, compiling and training), the training
time without the first iteration (which compiles), client updates per second, and the final test
accuracy, so the comparison with pfl-research's published GPU times can be made.
``--quick`` (or ``AISIM_QUICK=1``) runs a reduced size on a CPU: 20 users, cohort 2, 3
iterations, a smoke test whose wall time is mostly compiling (the full setup is meant for a GPU).
On a CPU the local steps' convolutions run channel-last (:mod:`fl.convlayout`, jax-ml/jax#12868);
before that rewrite the quick run trained at 0.1-0.3 client updates/s.

Usage: ``python benchmarks/fl_cifar10.py [--iterations N] [--users N] [--cohort N]
[--model NAME] [--data-dir DIR] [--quick]``
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import numpy as np

import fl
from fl.datasets import cifar
from fl.datasets.sources import SOURCES

PER_USER = 50


def random_cifar10(users: int, seed: int = 0) -> fl.FederatedData:
    """``users × 50`` random images and labels of CIFAR-10's shapes, 50 per user, and a test
    set of 1,000."""
    rng = np.random.default_rng(seed)
    n = users * PER_USER
    ids = np.repeat(np.arange(users), PER_USER)
    return fl.from_arrays(
        rng.random((n, 32, 32, 3), dtype=np.float32),
        rng.integers(0, 10, n),
        ids,
        x_test=rng.random((1000, 32, 32, 3), dtype=np.float32),
        y_test=rng.integers(0, 10, 1000),
        num_classes=10,
        name="cifar10-shaped random data",
    )


def data_for(args) -> fl.FederatedData:
    if args.data_dir and all(
        os.path.isfile(os.path.join(args.data_dir, "cifar10", f)) for f in SOURCES["cifar10"].files
    ):
        return cifar(10, args.users, "iid", seed=0, data_dir=args.data_dir)
    return random_cifar10(args.users)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=1500)
    ap.add_argument("--users", type=int, default=1000)
    ap.add_argument("--cohort", type=int, default=50)
    ap.add_argument("--model", default="simple-cnn")
    ap.add_argument("--data-dir", default=None, help="a cache folder with cifar10/ in it")
    ap.add_argument("--quick", action="store_true", help="20 users, cohort 2, 3 iterations")
    args = ap.parse_args()
    if args.quick or os.environ.get("AISIM_QUICK") == "1":
        args.iterations, args.users, args.cohort = 3, 20, 2
    t0 = time.perf_counter()
    data = data_for(args)
    cfg = fl.ExperimentConfig(
        dataset="cifar10",
        clients=args.users,
        clients_per_round=args.cohort,
        rounds=args.iterations,
        local_epochs=1,
        batch_size=10,
        lr=0.1,
        server_lr=1.0,
        model=args.model,
        devices="server",
        eval_every=args.iterations,
        memory_budget="16GB",
    )
    res = fl.simulate(cfg, data=data)
    wall = time.perf_counter() - t0
    s = res.summary
    dev = jax.devices()[0]
    print(f"device: {dev.platform} {dev.device_kind} x{len(jax.devices())}; jax {jax.__version__}")
    print(
        f"{data.name}: {args.users} users x {PER_USER}, cohort {args.cohort}, "
        f"{args.iterations} iterations, {s['model']} ({s['num_params']:,} parameters), "
        f"E=1, B=10, lr 0.1, central lr 1"
    )
    print(
        f"wall {wall:.1f} s (data, compile, train, evaluate); training {s['train_time_s']:.1f} s "
        f"for {args.iterations - 1} iterations after the first, "
        f"{s['client_updates_per_s']:.1f} client updates/s; "
        f"final test accuracy {s['final_test_accuracy']:.4g}"
    )


if __name__ == "__main__":
    main()
