"""Client populations as index arrays into one shared pool, and the partitioners that build them.

Contract: a :class:`Population` of ``clients`` clients is three integer arrays. Client ``k`` holds
the pool rows ``order[starts[k] : starts[k] + sizes[k]]``. A partition (every row owned by one
client) has ``order`` a permutation of the pool and ``starts = cumsum(sizes) - sizes``; a large
synthetic population may let windows overlap, so a million clients cost three arrays, not copies.
Partitioners are pure functions of a ``numpy.random.Generator`` and raise
:class:`~simbase.errors.AisimError` for settings that cannot be met.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jaxtyping import Int

from fl.choices import unknown_name
from simbase.errors import AisimError, bad_value

PARTITIONS = ("iid", "dirichlet", "shards", "quantity")
DIRICHLET_FORMS = ("per-class", "per-client")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Population:
    """Which pool rows each client holds (see the module docstring).

    Attributes:
      order: ``[slots]`` pool row indices, grouped by client.
      starts: ``[clients]`` offset of each client's first slot in ``order``.
      sizes: ``[clients]`` number of samples of each client (>= 1).
    """

    order: Int[np.ndarray, " slots"]
    starts: Int[np.ndarray, " clients"]
    sizes: Int[np.ndarray, " clients"]

    @property
    def num_clients(self) -> int:
        return int(self.sizes.shape[0])

    def client_rows(self, k: int) -> Int[np.ndarray, " n"]:
        """The pool rows of client ``k`` (host-side helper for tests and loops)."""
        s = int(self.starts[k])
        return np.asarray(self.order[s : s + int(self.sizes[k])])


def from_lists(rows: list[np.ndarray]) -> Population:
    """Builds a disjoint population from one index array per client."""
    sizes = np.array([len(r) for r in rows], np.int32)
    starts = (np.cumsum(sizes) - sizes).astype(np.int32)
    order = (
        np.concatenate([np.asarray(r, np.int32) for r in rows]) if rows else np.zeros(0, np.int32)
    )
    return Population(order=order.astype(np.int32), starts=starts, sizes=sizes)


def _check_clients(n_samples: int, num_clients: int, where: str) -> None:
    if num_clients < 1:
        raise bad_value(where, "clients", num_clients, "an integer >= 1")
    if num_clients > n_samples:
        raise bad_value(
            where, "clients", num_clients, f"at most the {n_samples} training samples available"
        )


def iid(n_samples: int, num_clients: int, rng: np.random.Generator) -> Population:
    """Shuffles the pool and splits it into ``num_clients`` near-equal parts."""
    _check_clients(n_samples, num_clients, "partition iid")
    return from_lists(np.array_split(rng.permutation(n_samples), num_clients))


def dirichlet(
    labels: Int[np.ndarray, " n"],
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 2,
    form: str = "per-class",
) -> Population:
    """Dirichlet label skew, in one of two published forms (:data:`DIRICHLET_FORMS`).

    ``per-class`` (the default): class ``c``'s samples are split over the clients by
    ``p_c ~ Dir_K(α·1)`` (Yurochkin et al. 2019, "Bayesian Nonparametric Federated Learning of
    Neural Networks"; Wang et al. 2020, FedMA; Li et al. 2022, NIID-Bench; Flower's
    ``DirichletPartitioner``), so client sizes vary too. Clients left with fewer than
    ``min_size`` samples take single random samples from the largest clients (published code
    redraws instead, which never succeeds for α = 0.1 over 100 clients of a small data set).

    ``per-client``: Hsu, Qi & Brown (2019), "Measuring the Effects of Non-Identical Data
    Distribution": every client holds ``n / K`` samples whose classes follow its own
    ``q_k ~ Dir_C(α·p)``, ``p`` the pool's class frequencies; samples are drawn without
    replacement, and when a class runs out the client's ``q_k`` is renormalised over the classes
    left. Here the concentration ``α`` is spread over the ``C`` classes (``α p_c ≈ α / C``),
    whereas ``per-class`` gives each client ``α``: the same α is far more skewed per-client.
    """
    _check_clients(len(labels), num_clients, "partition dirichlet")
    if not alpha > 0:
        raise bad_value("partition dirichlet", "dirichlet_alpha", alpha, "a number > 0")
    if form == "per-client":
        return _dirichlet_per_client(labels, num_clients, alpha, rng)
    if form != "per-class":
        raise bad_value("partition dirichlet", "dirichlet_form", form, " or ".join(DIRICHLET_FORMS))
    if min_size * num_clients > len(labels):
        raise AisimError(
            f"partition dirichlet: {len(labels)} samples cannot give each of {num_clients} "
            f"clients {min_size}",
            field="clients",
            value=num_clients,
            hint="use fewer {clients}",
        )
    rows: list[list[int]] = [[] for _ in range(num_clients)]
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        p = rng.dirichlet(np.full(num_clients, alpha))
        cuts = (np.cumsum(p)[:-1] * len(idx)).astype(int)
        for k, part in enumerate(np.split(idx, cuts)):
            rows[k].extend(part.tolist())
    sizes = np.array([len(r) for r in rows])
    for k in np.flatnonzero(sizes < min_size):
        while len(rows[k]) < min_size:
            donor = int(np.argmax([len(r) for r in rows]))
            rows[k].append(rows[donor].pop(int(rng.integers(len(rows[donor])))))
    return from_lists([np.array(r, np.int64) for r in rows])


def _dirichlet_per_client(labels, num_clients: int, alpha: float, rng) -> Population:
    """Hsu et al. (2019)'s form (see :func:`dirichlet`)."""
    classes, counts = np.unique(labels, return_counts=True)
    prior = counts / counts.sum()
    stacks = [list(rng.permutation(np.flatnonzero(labels == c))) for c in classes]
    left = counts.copy()
    sizes = [len(part) for part in np.array_split(np.arange(len(labels)), num_clients)]
    rows = []
    for size in sizes:
        q = rng.dirichlet(alpha * prior)
        mine: list[int] = []
        need = size
        while need > 0:
            w = q * (left > 0)
            w = w / w.sum() if w.sum() > 0 else prior * (left > 0) / (prior * (left > 0)).sum()
            take = np.minimum(rng.multinomial(need, w), left)
            for c in np.flatnonzero(take):
                mine.extend(stacks[c][left[c] - take[c] : left[c]])
                left[c] -= take[c]
            need -= int(take.sum())
        rows.append(np.array(mine, np.int64))
    return from_lists(rows)


