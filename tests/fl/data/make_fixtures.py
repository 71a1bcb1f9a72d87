"""Writes the small files in each real format that tests/fl/test_datasets.py reads (run once;
the outputs are committed). Every file has the layout of its public source, with few clients
and random content:

- ``leaf_femnist/{train,test}/all_data_0.json``: LEAF's JSON (users, num_samples, user_data),
  3 writers with 784 pixels per sample and labels 0..61;
- ``femnist/fed_emnist_{train,test}.h5``: TFF's EMNIST HDF5 (examples/<writer>/pixels, label);
- ``cifar10/cifar-10-batches-py/``: CIFAR-10's Python pickles (data_batch_1..5, test_batch,
  batches.meta) with 8 images per batch; ``cifar100/cifar-100-python/`` likewise (train, test,
  meta, fine and coarse labels);
- ``stackoverflow/``: TFF's Stack Overflow HDF5 (examples/<user>/tokens, a sentence per
  example) and a ``stackoverflow.word_count`` file;
- ``sent140/training.1600000.processed.noemoticon.csv``: Sentiment140's CSV (polarity, id, date,
  query, user, text).

Usage: ``python tests/fl/data/make_fixtures.py`` (needs h5py).
"""

from __future__ import annotations

import csv
import json
import pickle
from pathlib import Path

import h5py
import numpy as np

HERE = Path(__file__).parent
rng = np.random.default_rng(0)

LEAF_USERS = {"f0000_14": 5, "f0001_41": 3, "f0002_09": 4}
TFF_WRITERS = {"f0000_14": 6, "f0001_41": 2, "f0002_09": 4, "f0003_33": 3}
SO_USERS = {"00000001": 3, "00000002": 1, "00000003": 2}
WORDS = ["the", "to", "i", "a", "is", "how", "in", "of", "and", "you", "it", "can", "java"]


def leaf_femnist():
    for split, share in (("train", 1.0), ("test", 0.5)):
        users = list(LEAF_USERS)
        counts = [max(1, int(LEAF_USERS[u] * share)) for u in users]
        data = {
            u: {
                "x": np.round(rng.random((n, 784)), 2).tolist(),
                "y": rng.integers(0, 62, n).tolist(),
            }
            for u, n in zip(users, counts, strict=True)
        }
        out = HERE / "leaf_femnist" / split
        out.mkdir(parents=True, exist_ok=True)
        doc = {"users": users, "num_samples": counts, "user_data": data}
        (out / "all_data_0.json").write_text(json.dumps(doc))


def tff_emnist():
    out = HERE / "femnist"
    out.mkdir(parents=True, exist_ok=True)
    for split, share in (("train", 1.0), ("test", 0.5)):
        with h5py.File(out / f"fed_emnist_{split}.h5", "w") as f:
            for w, n in TFF_WRITERS.items():
                n = max(1, int(n * share))
                g = f.create_group(f"examples/{w}")
                g["pixels"] = rng.random((n, 28, 28)).astype(np.float32)
                g["label"] = rng.integers(0, 62, n).astype(np.int32)


def cifar10():
    root = HERE / "cifar10" / "cifar-10-batches-py"
    root.mkdir(parents=True, exist_ok=True)
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer"]
    names += [b"dog", b"frog", b"horse", b"ship", b"truck"]
    meta = {b"label_names": names, b"num_cases_per_batch": 8, b"num_vis": 3072}
    (root / "batches.meta").write_bytes(pickle.dumps(meta))
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"batch_label": name.encode(),
            b"labels": rng.integers(0, 10, 8).tolist(),
            b"data": rng.integers(0, 256, (8, 3072), dtype=np.uint8),
            b"filenames": [f"{name}_{i}.png".encode() for i in range(8)],
        }
        (root / name).write_bytes(pickle.dumps(batch))


def cifar100():
    root = HERE / "cifar100" / "cifar-100-python"
    root.mkdir(parents=True, exist_ok=True)
    meta = {b"fine_label_names": [f"c{i}".encode() for i in range(100)]}
    meta[b"coarse_label_names"] = [f"s{i}".encode() for i in range(20)]
    (root / "meta").write_bytes(pickle.dumps(meta))
    for name, n in (("train", 40), ("test", 10)):
        batch = {
            b"fine_labels": rng.integers(0, 100, n).tolist(),
            b"coarse_labels": rng.integers(0, 20, n).tolist(),
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        }
        (root / name).write_bytes(pickle.dumps(batch))


def stackoverflow():
    out = HERE / "stackoverflow"
    out.mkdir(parents=True, exist_ok=True)
    counts = sorted(((w, 1000 - 10 * i) for i, w in enumerate(WORDS)), key=lambda t: -t[1])
    (out / "stackoverflow.word_count").write_text("".join(f"{w} {c}\n" for w, c in counts))
    for split, users in (("train", SO_USERS), ("test", {"00000009": 2})):
        with h5py.File(out / f"stackoverflow_{split}.h5", "w") as f:
            for u, n in users.items():
                sentences = [
                    " ".join(rng.choice([*WORDS, "kotlin", "?"], rng.integers(3, 25)))
                    for _ in range(n)
                ]
                g = f.create_group(f"examples/{u}")
                g["tokens"] = np.array([s.encode() for s in sentences], dtype=object)
                g["title"] = np.array([b"a title"] * n, dtype=object)
                g["tags"] = np.array([b"java|python"] * n, dtype=object)


def sent140():
    out = HERE / "sent140"
    out.mkdir(parents=True, exist_ok=True)
    users = ["alice"] * 12 + ["bob"] * 3 + ["carol"] * 10 + ["dave"] * 1
    with open(out / "training.1600000.processed.noemoticon.csv", "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        for i, u in enumerate(users):
            polarity = "4" if rng.random() < 0.5 else "0"
            text = " ".join(rng.choice(["good", "bad", "day", "so", "happy", "sad", "@bob"], 6))
            w.writerow(
                [polarity, str(1467810000 + i), "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", u, text]
            )


if __name__ == "__main__":
    leaf_femnist()
    tff_emnist()
    cifar10()
    cifar100()
    stackoverflow()
    sent140()
