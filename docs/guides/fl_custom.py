"""A researcher's own model, data and algorithm for ``aisim fl run`` (the guide's example).

``python docs/guides/fl_custom.py DATA.npz`` writes a small federated data set in the ``.npz``
format that ``--data`` reads: 8×8 images of two classes, a client id per sample, each client
with its own share of the classes. ``small_cnn`` is a model factory for ``--model-module`` and
``fedprox`` an algorithm for ``--algorithm-module``, written on ``fl.Algorithm``'s extension
point as the built-in FedProx is.
"""

from __future__ import annotations

import sys

import flax.linen as nn
import jax
import numpy as np
import optax

import fl


class SmallCNN(nn.Module):
    """Two 3×3 convolutions and a dense layer."""

    num_classes: int

    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], 8, 8, 1))
        x = nn.relu(nn.Conv(8, (3, 3))(x))
        x = nn.relu(nn.Conv(8, (3, 3))(x))
        return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))


def small_cnn(input_shape, num_outputs):
    """``--model-module``'s factory: the input shape of one sample and the number of outputs."""
    return SmallCNN(num_outputs)


def fedprox():
    """FedProx on the extension point: FedAvg whose local gradient gains ``μ (w − w_global)``
    (``--mu``), keeping stragglers' partial work."""

    def local_grad(grad, params, global_params, ctx):
        return jax.tree.map(lambda g, w, w0: g + ctx.mu * (w - w0), grad, params, global_params)

    return fl.Algorithm(
        name="my-fedprox",
        server_opt=optax.sgd(1.0),
        local_grad=local_grad,
        straggler_policy="partial",
    )


def write_data(path: str, clients: int = 40, seed: int = 0) -> None:
    """Two classes of 8×8 images (a bright top or a bright bottom half, with noise); client
    ``k`` holds 30 samples, a share ``k / clients`` of them of class 1."""
    rng = np.random.default_rng(seed)
    y = np.concatenate([(rng.random(30) < k / clients).astype(np.int64) for k in range(clients)])
    x = rng.normal(0.0, 2.0, (len(y), 8, 8)).astype(np.float32)
    x[y == 0, :4] += 1.0
    x[y == 1, 4:] += 1.0
    np.savez(path, x=x, y=y, client_id=np.repeat(np.arange(clients), 30))


if __name__ == "__main__":
    write_data(sys.argv[1])
