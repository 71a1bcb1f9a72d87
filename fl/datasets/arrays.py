"""A federated data set from the user's arrays: features, labels and a client id per sample.

Contract: :func:`from_arrays` groups the samples by client id (in order of first appearance),
and returns a :class:`~fl.federated_data.FederatedData` whose pool holds every client's rows in
that order. The test set is given, or is each client's last ``test_fraction`` of samples after a
seeded shuffle (LEAF's ``sample`` split; at least one of a client with two or more). It checks what a run would otherwise trip over, each as
one :class:`~simbase.errors.AisimError` naming the source, the field, the value and what is
expected: features of different shapes (ragged), a label outside ``0 .. num_classes − 1``, a
client with no examples, labels of a shape that the task does not take, mismatched lengths.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fl.federated_data import FederatedData
from fl.partition import from_lists
from simbase.errors import bad_value


def stack_features(values, where: str, field: str) -> np.ndarray:
    """``values`` (an array, or a sequence of per-sample arrays) as one array; ragged shapes are
    an error naming the first sample whose shape differs from the first's."""
    if isinstance(values, np.ndarray) and values.dtype != object:
        return values
    rows = [np.asarray(v) for v in values]
    if not rows:
        return np.zeros((0,), np.float32)
    shape = rows[0].shape
    for i, r in enumerate(rows):
        if r.shape != shape or r.dtype == object:
            raise bad_value(
                where, field, f"sample {i} of shape {r.shape}", f"every sample shaped {shape}"
            )
    return np.stack(rows)


def check_labels(y: np.ndarray, num_classes: int | None, where: str, field: str = "y") -> int:
    """Integer labels in ``0 .. num_classes − 1`` (inferred as ``max + 1`` when not given)."""
    if y.size == 0:
        return int(num_classes or 1)
    if not np.issubdtype(y.dtype, np.integer):
        if np.issubdtype(y.dtype, np.floating) and np.all(np.equal(np.mod(y, 1), 0)):
            y = y.astype(np.int64)
        else:
            raise bad_value(where, field, y.flat[0], "integer class labels")
    classes = int(num_classes) if num_classes is not None else int(y.max()) + 1
    bad = (y < 0) | (y >= classes)
    if bad.any():
        raise bad_value(where, field, int(y[bad].flat[0]), f"a label in 0..{classes - 1}")
    return classes


def _group(client_ids: np.ndarray) -> tuple[list[object], list[np.ndarray]]:
    """Client ids in order of first appearance, and each client's rows."""
    _, first, inverse = np.unique(client_ids, return_index=True, return_inverse=True)
    order = np.argsort(first)
    names = [client_ids[first[k]] for k in order]
    rows_by = [[] for _ in order]
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    for i, g in enumerate(inverse.reshape(-1)):
        rows_by[rank[g]].append(i)
    return names, [np.asarray(r, np.int64) for r in rows_by]


def from_arrays(
    x,
    y,
    client_ids,
    *,
    x_test=None,
    y_test=None,
    num_classes: int | None = None,
    integer_labels: bool = True,
    clients: Sequence | None = None,
    test_fraction: float = 0.1,
    seed: int = 0,
    name: str = "arrays",
    where: str = "data",
) -> FederatedData:
    """A federated data set from per-sample arrays (see module).

    Args:
      x: ``[n *features]`` features (or ``n`` per-sample arrays of one shape).
      y: ``[n ...]`` labels: class ids for classification and next-token tasks, float targets
        with ``integer_labels=False`` (regression).
      client_ids: ``[n]`` the client of each sample (any hashable values).
      x_test: held-out test features; ``None``: each client's last ``test_fraction``.
      y_test: their labels.
      num_classes: the number of classes (default: the largest label + 1).
      integer_labels: whether ``y`` holds class ids.
      clients: the clients that should exist (a listed client without samples is an error);
        default: those in ``client_ids``.
      test_fraction: the share of each client's samples held out when no test set is given.
      seed: the seed of that split's shuffle.
      name: the data set's name (in the summary).
      where: the ``source`` of errors (the file the arrays came from).
    """
    x = stack_features(x, where, "x")
    y = np.asarray(y)
    ids = np.asarray(client_ids).reshape(-1)
    for field, arr in (("y", y), ("client_id", ids)):
        if len(arr) != len(x):
            raise bad_value(where, field, f"{len(arr)} rows", f"one per sample of x ({len(x)})")
    if len(x) == 0:
        raise bad_value(where, "x", "0 samples", "at least one sample")
    names, rows = _group(ids)
    for c in clients if clients is not None else ():
        if c not in set(names):
            raise bad_value(where, "client_id", c, "a client with at least one example")
    classes = check_labels(y, num_classes, where) if integer_labels else int(num_classes or 1)
    if x_test is None:
        rng = np.random.default_rng(seed)
        train, test = [], []
        for r in rows:
            r = rng.permutation(r)
            k = max(1, int(round(test_fraction * len(r)))) if len(r) > 1 else 0
            train.append(r[: len(r) - k])
            test.append(r[len(r) - k :])
        test_rows = np.concatenate(test)
        x_test, y_test = x[test_rows], y[test_rows]
        rows = train
    else:
        x_test = stack_features(x_test, where, "x_test")
        y_test = np.asarray(y_test)
        if integer_labels:
            check_labels(y_test, classes, where, "y_test")
        if x_test.shape[1:] != x.shape[1:]:
            raise bad_value(where, "x_test", x_test.shape[1:], f"samples shaped {x.shape[1:]}")
    order = np.concatenate(rows)
    pop = from_lists([np.arange(s, s + len(r)) for s, r in zip(_starts(rows), rows, strict=True)])
    label_dtype = np.int32 if integer_labels else np.float32
    feat_dtype = x.dtype if np.issubdtype(x.dtype, np.integer) else np.float32
    return FederatedData(
        name=name,
        x_train=x[order].astype(feat_dtype),
        y_train=y[order].astype(label_dtype),
        population=pop,
        x_test=np.asarray(x_test).astype(feat_dtype),
        y_test=np.asarray(y_test).astype(label_dtype),
        num_classes=classes,
        client_names=tuple(str(n) for n in names),
    )


def _starts(rows: list[np.ndarray]) -> list[int]:
    sizes = [len(r) for r in rows]
    return list(np.cumsum([0, *sizes[:-1]]))
