"""The data sets the field reports on, read from their canonical files (:mod:`fl.datasets.sources`).

Contract: each loader reads the files of its public source, in that source's own format, from
the cache folder (:func:`~fl.datasets.sources.local_files`; downloaded only when asked) and
returns a :class:`~fl.federated_data.FederatedData`:

- :func:`femnist`: TFF's EMNIST-62 HDF5 files, one client per writer (the FEMNIST partition of
  LEAF); 28×28 float pixels, 62 classes. LEAF's own JSON is read by
  :func:`fl.datasets.leaf.from_leaf`.
- :func:`cifar`: CIFAR-10 or CIFAR-100's Python pickles (``data_batch_*``, ``test_batch`` /
  ``train``, ``test``), 32×32×3 pixels in [0, 1], split over clients by a partitioner of
  :mod:`fl.partition` (Dirichlet label skew by default, as in Hsu et al. 2019 and pfl-research).
- :func:`stackoverflow`: TFF's Stack Overflow HDF5 files, one client per user, next-word
  prediction as Reddi et al. (2021) set it up: the 10,000 most frequent words of TFF's word
  counts, sentences of at most 20 words, ids ``0`` padding, ``1..V`` words, ``V+1`` unknown,
  ``V+2`` beginning and ``V+3`` end of sentence; ``x`` and ``y`` are the 20 ids before and after
  a shift by one.
- :func:`sent140`: Sentiment140's training CSV, one client per Twitter user with at least
  ``min_tweets`` tweets (LEAF's partition), tweets as 25 word ids (left-padded with 0; the
  10,000 most frequent words, ``1`` unknown), label 1 for positive.
"""

from __future__ import annotations

import csv
import pickle
import re
from collections import Counter
from pathlib import Path

import numpy as np

from fl import partition as part
from fl.datasets.arrays import from_arrays
from fl.datasets.sources import local_files
from fl.datasets.tff import from_tff, read_tff
from fl.federated_data import FederatedData
from simbase.errors import AisimError, bad_value

SO_VOCAB = 10_000
SO_SEQ_LEN = 20
SENT140_SEQ_LEN = 25
SENT140_VOCAB = 10_000


def femnist(
    data_dir=None, download: bool = False, max_clients: int | None = None, seed: int = 0
) -> FederatedData:
    """FEMNIST: EMNIST's 62 classes by writer, from TFF's HDF5 files (see module)."""
    folder = local_files("femnist", data_dir, download)
    return from_tff(
        folder / "fed_emnist_train.h5",
        folder / "fed_emnist_test.h5",
        "pixels",
        "label",
        transform=lambda a: (a["pixels"].astype(np.float32), a["label"].astype(np.int64)),
        num_classes=62,
        max_clients=max_clients,
        name="femnist",
        seed=seed,
    )


def _unpickle(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return pickle.load(f, encoding="bytes")
    except (OSError, pickle.UnpicklingError, EOFError) as e:
        raise AisimError(f"{path}: not a CIFAR pickle ({e})", usage=False) from None


def _cifar_images(batch: dict, path: Path) -> np.ndarray:
    data = np.asarray(batch[b"data"], np.uint8)
    if data.ndim != 2 or data.shape[1] != 3072:
        raise bad_value(str(path), "data", data.shape, "[n, 3072] uint8 rows (3 x 32 x 32)")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).astype(np.float32) / 255.0


def read_cifar(folder: Path, classes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_test, y_test)`` from CIFAR's Python pickles."""
    if classes == 10:
        root, key = folder / "cifar-10-batches-py", b"labels"
        train = [root / f"data_batch_{i}" for i in range(1, 6)]
        test = [root / "test_batch"]
    else:
        root, key = folder / "cifar-100-python", b"fine_labels"
        train, test = [root / "train"], [root / "test"]

    def load(paths):
        batches = [(_unpickle(p), p) for p in paths]
        x = np.concatenate([_cifar_images(b, p) for b, p in batches])
        y = np.concatenate([np.asarray(b[key], np.int64) for b, _ in batches])
        return x, y

    x, y = load(train)
    xt, yt = load(test)
    return x, y, xt, yt


def cifar(
    classes: int = 10,
    num_clients: int = 100,
    partition: str = "dirichlet",
    dirichlet_alpha: float = 0.5,
    seed: int = 0,
    data_dir=None,
    download: bool = False,
    dirichlet_form: str = "per-class",
) -> FederatedData:
    """CIFAR-10 (``classes=10``) or CIFAR-100 over ``num_clients`` clients (see module)."""
    name = f"cifar{classes}"
    x, y, xt, yt = read_cifar(local_files(name, data_dir, download), classes)
    rng = np.random.default_rng(seed)
    pop = part.partition(partition, y, num_clients, rng, dirichlet_alpha, dirichlet_form)
    return FederatedData(
        name=name,
        x_train=x,
        y_train=y.astype(np.int32),
        population=pop,
        x_test=xt,
        y_test=yt.astype(np.int32),
        num_classes=classes,
    )


