"""What a model is trained for: its per-sample loss and accuracy, as data the engine reads.

Contract: a :class:`Task` holds two pure functions written for one batch, ``loss(outputs,
labels) -> [batch]`` and ``correct(outputs, labels) -> [batch]`` (the share of each sample that
is right, in [0, 1]; ``None``: the task has no accuracy, such as regression, and the metrics
report NaN). Local training minimises :func:`masked_mean` of the loss over a batch's valid
samples; evaluation sums both over the test set. :data:`TASKS` names the built-in ones:

- ``classification``: softmax cross-entropy on integer labels, accuracy of the arg-max;
- ``next-token``: outputs ``[batch, positions, vocab]``, labels ``[batch, positions]``; each
  sample's loss is the mean cross-entropy over its positions whose label is not the padding id
  0, and its accuracy the share of those positions predicted right (the Stack Overflow
  convention of Reddi et al. 2021, which leaves padding out);
- ``regression``: mean squared error over the output's entries; no accuracy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from fl.choices import unknown_name

PAD_ID = 0


@dataclasses.dataclass(frozen=True)
class Task:
    """A training objective (see module).

    Attributes:
      name: its name (in the summary).
      loss: ``(outputs[batch ...], labels[batch ...]) -> [batch]`` per-sample loss.
      correct: ``(outputs, labels) -> [batch]`` per-sample accuracy in [0, 1], or ``None``.
      integer_labels: whether labels are class ids (int32); ``False``: float32 targets.
    """

    name: str
    loss: Callable
    correct: Callable | None = None
    integer_labels: bool = True


def masked_mean(values: Float[Array, " batch"], mask: Float[Array, " batch"]) -> Float[Array, ""]:
    """Mean of ``values`` over the ``mask``-ed samples (0 when none)."""
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def softmax_nll(logits: Float[Array, "batch classes"], labels) -> Float[Array, " batch"]:
    """Per-sample softmax cross-entropy of integer ``labels``."""
    logp = jax.nn.log_softmax(logits)
    return -jnp.take_along_axis(logp, labels[:, None], axis=1)[:, 0]


def argmax_correct(logits: Float[Array, "batch classes"], labels) -> Float[Array, " batch"]:
    """1 where the arg-max of ``logits`` is the label, else 0."""
    return (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)


def token_nll(logits: Float[Array, "batch positions vocab"], labels) -> Float[Array, " batch"]:
    """Per-sample mean cross-entropy over the non-padding positions (0 for an all-padding one)."""
    logp = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    real = (labels != PAD_ID).astype(jnp.float32)
    return jnp.sum(nll * real, axis=-1) / jnp.maximum(jnp.sum(real, axis=-1), 1.0)


def token_correct(logits: Float[Array, "batch positions vocab"], labels) -> Float[Array, " batch"]:
    """Per-sample share of the non-padding positions whose arg-max is the label."""
    real = (labels != PAD_ID).astype(jnp.float32)
    hit = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32) * real
    return jnp.sum(hit, axis=-1) / jnp.maximum(jnp.sum(real, axis=-1), 1.0)


def squared_error(outputs: Float[Array, "batch ..."], targets) -> Float[Array, " batch"]:
    """Per-sample mean squared error over the output's entries."""
    diff = (outputs - targets.reshape(outputs.shape)).reshape((outputs.shape[0], -1))
    return jnp.mean(jnp.square(diff), axis=-1)


CLASSIFICATION = Task("classification", softmax_nll, argmax_correct)
NEXT_TOKEN = Task("next-token", token_nll, token_correct)
REGRESSION = Task("regression", squared_error, None, integer_labels=False)
TASKS = {t.name: t for t in (CLASSIFICATION, NEXT_TOKEN, REGRESSION)}


def get_task(name: str) -> Task:
    """A built-in task by name (one of :data:`TASKS`)."""
    if name not in TASKS:
        raise unknown_name("task", name, TASKS, "task")
    return TASKS[name]
