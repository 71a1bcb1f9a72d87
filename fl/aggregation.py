"""Aggregation of client updates: weighted sums over the client axis, clipping and DP noise.

Contract: pure functions on pytrees. ``deltas`` carry a leading ``clients`` axis; a client with
weight 0 contributes nothing. :func:`clip_update` is written for one client (DP-FedAvg's
per-client clipping, McMahan et al. 2018, "Learning Differentially Private Recurrent Language
Models", alg. 1); :func:`gaussian_noise` adds ``N(0, std²)`` to every leaf.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float


def weighted_sum(deltas, weights: Float[Array, " clients"]):
    """``Σ_k w_k · Δ_k`` over the leading client axis of every leaf."""
    return jax.tree.map(lambda d: jnp.tensordot(weights, d, axes=1), deltas)


def tree_norm(tree) -> Float[Array, ""]:
    """Global L2 norm of a pytree."""
    return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


def clip_update(delta, clip_norm: Float[Array, ""]):
    """Scales one client's update to L2 norm at most ``clip_norm``."""
    scale = jnp.minimum(1.0, clip_norm / jnp.maximum(tree_norm(delta), 1e-12))
    return jax.tree.map(lambda d: d * scale, delta)


def gaussian_noise(tree, key: Array, std: Float[Array, ""]):
    """Adds independent ``N(0, std²)`` noise to every entry of ``tree``."""
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(key, len(leaves))
    noisy = [
        x + std * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys, strict=True)
    ]
    return jax.tree.unflatten(treedef, noisy)


def tree_zeros_like(tree):
    return jax.tree.map(jnp.zeros_like, tree)


def all_finite(tree) -> Array:
    """True when no leaf holds a NaN or an infinity."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))