def read_word_counts(path: Path, size: int) -> dict[str, int]:
    """The ``size`` most frequent words of TFF's ``stackoverflow.word_count`` (``word count``
    per line, most frequent first) mapped to ids ``1..size``."""
    words = []
    for line in path.read_text(encoding="utf-8").splitlines():
        w = line.split()
        if w:
            words.append(w[0])
        if len(words) == size:
            break
    return {w: i + 1 for i, w in enumerate(words)}


def so_sentence_ids(sentence: str, vocab: dict[str, int], seq_len: int = SO_SEQ_LEN):
    """``(x, y)`` of one sentence: ``[bos] + ids + [eos]`` padded to ``seq_len + 1``, shifted."""
    v = len(vocab)
    oov, bos, eos = v + 1, v + 2, v + 3
    ids = [vocab.get(w, oov) for w in sentence.split()][:seq_len]
    seq = ([bos, *ids, eos] + [0] * (seq_len + 1))[: seq_len + 1]
    return seq[:-1], seq[1:]


def _so_samples(arrays: dict, vocab: dict[str, int]):
    pairs = [
        so_sentence_ids(t.decode() if isinstance(t, bytes) else str(t), vocab)
        for t in arrays["tokens"]
    ]
    return np.asarray([p[0] for p in pairs], np.int32), np.asarray([p[1] for p in pairs], np.int32)


def stackoverflow(
    data_dir=None,
    download: bool = False,
    max_clients: int | None = 1000,
    max_test: int = 10_000,
    seed: int = 0,
) -> FederatedData:
    """Stack Overflow next-word prediction (see module); the first ``max_clients`` users of the
    train file and at most ``max_test`` test sentences (the full file is 135 M sentences)."""
    folder = local_files("stackoverflow", data_dir, download)
    vocab = read_word_counts(folder / "stackoverflow.word_count", SO_VOCAB)
    clients = read_tff(folder / "stackoverflow_train.h5", ("tokens",), max_clients)
    xs, ys, ids = [], [], []
    for c, arrays in clients.items():
        x, y = _so_samples(arrays, vocab)
        xs.append(x)
        ys.append(y)
        ids.append(np.full(len(x), c, dtype=object))
    test = read_tff(folder / "stackoverflow_test.h5", ("tokens",))
    pairs = [_so_samples(a, vocab) for a in test.values()]
    x_test = np.concatenate([p[0] for p in pairs])[:max_test]
    y_test = np.concatenate([p[1] for p in pairs])[:max_test]
    return from_arrays(
        np.concatenate(xs),
        np.concatenate(ys),
        np.concatenate(ids),
        x_test=x_test,
        y_test=y_test,
        num_classes=len(vocab) + 4,
        name="stackoverflow",
        where=str(folder / "stackoverflow_train.h5"),
        seed=seed,
    ).with_vocab(len(vocab) + 4)


WORD = re.compile(r"[a-z0-9']+")


def tweet_ids(text: str, vocab: dict[str, int], seq_len: int = SENT140_SEQ_LEN) -> list[int]:
    """A tweet's last ``seq_len`` word ids, left-padded with 0 (unknown words are 1)."""
    ids = [vocab.get(w, 1) for w in WORD.findall(text.lower())][-seq_len:]
    return [0] * (seq_len - len(ids)) + ids


def read_sent140(path: Path) -> tuple[list[str], list[str], list[int]]:
    """``(users, texts, labels)`` of Sentiment140's CSV (polarity 0 or 4, id, date, query, user,
    text; Latin-1); label 1 for polarity 4."""
    users, texts, labels = [], [], []
    with open(path, encoding="latin-1", newline="") as f:
        for i, row in enumerate(csv.reader(f)):
            if len(row) != 6 or row[0] not in ("0", "4"):
                raise bad_value(
                    f"{path}:{i + 1}", "polarity", row[0] if row else "", "6 columns, 0 or 4"
                )
            labels.append(int(row[0] == "4"))
            users.append(row[4])
            texts.append(row[5])
    return users, texts, labels


def sent140(
    data_dir=None,
    download: bool = False,
    min_tweets: int = 10,
    max_clients: int | None = 1000,
    seed: int = 0,
) -> FederatedData:
    """Sent140 (see module): users with at least ``min_tweets`` tweets, the first
    ``max_clients`` of them in the file's order; each user's last 10 % of tweets test."""
    folder = local_files("sent140", data_dir, download)
    users, texts, labels = read_sent140(folder / "training.1600000.processed.noemoticon.csv")
    counts = Counter(users)
    keep = [u for u in dict.fromkeys(users) if counts[u] >= min_tweets][:max_clients]
    if not keep:
        raise bad_value(str(folder), "min_tweets", min_tweets, "a count some user reaches")
    chosen = set(keep)
    rows = [i for i, u in enumerate(users) if u in chosen]
    words = Counter(w for i in rows for w in WORD.findall(texts[i].lower()))
    vocab = {w: k + 2 for k, (w, _) in enumerate(words.most_common(SENT140_VOCAB))}
    x = np.asarray([tweet_ids(texts[i], vocab) for i in rows], np.int32)
    y = np.asarray([labels[i] for i in rows], np.int64)
    return from_arrays(
        x,
        y,
        np.asarray([users[i] for i in rows], dtype=object),
        num_classes=2,
        name="sent140",
        where=str(folder),
        seed=seed,
    ).with_vocab(SENT140_VOCAB + 2)
