"""Alpha-beta cost of collectives on ``p`` ranks moving ``n`` bytes, and their placement on tiers.

Formulas (Thakur, Rabenseifner & Gropp 2005; Chan et al. 2007; the ring algorithms NCCL uses):
ring all-reduce ``2(p-1)·α + 2(p-1)/p · n/β``; all-gather and reduce-scatter
``(p-1)·α + (p-1)/p · n/β``; all-to-all ``(p-1)·α + (p-1)/p · n/β``; point-to-point ``α + n/β``.
``n`` is the size of the whole buffer (for all-gather, the gathered result). All functions take
scalars (or broadcastable arrays), are pure and differentiable, and return 0 when ``p <= 1``.

Groups wider than a scale-up domain run NCCL's algorithms as its tuner prices them
(``ncclTopoTuneModel`` in NVIDIA/nccl ``src/graph/tuning.cc``): a ring of ``p`` ranks over ``D``
domains takes ``p - 1`` steps, ``D - 1`` of them across domains, so its latency is
``(p - D)·α_intra + (D - 1)·α_inter`` (twice for an all-reduce), which grows with every rank at
thousands of ranks; a tree all-reduce takes ``2·((k - 1)·α_intra + log2(D)·α_inter)``; all-gather
and reduce-scatter have only the ring. A framework issues one collective per layer (or bucket),
so ``count`` multiplies the latency, not the bytes. Across more leaf groups of the fabric than
one, the inter-domain bandwidth falls (:func:`fabric_efficiency`).
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from perfmodel.step.select import where


def _ring_factor(p: ArrayLike) -> Float[Array, ""]:
    p = jnp.asarray(p, jnp.float32)
    return where(p > 1, (p - 1.0) / jnp.maximum(p, 1.0), 0.0)


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
    return where((span > gpus_per_node) & (group_size > 1), 1, 0)


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
    return where(p > 1, 2.0 * depth * alpha_s + 2.0 * n_bytes / beta_bytes_per_s, 0.0)


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


def ring_latency_s(p, k, alpha_intra_s, alpha_inter_s):
    """Latency of one ring all-gather or reduce-scatter of ``p`` ranks, ``k`` per domain, as
    NCCL's tuner counts it: ``p - 1`` steps, of which ``D - 1`` cross domains (``D = p/k``),
    ``(p - D)·α_intra + (D - 1)·α_inter`` (``nsteps``, ``nInterSteps`` in ``tuning.cc``)."""
    p = jnp.asarray(p, jnp.float32)
    d = jnp.maximum(p / jnp.maximum(k, 1.0), 1.0)
    return jnp.maximum(p - d, 0.0) * alpha_intra_s + jnp.maximum(d - 1.0, 0.0) * alpha_inter_s


def hierarchical_all_reduce_s(p, n_bytes, k, intra, inter, count=1.0):
    """All-reduce of ``p`` ranks, ``k`` per scale-up domain, as NCCL runs it: the faster of a
    ring and a tree (its tuner's choice by size and rank count).

    Bandwidth: the bytes of a reduce-scatter inside the domain, an all-reduce of the ``n/k``
    shard across the ``D = p/k`` domains (every rank on its own NIC, as NCCL's rings and trees
    over rail-optimised nodes run) and an all-gather inside the domain; a tree sends the shard
    across domains twice in full. Latency per collective: the ring's ``2·((p - D)·α_intra +
    (D - 1)·α_inter)``, the tree's ``2·((k - 1)·α_intra + ceil(log2 D)·α_inter)``
    (:func:`ring_latency_s`; NCCL ``tuning.cc``). With ``k = p`` it is one ring inside the
    domain; with ``k = 1``, a flat one across domains.

    Args:
      p: ranks in the group.
      n_bytes: bytes each rank reduces (all ``count`` collectives together).
      k: ranks of the group in one domain (:func:`ranks_per_domain`).
      intra: ``(alpha_s, beta_bytes_per_s)`` of the scale-up tier.
      inter: the same of the tier between domains.
      count: collectives the bytes are issued in (one per layer or bucket): each pays the
        latency.

    Returns:
      Seconds.
    """
    a0, b0 = intra
    a1, b1 = inter
    p = jnp.asarray(p, jnp.float32)
    d = jnp.maximum(p / k, 1.0)
    local = 2.0 * _ring_factor(k) * n_bytes / b0
    ring = (
        2.0 * count * ring_latency_s(p, k, a0, a1)
        + local
        + 2.0 * _ring_factor(d) * n_bytes / k / b1
    )
    depth = jnp.ceil(jnp.log2(d))
    tree = (
        2.0 * count * (_steps(k) * a0 + depth * a1)
        + local
        + where(d > 1.0, 2.0 * n_bytes / k / b1, 0.0)
    )
    return where(p > 1, jnp.minimum(ring, tree), 0.0)


def hierarchical_ring_parts(p, k, intra, inter):
    """(seconds per collective, seconds per byte) of a ring reduce-scatter or all-gather of
    ``p`` ranks, ``k`` per domain: NCCL's ring latency (:func:`ring_latency_s`), and the bytes of
    one inside the domain and one of the ``n/k`` shard across the domains (both 0 for
    ``p <= 1``)."""
    a0, b0 = intra
    a1, b1 = inter
    p = jnp.asarray(p, jnp.float32)
    d = jnp.maximum(p / k, 1.0)
    latency = where(p > 1, ring_latency_s(p, k, a0, a1), 0.0)
    per_byte = _ring_factor(k) / b0 + _ring_factor(d) / (k * b1)
    return latency, per_byte


def hierarchical_reduce_scatter_s(p, n_bytes, k, intra, inter, count=1.0):
    """Reduce-scatter of ``p`` ranks, ``k`` per domain: the bytes of one inside the domain and
    one of the ``n/k`` shard across the domains (see :func:`hierarchical_all_reduce_s`), and
    NCCL's ring latency (:func:`ring_latency_s`) for each of ``count`` collectives."""
    latency, per_byte = hierarchical_ring_parts(p, k, intra, inter)
    return count * latency + n_bytes * per_byte


