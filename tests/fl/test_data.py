"""Data sets and partitioners: the FedProx generator, coverage, skew and the compact population."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fl import data, partition
from simbase.errors import AisimError


def _reference_synthetic(alpha, beta, num_user, seed):
    """Transcription of Li et al.'s data/synthetic_1_1/generate_synthetic.py (global RNG,
    per-sample softmax argmax), seeded."""
    np.random.seed(seed)
    dimension, num_class = 60, 10
    samples_per_user = np.random.lognormal(4, 2, (num_user)).astype(int) + 50
    mean_w = np.random.normal(0, alpha, num_user)
    mean_b = mean_w
    b_ = np.random.normal(0, beta, num_user)
    mean_x = np.zeros((num_user, dimension))
    diagonal = np.array([np.power((j + 1), -1.2) for j in range(dimension)])
    cov_x = np.diag(diagonal)
    for i in range(num_user):
        mean_x[i] = np.random.normal(b_[i], 1, dimension)
    xs, ys = [], []
    for i in range(num_user):
        w = np.random.normal(mean_w[i], 1, (dimension, num_class))
        b = np.random.normal(mean_b[i], 1, num_class)
        xx = np.random.multivariate_normal(mean_x[i], cov_x, samples_per_user[i])
        yy = np.zeros(samples_per_user[i])
        for j in range(samples_per_user[i]):
            tmp = np.dot(xx[j], w) + b
            yy[j] = np.argmax(np.exp(tmp) / np.sum(np.exp(tmp)))
        xs.append(xx)
        ys.append(yy)
    return samples_per_user, xs, ys


def test_synthetic_matches_released_generator():
    sizes, xs, ys = _reference_synthetic(1.0, 1.0, 30, seed=3)
    ours_x, ours_y = data._synthetic_devices(1.0, 1.0, 30, False, np.random.RandomState(3))
    for a, b, ya, yb in zip(xs, ours_x, ys, ours_y, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(ya, yb)
    d = data.synthetic(1.0, 1.0, 30, seed=3)
    np.testing.assert_array_equal(d.population.sizes, (0.9 * sizes).astype(int))
    assert d.x_test.shape[0] == sizes.sum() - d.population.sizes.sum()
    assert d.x_train.shape[1] == 60 and d.num_classes == 10


def test_synthetic_iid_shares_one_model():
    d = data.synthetic(0, 0, 30, iid=True, seed=0)
    # One shared W: a single logistic model separates every device perfectly, so least squares on
    # one-hot labels already classifies most of the pool; and v_k = 0 makes inputs centred.
    assert abs(float(d.x_train.mean())) < 0.05
    assert data.synthetic(1, 1, 30, seed=0).x_train.mean(axis=0).std() > 0.1


def test_mnist_and_digits_splits():
    m = data.mnist(100)
    assert m.x_train.shape == (4000, 784) and m.x_test.shape == (1000, 784)
    assert m.x_train.max() <= 1.0
    d = data.digits(100, "dirichlet", 0.5)
    assert d.x_train.shape == (1437, 64) and d.x_test.shape == (360, 64)


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(50, 400),
    k=st.integers(1, 20),
    seed=st.integers(0, 100),
    name=st.sampled_from(["iid", "dirichlet", "shards", "quantity"]),
)
def test_partitions_cover_every_row_once(n, k, seed, name):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 5, n)
    try:
        pop = partition.partition(name, labels, k, rng, dirichlet_alpha=1.0)
    except AisimError:
        return  # an infeasible Dirichlet draw is reported, not hidden
    assert pop.num_clients == k and pop.sizes.min() >= 1
    np.testing.assert_array_equal(np.sort(pop.order), np.arange(n))
    rows = np.concatenate([pop.client_rows(i) for i in range(k)])
    np.testing.assert_array_equal(np.sort(rows), np.arange(n))


def test_skew_partitions_are_skewed():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), 100)
    sh = partition.shards(labels, 50, rng)
    assert max(len(np.unique(labels[sh.client_rows(i)])) for i in range(50)) <= 2
    di = partition.dirichlet(labels, 20, 0.1, rng)
    iid = partition.iid(1000, 20, rng)

    def mean_labels(pop):
        return np.mean([len(np.unique(labels[pop.client_rows(i)])) for i in range(20)])

    assert mean_labels(di) < 0.6 * mean_labels(iid)
    q = partition.quantity(1000, 20, rng, "lognormal", 1.5)
    assert q.sizes.max() > 4 * np.median(q.sizes)


def test_million_client_population_is_compact():
    d = data.synthetic_population(1_000_000, num_archetypes=40, max_samples_per_client=100)
    pop = d.population
    assert pop.num_clients == 1_000_000
    assert pop.starts.nbytes + pop.sizes.nbytes + pop.order.nbytes < 10e6
    ends = pop.starts.astype(np.int64) + pop.sizes
    assert ends.max() <= len(pop.order) and pop.sizes.min() >= 1 and pop.sizes.max() <= 100


@pytest.mark.parametrize("bad", [dict(num_clients=0), dict(num_clients=10_000)])
def test_bad_partition_sizes(bad):
    with pytest.raises(AisimError):
        data.digits(partition="iid", **bad)


def test_digits_read_from_the_file_equal_scikit_learns_loader():
    from sklearn.datasets import load_digits

    x, y = data.digits_arrays()
    d = load_digits()
    assert x.dtype == d.data.dtype and y.dtype == d.target.dtype
    np.testing.assert_array_equal(x, d.data)
    np.testing.assert_array_equal(y, d.target)
