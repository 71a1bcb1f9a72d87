"""Client sampling: uniform without replacement, or proportional to data size with replacement.

Contract: :func:`sample_uniform` ``(key, num_clients, m)`` returns ``m`` distinct client ids in a
uniformly random order, pure and jittable (``num_clients`` and ``m`` are static). Small
populations use Gumbel-top-k; large ones deduplicate i.i.d. draws, so a round of a 1M-client
population costs O(m log m), not O(population). :func:`sample_by_size` draws ``m`` ids i.i.d. with
probability proportional to data size (FedProx's scheme) and :func:`multiplicity` folds repeats.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

# Populations above this many times the cohort are sampled by deduplicated draws (O(m log m)),
# smaller ones by Gumbel-top-k (O(population)); both are exactly uniform.
SPARSE_SAMPLING_RATIO = 16


def _distinct_draws(key: Array, num_clients: int, m: int, draws: int) -> tuple[Array, Array]:
    """The first ``m`` distinct values of ``draws`` i.i.d. uniform draws from ``0..num_clients-1``,
    in draw order, and whether there were ``m`` distinct values."""
    x = jax.random.randint(key, (draws,), 0, num_clients, jnp.int32)
    order = jnp.argsort(x, stable=True)  # a value's first draw sorts first among its copies
    sx = x[order]
    first_sorted = jnp.concatenate([jnp.ones((1,), bool), sx[1:] != sx[:-1]])
    first = jnp.zeros((draws,), bool).at[order].set(first_sorted)
    rank = jnp.cumsum(first) - 1
    ids = jnp.zeros((m,), jnp.int32).at[jnp.where(first, rank, m)].set(x, mode="drop")
    return ids, rank[-1] + 1 >= m


def _num_draws(num_clients: int, m: int) -> int:
    """Draws for ``m`` distinct clients: ``m`` plus the expected repeats, 8 sd and 16 more."""
    repeats = m * m / num_clients
    return m + math.ceil(repeats + 8 * math.sqrt(repeats)) + 16


def sample_uniform(key: Array, num_clients: int, m: int) -> Int[Array, " m"]:
    """``m`` distinct clients drawn uniformly without replacement, in a uniformly random order.

    A population of at most :data:`SPARSE_SAMPLING_RATIO` ``x m`` clients takes Gumbel-top-k
    (Kool, van Hoof & Welling 2019), whose cost grows with the population. A larger one draws
    ``m`` plus a margin of i.i.d. clients and keeps the first ``m`` distinct ones (sequential
    sampling with rejection of repeats, exactly uniform), so that a round of a 1M-client
    population does not pay for a million random numbers and a top-k over them; if the draws
    repeat so often that fewer than ``m`` are distinct (the margin is about 8 standard deviations
    above the expected ``draws^2 / 2 population`` repeats), it falls back to Gumbel-top-k.
    """

    def gumbel_top_k(k):
        return jax.lax.top_k(jax.random.gumbel(k, (num_clients,)), m)[1].astype(jnp.int32)

    if num_clients <= SPARSE_SAMPLING_RATIO * m:
        return gumbel_top_k(key)
    k_draw, k_fallback = jax.random.split(key)
    ids, enough = _distinct_draws(k_draw, num_clients, m, _num_draws(num_clients, m))
    return jax.lax.cond(enough, lambda: ids, lambda: gumbel_top_k(k_fallback))


def sample_available(key: Array, available: Array, m: int) -> Int[Array, " m"]:
    """``m`` distinct clients drawn uniformly without replacement among the ``available`` ones
    (Gumbel-top-k with the others at ``-inf``); when fewer than ``m`` are available, the slots
    past them hold unavailable clients, which the caller must not contact."""
    g = jax.random.gumbel(key, available.shape)
    return jax.lax.top_k(jnp.where(available, g, -jnp.inf), m)[1].astype(jnp.int32)


def sample_by_size(key: Array, sizes: Int[Array, " clients"], m: int) -> Int[Array, " m"]:
    """``m`` client ids drawn i.i.d. *with replacement*, each with probability ``n_k / Σ n``.

    FedProx's sampling scheme (Li et al. 2020, "Federated Optimization in Heterogeneous
    Networks", §3: "sample a subset S_t of K devices at random ... device k chosen with
    probability p_k", with replacement), whose plain average over the ``m`` draws is an unbiased
    estimate of the size-weighted mean. Inverse-CDF on the integer cumulative sizes, so a draw
    costs ``O(log clients)`` and the distribution is exact (sizes must sum below 2³¹).
    """
    cdf = jnp.cumsum(sizes.astype(jnp.int32))
    u = jax.random.randint(key, (m,), 0, cdf[-1], jnp.int32)
    return jnp.searchsorted(cdf, u, side="right").astype(jnp.int32)


def multiplicity(ids: Int[Array, " m"], num_clients: int) -> Int[Array, " m"]:
    """For each slot, how many times its client was drawn if it is the client's first slot, else 0
    (a repeated draw is trained once and weighted by its count)."""
    m = ids.shape[0]
    slot = jnp.arange(m, dtype=jnp.int32)
    first = jnp.full((num_clients,), m, jnp.int32).at[ids].min(slot)
    count = jnp.zeros((num_clients,), jnp.int32).at[ids].add(1)
    return jnp.where(first[ids] == slot, count[ids], 0)
