"""The fit's objective: predicted step times of stacked rows, and a robust loss on their error.

Contract: :func:`predicted_step_time_s` evaluates every row of a
:class:`~calibration.rows.RowBatch` at once (one jitted ``vmap`` per group); :func:`objective` is
the robust loss

    L(θ) = Σ_i w_i · huber(log(t̂_i(θ) / t_i), δ) / Σ_i w_i  +  λ · ‖θ − θ_preset‖²

in the raw (unconstrained) space ``θ`` of a :class:`~calibration.parameterization.Parameterization`;
the weights ``w`` select the rows (held-out rows weigh 0) without recompiling.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from calibration.parameterization import Parameterization
from calibration.rows import RowBatch, RowGroup
from perfmodel.specs.constants import Constants
from perfmodel.step.step_time import step_time

HUBER_DELTA = 0.1  # residuals beyond 10% in log space count linearly (robust to outliers)
PRIOR_WEIGHT = 1e-6  # per raw unit squared: weak, only decides what the data cannot


@jax.jit  # traced once per group structure, and reused under the fits' grad, L-BFGS and Hessian
def _group_times(groups: tuple[RowGroup, ...], order: jax.Array, c: Constants) -> jax.Array:
    times = [
        jax.vmap(step_time, in_axes=(0, None, None, 0))(g.model, g.hw, c, g.strategy).step_time_s
        for g in groups
    ]
    return jnp.concatenate(times)[order]


def predicted_step_time_s(batch: RowBatch, c: Constants) -> jax.Array:
    """Predicted seconds per step of every row, in row order (one jitted vmap per group)."""
    return _group_times(batch.groups, jnp.asarray(batch.order), c)


def objective(
    raw: dict[str, jax.Array],
    param: Parameterization,
    groups: tuple[RowGroup, ...],
    order: jax.Array,
    log_measured_s: jax.Array,
    weights: jax.Array,
    prior_weight: float = PRIOR_WEIGHT,
    delta: float = HUBER_DELTA,
) -> jax.Array:
    """The weighted Huber loss on log(predicted / measured) plus the prior (pure; jittable).

    Args:
      raw: the free entries' raw values (see :class:`Parameterization`).
      param: maps raw values to constants; its :meth:`~Parameterization.init` is the prior's centre.
      groups: the rows' groups (``RowBatch.groups``).
      order: the rows' order (``RowBatch.order``).
      log_measured_s: ``log`` of the measured seconds per step, shape ``(n,)``.
      weights: per-row weight, shape ``(n,)`` (0 leaves a row out).
    """
    import optax  # here, not at the top: commands that only predict do not load it

    pred = _group_times(groups, order, param.constants(raw))
    r = jnp.log(pred) - log_measured_s
    per_row = optax.losses.huber_loss(r, jnp.zeros_like(r), delta=delta)
    data = jnp.sum(weights * per_row) / jnp.maximum(jnp.sum(weights), 1.0)
    centre = param.init()
    prior = sum(jnp.sum((raw[k] - centre[k]) ** 2) for k in raw)
    return data + prior_weight * prior
