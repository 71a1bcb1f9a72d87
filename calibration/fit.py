"""Fit the free constants to measured step times: Adam, then L-BFGS, then cross-validation.

Contract: :func:`fit` minimises :func:`calibration.objective.objective` from the preset's
raw values with ``ADAM_STEPS`` of ``optax.adam`` (robust far from the optimum) and then
``LBFGS_STEPS`` of ``optax.lbfgs`` with its zoom line search (fast and precise near it), all in
one compiled program (``lax.scan`` / ``lax.fori_loop``), so the result is deterministic. The rows
are selected by weights, so the held-out fits of cross-validation reuse the same program:
leave-one-out up to :data:`LOO_MAX_ROWS` rows, else ``k``-fold with folds drawn from ``seed``.
Uncertainties come from the Hessian of the objective in raw space (Hessian-vector products):
``Cov(θ) ≈ σ²/N · H⁻¹`` with ``σ²`` the residual variance of the log ratios (``N − p`` degrees of
freedom), mapped to physical units by the delta method, ``Cov(x) = J Cov(θ) Jᵀ``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from calibration.objective import objective, predicted_step_time_s
from calibration.parameterization import GROUPS, Parameterization
from calibration.rows import RowBatch
from perfmodel.plan.uncertainty import ConstantsCovariance, entry_values
from perfmodel.search.evaluate import fast_jit
from perfmodel.specs.constants import Constants

ADAM_STEPS = 300
ADAM_LR = 0.05
LBFGS_STEPS = 60
LOO_MAX_ROWS = 12
K_FOLDS = 5


@dataclasses.dataclass(frozen=True)
class FitResult:
    """A fit and its errors (percentages are 100·(predicted/measured − 1)).

    Attributes:
      free: the fitted entry names.
      values, stddev: physical value and 1σ uncertainty of each free entry (``None`` when the
        data cannot give one: no more rows than free constants).
      constants: the full fitted constants.
      measured_s, predicted_s, error_pct: per fitted row, shape ``(n,)``.
      cv_predicted_s, cv_error_pct: each row predicted by the fit that did not see it (NaN when
        cross-validation is impossible, with a single row).
      cv_method: ``"leave-one-out"``, ``"k-fold (k=5)"`` or ``"none"``.
      loss: the objective at the optimum.
    """

    free: tuple[str, ...]
    values: dict[str, float]
    stddev: dict[str, float | None]
    constants: Constants
    measured_s: np.ndarray
    predicted_s: np.ndarray
    error_pct: np.ndarray
    cv_predicted_s: np.ndarray
    cv_error_pct: np.ndarray
    cv_method: str
    loss: float
    # the fitted constants' covariance (perfmodel.plan.uncertainty), None with no more rows than
    # free constants
    covariance: ConstantsCovariance | None = None

    @property
    def in_sample_mape_pct(self) -> float:
        return float(np.mean(np.abs(self.error_pct)))

    @property
    def in_sample_max_error_pct(self) -> float:
        return float(np.max(np.abs(self.error_pct)))

    @property
    def cv_mape_pct(self) -> float | None:
        e = self.cv_error_pct[np.isfinite(self.cv_error_pct)]
        return float(np.mean(np.abs(e))) if e.size else None

    @property
    def cv_max_error_pct(self) -> float | None:
        e = self.cv_error_pct[np.isfinite(self.cv_error_pct)]
        return float(np.max(np.abs(e))) if e.size else None


def adam_then_lbfgs(
    f, init, *, adam_steps: int = ADAM_STEPS, lbfgs_steps: int = LBFGS_STEPS, lr: float = ADAM_LR
):
    """Minimises ``f`` from ``init`` (a PyTree of raw values): ``adam_steps`` of Adam, then
    ``lbfgs_steps`` of L-BFGS. Traceable, so callers run it inside their own ``jit``.

    Returns:
      ``(raw, f(raw))`` at the end.
    """
    import optax  # here, not at the top: commands that only predict do not load it

    adam = optax.adam(lr)

    def adam_step(carry, _):
        raw, state = carry
        upd, state = adam.update(jax.grad(f)(raw), state, raw)
        return (optax.apply_updates(raw, upd), state), None

    (raw, _), _ = jax.lax.scan(adam_step, (init, adam.init(init)), None, length=adam_steps)
    lbfgs = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(f)

    def lbfgs_step(_, carry):
        raw, state = carry
        value, g = value_and_grad(raw, state=state)
        upd, new_state = lbfgs.update(g, state, raw, value=value, grad=g, value_fn=f)
        new_raw = optax.apply_updates(raw, upd)
        # at an exact optimum (as many free constants as rows) the curvature pairs vanish and
        # L-BFGS would divide by zero: stay put instead
        ok = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(new_raw)]))
        keep = lambda a, b: jax.tree.map(lambda x, y: jnp.where(ok, x, y), a, b)  # noqa: E731
        return keep(new_raw, raw), keep(new_state, state)

    raw, _ = jax.lax.fori_loop(0, lbfgs_steps, lbfgs_step, (raw, lbfgs.init(raw)))
    return raw, f(raw)


# compiled fast (``fast_jit``): on XLA:CPU compiling the whole Adam + L-BFGS loop with the
# default options took longer than running it (a Korthikanti fit: 16.7 s -> 12.2 s end to end)
@functools.partial(fast_jit, static_argnames=("free", "adam_steps", "lbfgs_steps"))
def _solve(
    free, base, groups, order, log_t, weights, adam_steps=ADAM_STEPS, lbfgs_steps=LBFGS_STEPS
):
    param = Parameterization(base=base, free=free)

    def f(raw):
        return objective(raw, param, groups, order, log_t, weights)

    return adam_then_lbfgs(f, param.init(), adam_steps=adam_steps, lbfgs_steps=lbfgs_steps)


@functools.partial(fast_jit, static_argnames=("free",))
def _curvature(free, base, groups, order, log_t, weights, raw):
    """Hessian of the objective and Jacobian of the physical values, both in flat raw space."""
    param = Parameterization(base=base, free=free)
    flat, unravel = ravel_pytree(raw)
    grad = jax.grad(lambda x: objective(unravel(x), param, groups, order, log_t, weights))
    # one Hessian-vector product per free entry (forward over reverse), mapped rather than
    # vmapped: the same numbers as jax.hessian, at a fraction of the compile time
    h = jax.lax.map(lambda v: jax.jvp(grad, (flat,), (v,))[1], jnp.eye(flat.size, dtype=flat.dtype))
    jac = jax.jacobian(lambda x: ravel_pytree(param.physical(unravel(x)))[0])(flat)
    return h, jac


GOLDEN_STEPS = 80
_GOLDEN = 0.6180339887498949


@functools.partial(jax.jit, static_argnames=("free",))
def _solve_1d(free, base, groups, order, log_t, weights):
    """One free entry: golden-section search over raw values in [-12, 12] (no gradients needed)."""
    param = Parameterization(base=base, free=free)
    (name,) = free

    def f(x):
        return objective({name: x}, param, groups, order, log_t, weights)

    centre = param.init()[name]

    def step(_, ab):
        a, b = ab
        c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
        left = f(c) < f(d)
        return jnp.where(left, a, c), jnp.where(left, d, b)

    a, b = jax.lax.fori_loop(0, GOLDEN_STEPS, step, (centre - 12.0, centre + 12.0))
    x = 0.5 * (a + b)
    return {name: x}, f(x)


def solve(
    param: Parameterization,
    batch: RowBatch,
    measured_s: np.ndarray,
    weights: np.ndarray | None = None,
) -> tuple[dict[str, jax.Array], float]:
    """The raw values minimising the objective over the rows with weight > 0, and the loss.

    Compiled once per set of free names and row shapes, so cross-validation folds reuse it.
    """
    n = len(measured_s)
    w = np.ones(n, np.float32) if weights is None else np.asarray(weights, np.float32)
    # one free entry (the single-row `efficiency` calibration): a bracketing search, robust where
    # the step model's gradient is not finite (zero-size kernel classes of an MLP)
    fn = _solve_1d if len(param.free) == 1 else _solve
    raw, value = fn(
        param.free,
        param.base,
        batch.groups,
        jnp.asarray(batch.order),
        jnp.log(jnp.asarray(measured_s, jnp.float32)),
        jnp.asarray(w),
    )
    return raw, float(value)


def _folds(n: int, seed: int) -> list[np.ndarray]:
    if n < 2:
        return []
    if n <= LOO_MAX_ROWS:
        return [np.array([i]) for i in range(n)]
    perm = np.random.default_rng(seed).permutation(n)
    return [np.sort(f) for f in np.array_split(perm, K_FOLDS)]


def _uncertainty(param, batch, measured_s, raw, residuals) -> dict[str, float | None]:
    n, p = len(measured_s), len(param.free)
    if n <= p:
        return {k: None for k in param.free}
    h, jac = _curvature(
        param.free,
        param.base,
        batch.groups,
        jnp.asarray(batch.order),
        jnp.log(jnp.asarray(measured_s, jnp.float32)),
        jnp.ones(n, jnp.float32),
        raw,
    )
    h = np.asarray(h, np.float64)
    jac = np.asarray(jac, np.float64)
    sigma2 = float(np.sum(residuals**2) / (n - p))
    cov_raw = sigma2 / n * np.linalg.pinv(0.5 * (h + h.T))
    std = np.sqrt(np.clip(np.diag(jac @ cov_raw @ jac.T), 0.0, None))
    order = sorted(param.free)  # ravel_pytree flattens a dict of scalars in sorted-key order
    return {k: float(std[order.index(k)]) for k in param.free}


def covaried_entries(param: Parameterization) -> tuple[str, ...]:
    """The :class:`~perfmodel.specs.constants.Constants` entries a parameterization moves (its free
    entries, with each shorthand expanded into its members), each once, in order."""
    out: list[str] = []
    for e in param.free:
        for member in GROUPS.get(e, (e,)):
            if member not in out:
                out.append(member)
    return tuple(out)


def constants_covariance(
    param: Parameterization,
    raw: dict[str, jax.Array],
    cov_raw: np.ndarray,
    residual_variance: float,
    dof: int,
) -> ConstantsCovariance:
    """The covariance of the constants' entries from the covariance of the flat raw values.

    Args:
      param: the fit's parameterization.
      raw: the fitted raw values.
      cov_raw: ``(p, p)`` covariance of ``ravel_pytree(raw)`` (sorted-key order).
      residual_variance: ``σ²`` of the log residuals.
      dof: rows − free constants.
    """
    entries = covaried_entries(param)
    flat, unravel = ravel_pytree(raw)
    jac = jax.jacobian(lambda x: entry_values(param.constants(unravel(x)), entries))(flat)
    jac = np.asarray(jac, np.float64)
    cov = jac @ np.asarray(cov_raw, np.float64) @ jac.T
    return ConstantsCovariance(entries, 0.5 * (cov + cov.T), float(residual_variance), int(dof))


def fit_covariance(
    param: Parameterization,
    batch: RowBatch,
    measured_s: np.ndarray,
    raw: dict[str, jax.Array],
    weights: np.ndarray | None = None,
) -> ConstantsCovariance | None:
    """The covariance of the constants fitted to the rows with weight > 0 (``raw``), over the
    :class:`~perfmodel.specs.constants.Constants` entries they move, with the residual variance of
    the log step times (see :mod:`calibration.intervals`); None with no more rows than free
    constants."""
    measured_s = np.asarray(measured_s, np.float64)
    n_all = len(measured_s)
    w = np.ones(n_all, np.float32) if weights is None else np.asarray(weights, np.float32)
    used = w > 0
    n, p = int(used.sum()), len(param.free)
    if n <= p:
        return None
    h, _ = _curvature(
        param.free,
        param.base,
        batch.groups,
        jnp.asarray(batch.order),
        jnp.log(jnp.asarray(measured_s, jnp.float32)),
        jnp.asarray(w),
        raw,
    )
    h = np.asarray(h, np.float64)
    pred = np.asarray(predicted_step_time_s(batch, param.constants(raw)), np.float64)
    residuals = np.log(pred / measured_s)[used]
    sigma2 = float(np.sum(residuals**2) / (n - p))
    cov_raw = sigma2 / n * np.linalg.pinv(0.5 * (h + h.T))
    return constants_covariance(param, raw, cov_raw, sigma2, n - p)


def fit(
    param: Parameterization,
    batch: RowBatch,
    measured_s: np.ndarray,
    *,
    seed: int = 0,
    cross_validate: bool = True,
) -> FitResult:
    """Fits ``param``'s free constants to every row of ``batch``, then cross-validates.

    Args:
      param: the free constants over the preset.
      batch: the measured rows (:func:`calibration.rows.build_batch`).
      measured_s: measured seconds per step, shape ``(n,)``.
      seed: draws the k-fold split (leave-one-out does not use it).
      cross_validate: skip the held-out fits when False (their errors are NaN).
    """
    measured_s = np.asarray(measured_s, np.float64)
    n = len(measured_s)
    ones = np.ones(n, np.float32)
    raw, value = solve(param, batch, measured_s, ones)
    c = param.constants(raw)
    pred = np.asarray(predicted_step_time_s(batch, c), np.float64)
    err = 100.0 * (pred / measured_s - 1.0)
    cv_pred = np.full(n, np.nan)
    folds = _folds(n, seed) if cross_validate else []
    for held in folds:
        w = ones.copy()
        w[held] = 0.0
        raw_k, _ = solve(param, batch, measured_s, w)
        cv_pred[held] = np.asarray(
            predicted_step_time_s(batch, param.constants(raw_k)), np.float64
        )[held]
    method = (
        "none" if not folds else ("leave-one-out" if n <= LOO_MAX_ROWS else f"k-fold (k={K_FOLDS})")
    )
    residuals = np.log(pred / measured_s)
    std = _uncertainty(param, batch, measured_s, raw, residuals)
    values = {k: float(v) for k, v in param.physical(raw).items()}
    return FitResult(
        free=param.free,
        values=values,
        stddev=std,
        constants=c,
        measured_s=measured_s,
        predicted_s=pred,
        error_pct=err,
        cv_predicted_s=cv_pred,
        cv_error_pct=100.0 * (cv_pred / measured_s - 1.0),
        cv_method=method,
        loss=value,
        covariance=fit_covariance(param, batch, measured_s, raw),
    )
