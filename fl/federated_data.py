"""A federated data set: one training pool split over clients, a test set, and what it is.

Contract: :class:`FederatedData` is what every loader returns (:mod:`fl.data`, :mod:`fl.shakespeare`,
:mod:`fl.datasets`) and what :func:`fl.build.build` runs on. ``x_train[order[starts[k] :
starts[k] + sizes[k]]]`` are client ``k``'s features (:class:`~fl.partition.Population`). It
imports only :mod:`fl.partition`, so loaders of every kind can return it without a circle.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jaxtyping import Float, Int

from fl.partition import Population


@dataclasses.dataclass(frozen=True)
class FederatedData:
    """A training pool split over clients, plus a test set.

    Attributes:
      name: data set name.
      x_train: ``[pool *features]`` training features.
      y_train: ``[pool]`` training labels.
      population: which pool rows each client holds.
      x_test: ``[test *features]`` test features.
      y_test: ``[test]`` test labels.
      num_classes: number of labels.
      train_eval_rows: the pool rows the train loss is evaluated on (``None``: all of them).
      client_names: a name per client where the partition is natural (Shakespeare's roles).
      vocab_size: for features that are token ids, the number of ids (``None`` otherwise).
    """

    name: str
    x_train: Float[np.ndarray, "pool ..."]
    y_train: Int[np.ndarray, " pool"]
    population: Population
    x_test: Float[np.ndarray, "test ..."]
    y_test: Int[np.ndarray, " test"]
    num_classes: int
    train_eval_rows: Int[np.ndarray, " rows"] | None = None
    client_names: tuple[str, ...] | None = None
    vocab_size: int | None = None

    def with_vocab(self, vocab_size: int) -> FederatedData:
        """The same data, its features declared token ids of ``vocab_size`` values."""
        return dataclasses.replace(self, vocab_size=vocab_size)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])
