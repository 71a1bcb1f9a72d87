"""Alpha-beta cost of collectives on ``p`` ranks moving ``n`` bytes, and their placement on tiers.

Formulas (Thakur, Rabenseifner & Gropp 2005; Chan et al. 2007; the ring algorithms NCCL uses):
ring all-reduce ``2(p-1)·α + 2(p-1)/p · n/β``; all-gather and reduce-scatter
``(p-1)·α + (p-1)/p · n/β``; all-to-all ``(p-1)·α + (p-1)/p · n/β``; point-to-point ``α + n/β``.
``n`` is the size of the whole buffer (for all-gather, the gathered result). All functions take
scalars (or broadcastable arrays), are pure and differentiable, and return 0 when ``p <= 1``.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float


def _ring_factor(p: ArrayLike) -> Float[Array, ""]:
    p = jnp.asarray(p, jnp.float32)
    return jnp.where(p > 1, (p - 1.0) / jnp.maximum(p, 1.0), 0.0)


def _steps(p: ArrayLike) -> Float[Array, ""]:
    return jnp.maximum(jnp.asarray(p, jnp.float32) - 1.0, 0.0)


def all_reduce_s(p: ArrayLike, n_bytes: ArrayLike, alpha_s: ArrayLike, beta_bytes_per_s: ArrayLike):
    """Ring all-reduce time: ``2(p-1)·α + 2(p-1)/p · n/β`` seconds (Thakur et al. 2005).

    Args:
      p: ranks in the group (a count; ``p <= 1`` costs nothing).
      n_bytes: bytes of the buffer every rank holds and reduces.
      alpha_s: per-message latency α of the link tier, seconds.
      beta_bytes_per_s: effective bandwidth β of the link tier, bytes per second.

    Returns:
      Seconds (the shape of the broadcast arguments).
    """
    return 2.0 * _steps(p) * alpha_s + 2.0 * _ring_factor(p) * n_bytes / beta_bytes_per_s


def all_gather_s(p: ArrayLike, n_bytes: ArrayLike, alpha_s: ArrayLike, beta_bytes_per_s: ArrayLike):
    """Ring all-gather of an ``n``-byte result: ``(p-1)·α + (p-1)/p · n/β`` seconds.

    Args:
      p: ranks in the group (a count; ``p <= 1`` costs nothing).
      n_bytes: bytes of the gathered result (each rank contributes n/p).
      alpha_s: per-message latency α of the link tier, seconds.
      beta_bytes_per_s: effective bandwidth β of the link tier, bytes per second.

    Returns:
      Seconds (the shape of the broadcast arguments).
    """
    return _steps(p) * alpha_s + _ring_factor(p) * n_bytes / beta_bytes_per_s


def reduce_scatter_s(
    p: ArrayLike, n_bytes: ArrayLike, alpha_s: ArrayLike, beta_bytes_per_s: ArrayLike
):
    """Ring reduce-scatter of an ``n``-byte input: ``(p-1)·α + (p-1)/p · n/β`` seconds.

    Args:
      p: ranks in the group (a count; ``p <= 1`` costs nothing).
      n_bytes: bytes of each rank's input (each keeps n/p reduced).
      alpha_s: per-message latency α of the link tier, seconds.
      beta_bytes_per_s: effective bandwidth β of the link tier, bytes per second.

    Returns:
      Seconds (the shape of the broadcast arguments).
    """
    return _steps(p) * alpha_s + _ring_factor(p) * n_bytes / beta_bytes_per_s


def all_to_all_s(p: ArrayLike, n_bytes: ArrayLike, alpha_s: ArrayLike, beta_bytes_per_s: ArrayLike):
    """Pairwise all-to-all of ``n`` bytes per rank: ``(p-1)·α + (p-1)/p · n/β`` seconds.

    Args:
      p: ranks in the group (a count; ``p <= 1`` costs nothing).
      n_bytes: bytes each rank holds (it sends n/p to every other rank).
      alpha_s: per-message latency α of the link tier, seconds.
      beta_bytes_per_s: effective bandwidth β of the link tier, bytes per second.

    Returns:
      Seconds (the shape of the broadcast arguments).
    """
    return _steps(p) * alpha_s + _ring_factor(p) * n_bytes / beta_bytes_per_s


def p2p_s(n_bytes: ArrayLike, alpha_s: ArrayLike, beta_bytes_per_s: ArrayLike):
    """One point-to-point send: ``α + n/β`` seconds.

    Args:
      n_bytes: bytes sent.
      alpha_s: latency α of the link tier, seconds.
      beta_bytes_per_s: effective bandwidth β of the link tier, bytes per second.

    Returns:
      Seconds.
    """
    return alpha_s + n_bytes / beta_bytes_per_s


def tier_of_group(
    group_size: ArrayLike, stride: ArrayLike, gpus_per_node: ArrayLike
) -> Float[Array, ""]:
    """Index of the slowest tier a group of ranks crosses: 0 intra-node, 1 inter-node.

    Ranks are laid out with ``stride`` between members of the group (tp innermost: stride 1;
    dp: stride tp; pp: stride tp·dp). The group stays inside a node when its whole span
    ``group_size · stride`` fits in ``gpus_per_node``. A group of one crosses nothing (tier 0).
    """
    span = jnp.asarray(group_size, jnp.float32) * jnp.asarray(stride, jnp.float32)
    return jnp.where((span > gpus_per_node) & (group_size > 1), 1, 0)


def link_params(
    tier: ArrayLike,
    bandwidth_bytes_per_s: Float[Array, " tiers"],
    latency_s: Float[Array, " tiers"],
    bandwidth_efficiency: Float[Array, " tiers"],
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """Effective ``(alpha_s, beta_bytes_per_s)`` of a tier index into the per-tier arrays.

    Args:
      tier: 0 intra-node, 1 inter-node, 2 WAN (:func:`tier_of_group`).
      bandwidth_bytes_per_s: nominal bandwidth of each tier, bytes per second.
      latency_s: α of each tier, seconds (calibrated).
      bandwidth_efficiency: achieved fraction of the nominal bandwidth of each tier.

    Returns:
      ``(alpha_s, beta_bytes_per_s)`` of the tier.
    """
    tier = jnp.asarray(tier, jnp.int32)
    beta = bandwidth_bytes_per_s[tier] * bandwidth_efficiency[tier]
    return latency_s[tier], beta
