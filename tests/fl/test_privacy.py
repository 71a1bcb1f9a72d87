"""DP-FedAvg's accounting is dp-accounting's, for the sampling that runs: fixed-size cohorts
without replacement (replace-one RDP, Wang et al. 2019), not Poisson."""

import math

import dp_accounting
import numpy as np
import pytest

from fl import privacy
from fl.privacy import epsilon


def test_report_equals_a_fresh_dp_accounting_accountant_every_round():
    n, m, z, delta = 30, 10, 1.2, 1e-5
    rep = epsilon(n, m, z, 20, delta)
    for r in (1, 7, 20):
        acc = dp_accounting.rdp.RdpAccountant(
            neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
        )
        event = dp_accounting.SampledWithoutReplacementDpEvent(
            n, m, dp_accounting.GaussianDpEvent(z / 2)
        )
        acc.compose(event, r)
        assert math.isclose(rep.epsilons[r - 1], acc.get_epsilon(delta), rel_tol=1e-9)
    assert "SampledWithoutReplacementDpEvent" in rep.sampling_bound
    assert np.all(np.diff(rep.epsilons) > 0)


def test_whole_population_cohort_is_the_gaussian_mechanism_of_sensitivity_2c():
    # m = N: no amplification; replacing one client moves the clipped sum by 2C, so one round is
    # the Gaussian mechanism with multiplier z/2: RDP(α) = α / (2 (z/2)²), T rounds add up.
    n, z, t, delta = 50, 4.0, 10, 1e-5
    rep = epsilon(n, n, z, t, delta)
    acc = privacy.new_accountant()
    orders = np.asarray(acc._orders, float)
    rdp = t * orders / (2 * (z / 2) ** 2)
    eps_by_hand, _ = dp_accounting.rdp.compute_epsilon(orders, rdp, delta)
    assert math.isclose(rep.epsilon, eps_by_hand, rel_tol=1e-9)
    # and the simple RDP-to-DP conversion (Mironov 2017, prop. 3) bounds it from above
    assert rep.epsilon <= np.min(rdp + math.log(1 / delta) / (orders - 1)) + 1e-9


@pytest.mark.parametrize("m", [5, 10, 20])
def test_more_noise_or_fewer_clients_sampled_is_more_private(m):
    base = epsilon(100, m, 1.0, 50, 1e-5).epsilon
    assert epsilon(100, m, 1.5, 50, 1e-5).epsilon < base
    assert epsilon(100, m, 1.0, 100, 1e-5).epsilon > base
    assert epsilon(100, 2 * m, 1.0, 50, 1e-5).epsilon > base