def hierarchical_all_gather_s(p, n_bytes, k, intra, inter, count=1.0):
    """All-gather of an ``n``-byte result over ``p`` ranks, ``k`` per domain: the bytes of the
    ``n/k`` slice each domain owns across the domains and of the whole inside the domain, and
    NCCL's ring latency for each of ``count`` collectives (as
    :func:`hierarchical_reduce_scatter_s`)."""
    return hierarchical_reduce_scatter_s(p, n_bytes, k, intra, inter, count)


def fabric_efficiency(domains, leaf_domains, congestion) -> Float[Array, ""]:
    """Share of the inter-domain bandwidth a collective keeps across ``domains`` scale-up
    domains when one rail-optimised leaf group holds ``leaf_domains`` of them:
    ``1 / (1 + c·log2(D / D_leaf))`` beyond one group, 1 within (or when ``leaf_domains`` is 0).

    Within a leaf group (the DGX SuperPOD scalable unit: 32 DGX nodes, or 8 GB200 NVL72 racks,
    NVIDIA DGX SuperPOD reference architectures) every rail is one non-blocking switch; beyond,
    the traffic crosses spine switches whose equal-cost paths are picked by hashing a few large
    flows, which collide (ECMP hash polarization: Qian et al. 2024, Alibaba HPN; Gangidi et al.
    2024, Meta's RoCE fabric at ~80% of its bandwidth; Jiang et al. 2024, MegaScale §3.3). The
    calibrated ``c`` (``fabric_congestion``) is the loss per doubling of the groups spanned.
    """
    d = jnp.asarray(domains, jnp.float32)
    spread = (leaf_domains > 0) & (d > leaf_domains)
    ratio = where(spread, d / jnp.maximum(leaf_domains, 1.0), 1.0)
    return where(spread, 1.0 / (1.0 + congestion * jnp.log2(ratio)), 1.0)


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
    t_remote = where(remote > 0, remote * a1 + remote / jnp.maximum(p, 1.0) * n_bytes / b1, 0.0)
    return where(p > 1, jnp.maximum(t_local, t_remote), 0.0)
