"""Rényi-DP accountant for the sampled Gaussian mechanism (DP-FedAvg's privacy report).

Contract: :func:`rdp_sampled_gaussian` is the RDP of one round that samples each client with
probability ``q`` and adds Gaussian noise of ``noise_multiplier`` × clip norm to the sum of clipped
updates, at integer orders ``α`` (Mironov, Talwar & Zhang 2019, "Rényi Differential Privacy of the
Sampled Gaussian Mechanism", section 3.3): ``A_α = Σ_k C(α,k) (1-q)^(α-k) q^k exp((k²-k)/(2σ²))``,
``RDP(α) = log A_α / (α-1)``. RDP composes additively over rounds, and :func:`epsilon` converts it
with ``ε = min_α T·RDP(α) + log(1/δ)/(α-1)`` (Mironov 2017, proposition 3). With integer orders this
is Abadi et al. (2016)'s moments accountant. Host-side numpy; no jit.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

DEFAULT_ORDERS = tuple(range(2, 257))


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def rdp_sampled_gaussian(q: float, noise_multiplier: float, order: int) -> float:
    """RDP at integer ``order`` ≥ 2 of one sampled Gaussian step (sampling rate ``q``)."""
    if noise_multiplier <= 0:
        return math.inf
    if q <= 0:
        return 0.0
    s2 = noise_multiplier**2
    if q >= 1:
        return order / (2.0 * s2)
    terms = [
        _log_comb(order, k)
        + (order - k) * math.log1p(-q)
        + k * math.log(q)
        + (k * k - k) / (2.0 * s2)
        for k in range(order + 1)
    ]
    m = max(terms)
    log_a = m + math.log(sum(math.exp(t - m) for t in terms))
    return log_a / (order - 1)


@dataclasses.dataclass(frozen=True)
class PrivacyReport:
    """ε at δ after ``rounds`` rounds, and the RDP order that gave it."""

    epsilon: float
    delta: float
    order: int
    noise_multiplier: float
    sampling_rate: float
    rounds: int


def epsilon(
    q: float,
    noise_multiplier: float,
    rounds: int,
    delta: float,
    orders: tuple[int, ...] = DEFAULT_ORDERS,
) -> PrivacyReport:
    """(ε, δ) of ``rounds`` compositions of the sampled Gaussian mechanism (see module)."""
    rdp = np.array([rdp_sampled_gaussian(q, noise_multiplier, a) for a in orders]) * rounds
    eps = rdp + math.log(1.0 / delta) / (np.array(orders, float) - 1.0)
    i = int(np.argmin(eps))
    return PrivacyReport(
        epsilon=float(eps[i]),
        delta=delta,
        order=int(orders[i]),
        noise_multiplier=noise_multiplier,
        sampling_rate=q,
        rounds=rounds,
    )
