"""RDP accountant against published values and closed forms."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from fl.privacy import epsilon, rdp_sampled_gaussian


def test_abadi_2016_moments_accountant_example():
    # Abadi et al. (CCS 2016) §3.1: q = 0.01, σ = 4, δ = 1e-5, T = 10,000 gives ε ≈ 1.26.
    rep = epsilon(0.01, 4.0, 10_000, 1e-5)
    assert abs(rep.epsilon - 1.26) < 0.01


def test_tf_privacy_mnist_tutorial():
    # TF Privacy's compute_dp_sgd_privacy for N = 60,000, batch 256, σ = 1.1, 60 epochs,
    # δ = 1e-5 (14,064 steps) reports ε = 3.01 at order 9 with integer orders.
    rep = epsilon(256 / 60000, 1.1, 14064, 1e-5)
    assert abs(rep.epsilon - 3.01) < 0.01


def test_no_subsampling_is_the_gaussian_mechanism():
    for a in (2, 5, 32):
        assert math.isclose(rdp_sampled_gaussian(1.0, 2.0, a), a / 8.0)
    # A binomial sum at q = 1 must agree with the closed form (check the series path).
    assert math.isclose(rdp_sampled_gaussian(1 - 1e-12, 2.0, 6), 6 / 8.0, rel_tol=1e-6)


@settings(max_examples=30, deadline=None)
@given(q=st.floats(1e-4, 0.5), sigma=st.floats(0.6, 10.0), t=st.integers(1, 5000))
def test_epsilon_monotone(q, sigma, t):
    e = epsilon(q, sigma, t, 1e-5).epsilon
    assert epsilon(q, sigma * 1.5, t, 1e-5).epsilon <= e + 1e-9
    assert epsilon(q, sigma, t * 2, 1e-5).epsilon >= e - 1e-9
    assert epsilon(min(q * 2, 1.0), sigma, t, 1e-5).epsilon >= e - 1e-9
