"""Centralised baseline: the same model trained by plain minibatch SGD on the pooled data.

Contract: :func:`train_centralised` shuffles the whole training pool each epoch, takes SGD steps
of ``batch_size`` samples (one jitted epoch, ``lax.scan`` over batches; the last partial batch is
dropped) and returns the test accuracy, the yardstick for federated accuracy on the same split.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from fl.convlayout import cpu_canonical_convs
from fl.data import FederatedData
from fl.models import Model, cross_entropy
from fl.round import make_evaluate


@dataclasses.dataclass(frozen=True)
class CentralisedResult:
    """Test accuracy and loss after each epoch."""

    test_accuracy: list[float]
    test_loss: list[float]


def train_centralised(
    model: Model, ds: FederatedData, epochs: int, batch_size: int, lr: float, seed: int = 0
) -> CentralisedResult:
    """SGD on the pooled training set of ``ds``; evaluates on ``ds``'s test set each epoch."""
    x, y = jnp.asarray(ds.x_train), jnp.asarray(ds.y_train)
    nb = x.shape[0] // batch_size
    opt = optax.sgd(lr)
    evaluate = jax.jit(make_evaluate(model.apply))

    @jax.jit
    def epoch(params, opt_state, key):
        perm = jax.random.permutation(key, x.shape[0])[: nb * batch_size].reshape(nb, batch_size)

        def step(carry, idx):
            p, o = carry
            g = cpu_canonical_convs(  # the scan's convolutions, jax-ml/jax#12868 (fl.convlayout)
                jax.grad(
                    lambda q: cross_entropy(model.apply(q, x[idx]), y[idx], jnp.ones(batch_size))
                )
            )(p)
            u, o = opt.update(g, o, p)
            return (optax.apply_updates(p, u), o), None

        (params, opt_state), _ = jax.lax.scan(step, (params, opt_state), perm)
        return params, opt_state

    params = model.init(jax.random.key(seed))
    opt_state = opt.init(params)
    accs, losses = [], []
    xt, yt = jnp.asarray(ds.x_test), jnp.asarray(ds.y_test)
    for e in range(epochs):
        params, opt_state = epoch(params, opt_state, jax.random.fold_in(jax.random.key(seed), e))
        loss, acc = evaluate(params, xt, yt)
        accs.append(float(acc))
        losses.append(float(loss))
    return CentralisedResult(accs, losses)
