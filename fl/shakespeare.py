"""LEAF's Shakespeare (Caldas et al. 2018): next-character prediction, one client per speaking role.

Contract: :func:`shakespeare` reads the bundled ``fl/datasets/shakespeare.npz`` (built once by
``fl/datasets/make_shakespeare.py`` from Project Gutenberg's texts; see ``fl/datasets/
SOURCES.md``) and returns a :class:`~fl.data.FederatedData` whose samples are LEAF's windows:
``x`` the ids of 80 consecutive characters of a role's speeches, ``y`` the id of the next one
(LEAF's 80-letter vocabulary). The partition is natural: client ``k`` is one (play, role), with
every window of the first ``train_fraction`` of that role's text; the test set holds the windows
of the rest (no window crosses the cut), so train and test never share characters, as in LEAF's
``-t sample`` split. Roles too short for a test window are dropped. Pure apart from reading the
bundled file; the features are uint8 ids, not float32 (the ``lstm`` model embeds them).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from fl.federated_data import FederatedData
from fl.partition import from_lists
from simbase.errors import bad_value

SEQ_LEN = 80
VOCAB_SIZE = 80
DATA_FILE = Path(__file__).with_name("datasets") / "shakespeare.npz"


@functools.cache
def roles() -> tuple[tuple[str, ...], tuple[np.ndarray, ...], str]:
    """The bundled roles: names (``play/ROLE``), each role's uint8 character ids, the vocabulary."""
    with np.load(DATA_FILE) as f:
        text, lengths = f["text"], f["lengths"]
        names = tuple(str(r) for r in f["roles"])
        vocab = str(f["vocab"])
    cuts = np.cumsum(lengths)[:-1]
    return names, tuple(np.split(text, cuts)), vocab


def _windows(ids: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Every ``seq_len`` window of ``ids`` and the character after it."""
    n = len(ids) - seq_len
    x = np.lib.stride_tricks.sliding_window_view(ids[:-1], seq_len)[:n]
    return np.ascontiguousarray(x), ids[seq_len:].copy()


def usable_roles(train_fraction: float = 0.9, seq_len: int = SEQ_LEN) -> np.ndarray:
    """Indices of the roles whose train and test parts each hold at least one window."""
    _, texts, _ = roles()
    lengths = np.array([len(t) for t in texts])
    cut = (lengths * train_fraction).astype(int)
    return np.flatnonzero((cut > seq_len) & (lengths - cut > seq_len))


def shakespeare(
    num_clients: int = 30,
    seed: int = 0,
    train_fraction: float = 0.9,
    max_test: int = 4000,
    max_train_eval: int = 4000,
):
    """Shakespeare with ``num_clients`` speaking roles drawn without replacement (by ``seed``)
    from the usable ones; each role is one client (see module).

    Args:
      num_clients: roles to use (at most :func:`usable_roles`).
      seed: seed of the role draw and of the evaluation subsamples.
      train_fraction: the share of each role's text used for training.
      max_test: the test set is at most this many windows, drawn uniformly from every selected
        role's test windows (evaluating an LSTM on all of them costs more than training).
      max_train_eval: the rows on which the train loss is evaluated, likewise.
    """
    usable = usable_roles(train_fraction)
    if not 1 <= num_clients <= len(usable):
        raise bad_value(
            None, "clients", num_clients, f"1..{len(usable)} speaking roles for shakespeare"
        )
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(usable, num_clients, replace=False))
    names, texts, _ = roles()
    xs, ys, tx, ty, rows = [], [], [], [], []
    offset = 0
    for k in chosen:
        ids = texts[k]
        cut = int(len(ids) * train_fraction)
        x, y = _windows(ids[:cut], SEQ_LEN)
        xs.append(x)
        ys.append(y)
        rows.append(np.arange(offset, offset + len(y)))
        offset += len(y)
        x, y = _windows(ids[cut:], SEQ_LEN)
        tx.append(x)
        ty.append(y)
    x_test, y_test = np.concatenate(tx), np.concatenate(ty)
    if len(y_test) > max_test:
        keep = np.sort(rng.choice(len(y_test), max_test, replace=False))
        x_test, y_test = x_test[keep], y_test[keep]
    pool = int(offset)
    eval_rows = np.sort(rng.choice(pool, min(pool, max_train_eval), replace=False))
    return FederatedData(
        name="shakespeare",
        x_train=np.concatenate(xs),
        y_train=np.concatenate(ys).astype(np.int32),
        population=from_lists(rows),
        x_test=x_test,
        y_test=y_test.astype(np.int32),
        num_classes=VOCAB_SIZE,
        train_eval_rows=eval_rows,
        client_names=tuple(names[k] for k in chosen),
    )


def decode(ids) -> str:
    """The text of a sequence of vocabulary ids."""
    vocab = roles()[2]
    return "".join(vocab[int(i)] for i in ids)
