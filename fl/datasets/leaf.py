"""LEAF's federated JSON format (Caldas et al. 2018, "LEAF: A Benchmark for Federated
Settings"): the files that LEAF's ``preprocess.sh`` writes for FEMNIST, Sent140, Shakespeare,
CelebA and Reddit.

Contract: a LEAF data set is a folder with ``train/`` and ``test/`` sub-folders (or one folder)
of ``*.json`` files, each ``{"users": [u, ...], "num_samples": [n_u, ...], "user_data": {u:
{"x": [...], "y": [...]}}}``. :func:`read_leaf` reads every file of a folder in name order and
checks each user against the format's own statistics (``num_samples`` must equal the length of
its ``x`` and ``y``; a user without examples is an error). :func:`from_leaf` builds a
:class:`~fl.federated_data.FederatedData` whose clients are the train users (LEAF's natural
partition, one client per writer or Twitter user); each sample's ``x`` passes through
``features`` (default: a float32 array, FEMNIST's 784 pixels) and ``y`` through ``labels``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fl.datasets.arrays import from_arrays, stack_features
from fl.federated_data import FederatedData
from simbase.errors import AisimError, bad_value
from simbase.io import read_text


def read_leaf(folder: Path) -> tuple[list[str], list[list], list[list]]:
    """``(users, xs, ys)`` of every ``*.json`` file in ``folder`` (see module)."""
    files = sorted(folder.glob("*.json"))
    if not files:
        raise AisimError(f"{folder}: no LEAF *.json files (expected train/ and test/ folders)")
    users, xs, ys = [], [], []
    for f in files:
        try:
            raw = json.loads(read_text(f, "LEAF JSON file"))
        except json.JSONDecodeError as e:
            raise AisimError(f"{f}: not valid JSON ({e.msg} at line {e.lineno})") from None
        for key in ("users", "num_samples", "user_data"):
            if key not in raw:
                raise bad_value(str(f), key, None, "a LEAF file with users, num_samples, user_data")
        if len(raw["num_samples"]) != len(raw["users"]):
            raise bad_value(str(f), "num_samples", len(raw["num_samples"]), "one per user")
        for u, n in zip(raw["users"], raw["num_samples"], strict=True):
            data = raw["user_data"].get(u)
            if data is None or not data.get("x"):
                raise bad_value(str(f), "user_data", u, "a user with at least one example")
            if not len(data["x"]) == len(data.get("y", ())) == n:
                raise bad_value(
                    str(f),
                    f"user_data.{u}",
                    f"{len(data['x'])} x, {len(data.get('y', ()))} y",
                    f"num_samples = {n} of each",
                )
            users.append(str(u))
            xs.append(data["x"])
            ys.append(data["y"])
    return users, xs, ys


def _flat(users, xs, ys, features, labels, where):
    ids = np.repeat(np.arange(len(users)), [len(x) for x in xs])
    x = stack_features([features(v) for xx in xs for v in xx], where, "x")
    y = np.asarray([labels(v) for yy in ys for v in yy])
    return x, y, ids


def from_leaf(
    path: str | Path,
    *,
    features: Callable = lambda v: np.asarray(v, np.float32),
    labels: Callable = int,
    num_classes: int | None = None,
    name: str | None = None,
    test_fraction: float = 0.1,
    seed: int = 0,
) -> FederatedData:
    """A LEAF data set (see module): ``path/train`` and ``path/test``, or one folder whose users'
    last ``test_fraction`` of samples become the test set."""
    path = Path(path)
    if not path.is_dir():
        raise AisimError(f"{path}: not a folder (expected a LEAF data folder with train/, test/)")
    name = name or path.name
    train_dir = path / "train" if (path / "train").is_dir() else path
    users, xs, ys = read_leaf(train_dir)
    x, y, ids = _flat(users, xs, ys, features, labels, str(train_dir))
    kw = dict(num_classes=num_classes, name=name, where=str(train_dir), seed=seed)
    if (path / "test").is_dir():
        t_users, t_xs, t_ys = read_leaf(path / "test")
        x_t, y_t, _ = _flat(t_users, t_xs, t_ys, features, labels, str(path / "test"))
        if num_classes is None:
            kw["num_classes"] = int(max(y.max(), y_t.max())) + 1
        return from_arrays(x, y, np.asarray(users)[ids], x_test=x_t, y_test=y_t, **kw)
    return from_arrays(x, y, np.asarray(users)[ids], test_fraction=test_fraction, **kw)