def shards(
    labels: Int[np.ndarray, " n"], num_clients: int, rng: np.random.Generator, per_client: int = 2
) -> Population:
    """McMahan et al. (2017) pathological non-IID: sort by label, cut ``per_client·K`` shards,
    give each client ``per_client`` random shards."""
    n = len(labels)
    _check_clients(n // per_client, num_clients, "partition shards")
    perm = rng.permutation(n)
    by_label = perm[np.argsort(labels[perm], kind="stable")]
    pieces = np.array_split(by_label, num_clients * per_client)
    owner = rng.permutation(num_clients * per_client)
    return from_lists(
        [
            np.concatenate([pieces[j] for j in owner[k * per_client : (k + 1) * per_client]])
            for k in range(num_clients)
        ]
    )


def quantity(
    n_samples: int,
    num_clients: int,
    rng: np.random.Generator,
    kind: str = "lognormal",
    sigma: float = 1.0,
) -> Population:
    """Quantity skew: client sizes ``∝ lognormal(0, sigma)`` or a power law (Pareto, shape
    ``sigma``), at least one sample each, summing to ``n_samples``; labels stay IID."""
    _check_clients(n_samples, num_clients, "partition quantity")
    if kind == "lognormal":
        w = rng.lognormal(0.0, sigma, num_clients)
    elif kind == "powerlaw":
        w = rng.pareto(sigma, num_clients) + 1.0
    else:
        raise bad_value("partition quantity", "kind", kind, "lognormal or powerlaw")
    extra = n_samples - num_clients
    sizes = 1 + np.floor(w / w.sum() * extra).astype(int)
    sizes[np.argmax(sizes)] += n_samples - sizes.sum()
    cuts = np.cumsum(sizes)[:-1]
    return from_lists(np.split(rng.permutation(n_samples), cuts))


def partition(
    name: str,
    labels: Int[np.ndarray, " n"],
    num_clients: int,
    rng: np.random.Generator,
    dirichlet_alpha: float = 0.5,
    dirichlet_form: str = "per-class",
) -> Population:
    """Dispatches to a partitioner by name (one of :data:`PARTITIONS`)."""
    if name == "iid":
        return iid(len(labels), num_clients, rng)
    if name == "dirichlet":
        return dirichlet(labels, num_clients, dirichlet_alpha, rng, form=dirichlet_form)
    if name == "shards":
        return shards(labels, num_clients, rng)
    if name == "quantity":
        return quantity(len(labels), num_clients, rng)
    raise unknown_name("partition", name, PARTITIONS, "partition")
