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


def tree_all_reduce_s(
    p: ArrayLike, n_bytes: ArrayLike, alpha_s: ArrayLike, beta_bytes_per_s: ArrayLike
):
    """Double-binary-tree all-reduce: ``2·ceil(log2 p)·α + 2·n/β`` seconds (Sanders et al. 2009;
    NCCL's tree algorithm: latency logarithmic in p, every rank sends and receives n twice)."""
    p = jnp.asarray(p, jnp.float32)
    depth = jnp.ceil(jnp.log2(jnp.maximum(p, 1.0)))
    return jnp.where(p > 1, 2.0 * depth * alpha_s + 2.0 * n_bytes / beta_bytes_per_s, 0.0)


def nccl_all_reduce_s(
    p: ArrayLike, n_bytes: ArrayLike, alpha_s: ArrayLike, beta_bytes_per_s: ArrayLike
):
    """The faster of ring and tree all-reduce, as NCCL's tuner picks by size and rank count
    (trees for small messages on many ranks, rings for large ones)."""
    return jnp.minimum(
        all_reduce_s(p, n_bytes, alpha_s, beta_bytes_per_s),
        tree_all_reduce_s(p, n_bytes, alpha_s, beta_bytes_per_s),
    )


def ranks_per_domain(group_size: ArrayLike, stride: ArrayLike, gpus_per_node: ArrayLike):
    """Members of a group (``stride`` apart) that share one scale-up domain (at least 1)."""
    g = jnp.asarray(group_size, jnp.float32)
    return jnp.clip(jnp.floor(gpus_per_node / jnp.maximum(stride, 1.0)), 1.0, g)


def hierarchical_all_reduce_s(p, n_bytes, k, intra, inter):
    """All-reduce of ``p`` ranks, ``k`` per scale-up domain: reduce-scatter inside the domain,
    all-reduce of the ``n/k`` shard across the ``p/k`` domains (every rank on its own NIC), and
    all-gather inside the domain (NCCL's hierarchical rings over rail-optimised nodes). With
    ``k = 1`` it is one flat all-reduce on the inter-node tier.

    Args:
      p: ranks in the group.
      n_bytes: bytes each rank reduces.
      k: ranks of the group in one domain (:func:`ranks_per_domain`).
      intra: ``(alpha_s, beta_bytes_per_s)`` of the scale-up tier.
      inter: the same of the tier between domains.

    Returns:
      Seconds.
    """
    a0, b0 = intra
    a1, b1 = inter
    outer = jnp.maximum(p / k, 1.0)
    return (
        reduce_scatter_s(k, n_bytes, a0, b0)
        + nccl_all_reduce_s(outer, n_bytes / k, a1, b1)
        + all_gather_s(k, n_bytes, a0, b0)
    )


def hierarchical_reduce_scatter_s(p, n_bytes, k, intra, inter):
    """Reduce-scatter of ``p`` ranks, ``k`` per domain: inside the domain, then of the ``n/k``
    shard across the domains (see :func:`hierarchical_all_reduce_s`)."""
    a0, b0 = intra
    a1, b1 = inter
    outer = jnp.maximum(p / k, 1.0)
    return reduce_scatter_s(k, n_bytes, a0, b0) + reduce_scatter_s(outer, n_bytes / k, a1, b1)


def hierarchical_all_gather_s(p, n_bytes, k, intra, inter):
    """All-gather of an ``n``-byte result over ``p`` ranks, ``k`` per domain: across the domains
    (the ``n/k`` slice each domain owns), then inside the domain."""
    a0, b0 = intra
    a1, b1 = inter
    outer = jnp.maximum(p / k, 1.0)
    return all_gather_s(outer, n_bytes / k, a1, b1) + all_gather_s(k, n_bytes, a0, b0)


def hierarchical_all_to_all_s(p, n_bytes, k, intra, inter):
    """All-to-all of ``n`` bytes per rank over ``p`` ranks, ``k`` per scale-up domain: the
    ``(k-1)/p`` share for peers in the domain crosses the fast tier and the ``(p-k)/p`` share
    for the other domains the slow one, both at once (each GPU on its own NIC); with ``k = 1``
    it is :func:`all_to_all_s` on the slow tier.

    Args:
      p: ranks in the group.
      n_bytes: bytes each rank holds (n/p to every rank, itself included).
      k: ranks of the group in one domain (:func:`ranks_per_domain`).
      intra: ``(alpha_s, beta_bytes_per_s)`` of the scale-up tier.
      inter: the same of the tier between domains.

    Returns:
      Seconds.
    """
    a0, b0 = intra
    a1, b1 = inter
    p = jnp.asarray(p, jnp.float32)
    local = jnp.maximum(k - 1.0, 0.0)
    remote = jnp.maximum(p - k, 0.0)
    t_local = local * a0 + local / jnp.maximum(p, 1.0) * n_bytes / b0
    t_remote = jnp.where(remote > 0, remote * a1 + remote / jnp.maximum(p, 1.0) * n_bytes / b1, 0.0)
    return jnp.where(p > 1, jnp.maximum(t_local, t_remote), 0.0)
