"""Uniform client sampling without replacement: exact in both regimes, against numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fl import sampling


@pytest.mark.parametrize("n,m", [(30, 10), (100, 10), (1000, 20), (1_000_000, 10_000)])
def test_sample_is_distinct_and_in_range(n, m):
    ids = np.asarray(sampling.sample_uniform(jax.random.key(n), n, m))
    assert ids.shape == (m,) and len(set(ids.tolist())) == m
    assert ids.min() >= 0 and ids.max() < n


def test_dense_regime_is_gumbel_top_k():
    # Populations up to SPARSE_SAMPLING_RATIO x the cohort keep Gumbel-top-k's draws.
    n, m = 16 * 10, 10
    key = jax.random.key(3)
    want = jax.lax.top_k(jax.random.gumbel(key, (n,)), m)[1]
    np.testing.assert_array_equal(sampling.sample_uniform(key, n, m), want)


def test_distinct_draws_keep_the_first_distinct_values_in_draw_order():
    n, m, draws = 12, 6, 9
    for seed in range(50):
        key = jax.random.key(seed)
        ids, enough = sampling._distinct_draws(key, n, m, draws)
        x = np.asarray(jax.random.randint(key, (draws,), 0, n, jnp.int32))
        seen = list(dict.fromkeys(x.tolist()))  # first occurrences, in draw order
        assert bool(enough) == (len(seen) >= m)
        if len(seen) >= m:
            assert np.asarray(ids).tolist() == seen[:m]


@pytest.mark.parametrize("n,m", [(100, 5), (400, 20)])
def test_sparse_regime_is_uniform(n, m):
    # Every client is included with probability m / n, and the first slot is uniform too.
    assert n > sampling.SPARSE_SAMPLING_RATIO * m
    trials = 4000
    keys = jax.random.split(jax.random.key(11), trials)
    ids = np.asarray(jax.jit(jax.vmap(lambda k: sampling.sample_uniform(k, n, m)))(keys))
    counts = np.bincount(ids.ravel(), minlength=n)
    expected = trials * m / n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < n - 1 + 5 * np.sqrt(2 * (n - 1)), counts  # mean n-1, sd sqrt(2(n-1))
    first = np.bincount(ids[:, 0], minlength=n)
    chi2_first = float(((first - trials / n) ** 2 / (trials / n)).sum())
    assert chi2_first < n - 1 + 5 * np.sqrt(2 * (n - 1)), first


@pytest.mark.slow
def test_sparse_regime_falls_back_when_draws_repeat(monkeypatch):
    # With no margin for repeats, some keys' draws repeat: those take Gumbel-top-k's sample.
    monkeypatch.setattr(sampling, "_num_draws", lambda n, m: m)
    n, m = 170, 10
    keys = jax.random.split(jax.random.key(5), 40)

    def reference(key):
        k_draw, k_fallback = jax.random.split(key)
        ids, enough = sampling._distinct_draws(k_draw, n, m, m)
        fallback = jax.lax.top_k(jax.random.gumbel(k_fallback, (n,)), m)[1]
        return jnp.where(enough, ids, fallback), enough

    want, enough = jax.jit(jax.vmap(reference))(keys)
    got = jax.jit(jax.vmap(lambda k: sampling.sample_uniform(k, n, m)))(keys)
    np.testing.assert_array_equal(got, want)
    assert set(np.asarray(enough).tolist()) == {True, False}
