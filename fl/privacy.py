"""DP-FedAvg's privacy report, from Google's ``dp-accounting`` (no accountant written here).

Contract: a round of DP-FedAvg samples a *fixed-size* cohort of ``m`` of the ``N`` clients
uniformly without replacement, clips each update to L2 norm ``C`` and adds ``N(0, (zC)²)`` to
the sum. That is not Poisson sampling, so the round is accounted as
``SampledWithoutReplacementDpEvent(N, m, GaussianDpEvent(z / 2))`` in dp-accounting's
:class:`~dp_accounting.rdp.RdpAccountant` with the replace-one neighbouring relation (the
relation fixed-size sampling needs; the population size is public): the RDP bound of Wang,
Balle & Kasiviswanathan (2019), "Subsampled Rényi Differential Privacy and Analytical Moments
Accountant", theorem 27. The multiplier is ``z / 2`` because replacing one client's update moves
the clipped sum by up to ``2C``. RDP composes over rounds, and ε at δ is the accountant's
conversion. With adaptive clipping the same ``z`` holds for the pair (count, sum) of releases
(Andrew et al. 2021, theorem 1). Host-side; no jit.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # dp-accounting pulls in scipy.signal (about a second): imported where used
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

ACCOUNTANT = "dp-accounting RdpAccountant (RDP, replace-one neighbours)"
SAMPLING_BOUND = (
    "fixed-size sampling without replacement: dp-accounting's SampledWithoutReplacementDpEvent "
    "(Wang, Balle & Kasiviswanathan 2019, theorem 27), Gaussian multiplier z/2 for the "
    "replace-one sensitivity 2C"
)


def round_event(num_clients: int, cohort: int, noise_multiplier: float) -> dp_accounting.DpEvent:
    """The dp-accounting event of one DP-FedAvg round (see module)."""
    import dp_accounting

    return dp_accounting.SampledWithoutReplacementDpEvent(
        source_dataset_size=num_clients,
        sample_size=cohort,
        event=dp_accounting.GaussianDpEvent(noise_multiplier / 2.0),
    )


def new_accountant() -> RdpAccountant:
    """An empty accountant of the kind :func:`epsilon` uses."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    return RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)


@dataclasses.dataclass(frozen=True)
class PrivacyReport:
    """ε at δ after each round ``1..rounds`` (``epsilons``), the last of them, and how."""

    epsilons: tuple[float, ...]
    delta: float
    order: float
    noise_multiplier: float
    sampling_rate: float
    accountant: str = ACCOUNTANT
    sampling_bound: str = SAMPLING_BOUND

    @property
    def epsilon(self) -> float:
        return self.epsilons[-1] if self.epsilons else 0.0


def epsilon(
    num_clients: int, cohort: int, noise_multiplier: float, rounds: int, delta: float
) -> PrivacyReport:
    """(ε, δ) after every round of ``rounds`` DP-FedAvg rounds (see module).

    One round's RDP curve comes from the accountant once; round ``r``'s is ``r`` times it
    (RDP composes additively), converted with dp-accounting's ``compute_epsilon``, so that ε
    after every round costs one accountant call in all.
    """
    if noise_multiplier <= 0:
        return PrivacyReport(
            (float("inf"),) * rounds, delta, float("nan"), noise_multiplier, cohort / num_clients
        )
    from dp_accounting.rdp import compute_epsilon

    acc = new_accountant()
    acc.compose(round_event(num_clients, cohort, noise_multiplier), 1)
    one = np.asarray(acc._rdp)  # one round's RDP at acc._orders (no public getter)
    eps, order = [], float("nan")
    for r in range(1, rounds + 1):
        e, order = compute_epsilon(acc._orders, one * r, delta)
        eps.append(float(e))
    return PrivacyReport(tuple(eps), delta, float(order), noise_multiplier, cohort / num_clients)
