"""TensorFlow Federated's HDF5 format: the files of ``tff.simulation.datasets`` (EMNIST, Stack
Overflow, CIFAR-100, Shakespeare), read with ``h5py`` and no TensorFlow.

Contract: a TFF file holds one group per client under ``examples/``, and in it one dataset per
feature, all of the same length (``examples/<client>/pixels``, ``.../label``). :func:`read_tff`
returns ``{client: {feature: array}}`` for the features asked for, checking that each client
has at least one example and that its features agree in length; :func:`from_tff` builds a
:class:`~fl.federated_data.FederatedData` from a train file (the clients) and a test file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from fl.datasets.arrays import from_arrays
from fl.federated_data import FederatedData
from simbase.errors import AisimError, bad_value


def _h5py():
    try:
        import h5py  # an optional dependency: only TFF's files need it
    except ImportError:
        raise AisimError(
            "reading TFF's HDF5 files needs h5py: pip install 'aisim[tff]'", usage=False
        ) from None
    return h5py


def read_tff(
    path: str | Path, features: Sequence[str], max_clients: int | None = None
) -> dict[str, dict[str, np.ndarray]]:
    """``{client: {feature: array}}`` of a TFF HDF5 file, clients in the file's (sorted) order."""
    path = Path(path)
    if not path.is_file():
        raise AisimError(f"{path}: TFF HDF5 file not found")
    h5py = _h5py()
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise AisimError(f"{path}: not an HDF5 file ({e})") from None
    out = {}
    with f:
        if "examples" not in f:
            raise bad_value(str(path), "examples", None, "TFF's layout examples/<client>/<feature>")
        for k, client in enumerate(sorted(f["examples"])):
            if max_clients is not None and k >= max_clients:
                break
            group = f["examples"][client]
            arrays = {}
            for feat in features:
                if feat not in group:
                    raise bad_value(str(path), f"examples/{client}", feat, f"features {features}")
                arrays[feat] = group[feat][()]
            lengths = {len(a) for a in arrays.values()}
            if lengths == {0}:
                raise bad_value(str(path), "examples", client, "a client with at least one example")
            if len(lengths) != 1:
                raise bad_value(
                    str(path), f"examples/{client}", sorted(lengths), "features of equal length"
                )
            out[client] = arrays
    return out


def from_tff(
    train: str | Path,
    test: str | Path | None,
    x_key: str,
    y_key: str,
    *,
    transform: Callable | None = None,
    num_classes: int | None = None,
    max_clients: int | None = None,
    name: str = "tff",
    seed: int = 0,
) -> FederatedData:
    """A federated data set from TFF's train file (one client per group) and test file (pooled);
    ``transform(arrays) -> (x, y)`` maps a client's raw features to samples."""
    transform = transform or (lambda a: (a[x_key], a[y_key]))
    clients = read_tff(train, (x_key, y_key), max_clients)
    xs, ys, ids = [], [], []
    for c, arrays in clients.items():
        x, y = transform(arrays)
        xs.append(x)
        ys.append(y)
        ids.append(np.full(len(x), c, dtype=object))
    x_test = y_test = None
    if test is not None:
        held = read_tff(test, (x_key, y_key))
        pairs = [transform(a) for a in held.values()]
        x_test = np.concatenate([p[0] for p in pairs])
        y_test = np.concatenate([p[1] for p in pairs])
    return from_arrays(
        np.concatenate(xs),
        np.concatenate(ys),
        np.concatenate(ids),
        x_test=x_test,
        y_test=y_test,
        num_classes=num_classes,
        name=name,
        where=str(train),
        seed=seed,
    )
