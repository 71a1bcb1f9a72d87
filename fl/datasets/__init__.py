"""Federated data sets beyond the bundled ones: the user's own files and the field's data sets.

Contract: :func:`load_path` reads ``--data PATH`` in the format given or detected
(:data:`FORMATS`: a ``.npz`` of arrays with client ids, a LEAF JSON folder, a TensorFlow
Federated ``.h5`` file, ``flwr:DATASET`` for a Flower Datasets partition of a Hugging Face data
set); :func:`load_field` loads one of :data:`FIELD_DATASETS` from its public source's files
(:mod:`fl.datasets.sources`). Every loader returns a :class:`~fl.federated_data.FederatedData`
and reports bad input as one :class:`~simbase.errors.AisimError`. The bundled data files of
:mod:`fl.data` and :mod:`fl.shakespeare` live in this folder too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fl.choices import unknown_name
from fl.datasets.arrays import from_arrays
from fl.datasets.field import cifar, femnist, sent140, stackoverflow
from fl.datasets.flwr import from_flwr, load_hub
from fl.datasets.leaf import from_leaf
from fl.datasets.sources import SOURCES, cache_dir
from fl.datasets.tff import from_tff, read_tff
from fl.federated_data import FederatedData
from simbase.errors import AisimError, bad_value

FORMATS = ("auto", "npz", "leaf", "tff", "flwr")
FIELD_DATASETS = ("femnist", "cifar10", "cifar100", "stackoverflow", "sent140")
# TFF files' feature names: (features, label)
TFF_KEYS = (("pixels", "label"), ("image", "label"))

__all__ = [
    "FIELD_DATASETS",
    "FORMATS",
    "SOURCES",
    "cache_dir",
    "cifar",
    "detect_format",
    "femnist",
    "from_arrays",
    "from_flwr",
    "from_leaf",
    "from_npz",
    "from_tff",
    "load_field",
    "load_path",
    "sent140",
    "stackoverflow",
]


def detect_format(path: str) -> str:
    """The format of ``--data PATH``: ``flwr`` for ``flwr:NAME``, ``leaf`` for a folder,
    ``npz`` and ``tff`` by suffix."""
    if path.startswith("flwr:"):
        return "flwr"
    p = Path(path)
    if p.is_dir():
        return "leaf"
    if p.suffix == ".npz":
        return "npz"
    if p.suffix in (".h5", ".hdf5"):
        return "tff"
    if not p.exists():
        raise bad_value(None, "data", path, "an existing file or folder, or flwr:DATASET")
    raise bad_value(None, "data_format", "auto", f"a format given for {p.name} (npz, leaf, tff)")


def from_npz(path: str | Path, seed: int = 0) -> FederatedData:
    """A ``.npz`` with arrays ``x``, ``y``, ``client_id`` and optionally ``x_test``, ``y_test``
    and ``num_classes`` (labels of a float dtype: a regression task)."""
    path = Path(path)
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise AisimError(f"{path}: not a NumPy .npz file ({e})") from None
    with z:
        arrays = {k: z[k] for k in z.files}
    for key in ("x", "y", "client_id"):
        if key not in arrays:
            raise bad_value(str(path), key, None, "arrays x, y and client_id (one per sample)")
    integer = not np.issubdtype(arrays["y"].dtype, np.floating)
    classes = arrays.get("num_classes")
    return from_arrays(
        arrays["x"],
        arrays["y"],
        arrays["client_id"],
        x_test=arrays.get("x_test"),
        y_test=arrays.get("y_test"),
        num_classes=int(classes) if classes is not None else None,
        integer_labels=integer,
        name=path.stem,
        where=str(path),
        seed=seed,
    )


def _from_tff_file(path: Path, seed: int) -> FederatedData:
    """A TFF image file (EMNIST's ``pixels``/``label``, CIFAR-100's ``image``/``label``) and the
    ``test`` file beside it (``..._train.h5`` -> ``..._test.h5``), if there is one."""
    for x_key, y_key in TFF_KEYS:
        try:
            read_tff(path, (x_key, y_key), max_clients=1)
        except AisimError:
            continue
        test = path.with_name(path.name.replace("train", "test"))
        return from_tff(
            path,
            test if test != path and test.is_file() else None,
            x_key,
            y_key,
            name=path.stem.replace("_train", ""),
            seed=seed,
        )
    raise bad_value(str(path), "examples", None, "clients with pixels/image and label features")


def load_path(
    path: str,
    fmt: str = "auto",
    *,
    num_clients: int = 100,
    partition: str = "iid",
    dirichlet_alpha: float = 0.5,
    seed: int = 0,
) -> FederatedData:
    """``--data PATH`` in format ``fmt`` (one of :data:`FORMATS`; see module). ``flwr:`` data
    is split into ``num_clients`` clients by ``partition``; the other formats carry their own
    clients."""
    if fmt not in FORMATS:
        raise unknown_name("data_format", fmt, FORMATS, "format")
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt == "flwr":
        name = path.removeprefix("flwr:")
        return load_hub(name, num_clients, partition, dirichlet_alpha, seed)
    p = Path(path)
    if not p.exists():
        raise bad_value(None, "data", path, "an existing file or folder")
    if fmt == "leaf":
        return from_leaf(p, seed=seed)
    if fmt == "npz":
        return from_npz(p, seed)
    return _from_tff_file(p, seed)


def load_field(
    name: str,
    *,
    num_clients: int = 100,
    partition: str = "dirichlet",
    dirichlet_alpha: float = 0.5,
    dirichlet_form: str = "per-class",
    seed: int = 0,
    data_dir=None,
    download: bool = False,
) -> FederatedData:
    """One of :data:`FIELD_DATASETS` (see :mod:`fl.datasets.field`): FEMNIST, Stack Overflow and
    Sent140 keep their natural clients (the first ``num_clients``), CIFAR is split into
    ``num_clients`` by ``partition``."""
    if name == "femnist":
        return femnist(data_dir, download, num_clients, seed)
    if name in ("cifar10", "cifar100"):
        classes = 10 if name == "cifar10" else 100
        return cifar(
            classes,
            num_clients,
            partition,
            dirichlet_alpha,
            seed,
            data_dir,
            download,
            dirichlet_form,
        )
    if name == "stackoverflow":
        return stackoverflow(data_dir, download, num_clients, seed=seed)
    if name == "sent140":
        return sent140(data_dir, download, max_clients=num_clients, seed=seed)
    raise unknown_name("dataset", name, FIELD_DATASETS, "data set")
