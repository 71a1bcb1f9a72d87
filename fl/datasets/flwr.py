"""Flower Datasets (``flwr-datasets``) partitions as a federated data set: the field's standard
partitioners (``IidPartitioner``, ``DirichletPartitioner``, ``NaturalIdPartitioner``, ...) over
Hugging Face data sets, as an optional extra (``pip install 'aisim[flwr]'``).

Contract: :func:`from_flwr` takes a partitioner whose data set is set (or a
``FederatedDataset``'s ``load_partition``), reads partitions ``0 .. num_partitions − 1`` with
``load_partition(i)`` (each a Hugging Face ``Dataset``, indexed by column name), and returns a
:class:`~fl.federated_data.FederatedData` with one client per partition; the test set is a
given split (a ``Dataset``) or each client's held-out share. Images become float32 in [0, 1].
Only the interface is used (``num_partitions``, ``load_partition``, column access), so a test
passes any object with it; the network is touched only by ``flwr-datasets`` itself, when the
user's ``FederatedDataset`` downloads its data set.
"""

from __future__ import annotations

import numpy as np

from fl.datasets.arrays import from_arrays, stack_features
from fl.federated_data import FederatedData
from simbase.errors import bad_value


def _column(dataset, key: str, where: str) -> np.ndarray:
    names = list(getattr(dataset, "column_names", []) or [])
    if names and key not in names:
        raise bad_value(where, "column", key, "one of " + ", ".join(names))
    values = dataset[key]
    arr = stack_features([np.asarray(v) for v in values], where, key)
    if arr.dtype == np.uint8:  # images
        return arr.astype(np.float32) / 255.0
    return arr


def from_flwr(
    partitioner,
    num_partitions: int | None = None,
    *,
    x_key: str = "img",
    y_key: str = "label",
    test=None,
    num_classes: int | None = None,
    name: str = "flwr",
    seed: int = 0,
) -> FederatedData:
    """One client per partition of ``partitioner`` (see module).

    Args:
      partitioner: a ``flwr_datasets`` partitioner (or ``FederatedDataset``) with
        ``load_partition(i)``.
      num_partitions: partitions to read (default: ``partitioner.num_partitions``).
      x_key: the feature column (CIFAR-10 on the Hub: ``img``).
      y_key: the label column (``label``).
      test: a test split (a ``Dataset`` with the same columns), or ``None``.
      num_classes: the number of classes (default: the largest label + 1).
      name: the data set's name.
      seed: the seed of the held-out split when no ``test`` is given.
    """
    n = num_partitions if num_partitions is not None else partitioner.num_partitions
    if not isinstance(n, int) or n < 1:
        raise bad_value("flwr", "num_partitions", n, "an integer >= 1")
    xs, ys, ids = [], [], []
    for i in range(n):
        part = partitioner.load_partition(i)
        where = f"flwr partition {i}"
        x, y = _column(part, x_key, where), _column(part, y_key, where)
        if len(x) == 0:
            raise bad_value("flwr", "partition", i, "a partition with at least one example")
        xs.append(x)
        ys.append(y)
        ids.append(np.full(len(x), i))
    kw = dict(num_classes=num_classes, name=name, where="flwr", seed=seed)
    if test is not None:
        kw.update(
            x_test=_column(test, x_key, "flwr test"), y_test=_column(test, y_key, "flwr test")
        )
    return from_arrays(np.concatenate(xs), np.concatenate(ys), np.concatenate(ids), **kw)


FLWR_PARTITIONERS = ("iid", "dirichlet")


def load_hub(
    dataset: str,
    num_clients: int,
    partition: str = "iid",
    dirichlet_alpha: float = 0.5,
    seed: int = 0,
) -> FederatedData:
    """``flwr:DATASET``: a Hugging Face data set split by Flower's ``IidPartitioner`` or
    ``DirichletPartitioner`` (over its label column) into ``num_clients`` clients, its ``test``
    split the test set. Needs ``flwr-datasets`` and the network (or Hugging Face's cache)."""
    try:
        from flwr_datasets import FederatedDataset  # the optional extra aisim[flwr]
        from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner
    except ImportError:
        raise bad_value(
            None, "data", f"flwr:{dataset}", "flwr-datasets installed: pip install 'aisim[flwr]'"
        ) from None
    if partition not in FLWR_PARTITIONERS:
        raise bad_value(None, "partition", partition, "iid or dirichlet with flwr: data")
    probe = FederatedDataset(dataset=dataset, partitioners={"train": 1})
    cols = probe.load_split("test").column_names
    x_key = next((c for c in ("img", "image", "pixels") if c in cols), cols[0])
    y_key = next((c for c in ("label", "fine_label", "labels") if c in cols), cols[-1])
    if partition == "iid":
        partitioner = IidPartitioner(num_partitions=num_clients)
    else:
        partitioner = DirichletPartitioner(
            num_partitions=num_clients, partition_by=y_key, alpha=dirichlet_alpha, seed=seed
        )
    fds = FederatedDataset(dataset=dataset, partitioners={"train": partitioner})
    return from_flwr(
        _Partitions(fds, num_clients),
        x_key=x_key,
        y_key=y_key,
        test=fds.load_split("test"),
        name=dataset,
        seed=seed,
    )


class _Partitions:
    """A ``FederatedDataset`` seen as a partitioner of ``num_partitions`` partitions."""

    def __init__(self, fds, num_partitions: int):
        self.fds, self.num_partitions = fds, num_partitions

    def load_partition(self, i: int):
        return self.fds.load_partition(i, "train")
