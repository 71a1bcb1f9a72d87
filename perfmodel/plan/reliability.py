"""Time to train as it really goes: failures, checkpoints, restarts and stragglers.

Contract: :func:`failure_plan` turns a :class:`~perfmodel.plan.failure_model.FailureModel`, a
job's size, its failure-free compute time and its checkpoint's size into a :class:`FailurePlan`.
SI units; the job-size and time arguments may be numpy arrays (one entry per strategy). A job of
``n`` GPUs on nodes of ``g`` has ``n/g`` nodes, ``n_nic`` NICs and ``n_dom`` NVLink domains:

    λ_u = n·(r_gpu + r_mem) + n_nic·(r_net + r_nic) + ⌈n/g⌉·(r_host + r_sw) + n_dom·r_nvl
    M   = 1/λ_u (or the user's MTBF)                           job MTBF, unplanned
    w   = B / min(nodes·b_node, b_aggregate)                   checkpoint write (read alike)
    δ   = w·f_async when saving asynchronously, else w        training stalled per checkpoint
    τ   = Daly's optimum for (δ, M), Young's, or the user's;   ≥ w when asynchronous
    R   = detect + reschedule + read + warm-up (+ w − δ asynchronously: the save in flight)
    E[T_seg] = M·e^{R/M}·(e^{(τ+δ)/M} − 1)                      wall time per τ of progress
    s   = E[max of n step-time draws] / mean                   straggler slowdown
    W   = useful_s·s,  T = (W/τ)·E[T_seg] / (1 − λ_p·R_p)      R_p: a planned stop's cost
    goodput = W/T,   Var[T] ≈ λ_u·T·E[(R + x)²] + λ_p·T·R_p²    (compound Poisson)

``x`` is the work lost since the last checkpoint: the time of an exponential failure within a
segment of ``τ + δ``. Young (1974) and Daly (2006) are cited where used. Nothing here prints.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from perfmodel.plan.failure_model import FailureModel
from perfmodel.specs.choices import Dtype
from perfmodel.step.memory import model_state_bytes_per_param

SECONDS_PER_DAY = 86400.0
# quadrature grid over a standard normal for E[max]: ±9 sd in steps of 0.002 (the maximum of
# up to ~1e15 draws stays inside it)
_Z = np.linspace(-9.0, 9.0, 9001)


def _a(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _out(x):
    """A 0-d result as a float, an array as an array."""
    x = np.asarray(x, dtype=np.float64)
    return float(x) if x.ndim == 0 else x


@dataclasses.dataclass(frozen=True)
class JobRates:
    """A job's failure rates per second (floats or arrays like ``num_gpus``).

    Attributes:
      unplanned_per_s: failures that stop the job (hardware, software), λ_u.
      planned_per_s: planned interruptions (maintenance), λ_p.
      nodes: the nodes the job occupies.
      by_component_per_s: λ_u by component (``gpu``, ``gpu_memory``, ``nvlink``, ``network``,
        ``nic``, ``host``, ``software``; ``user`` for a user's MTBF).
    """

    unplanned_per_s: Any
    planned_per_s: Any
    nodes: Any
    by_component_per_s: dict[str, Any]


def job_rates(fm: FailureModel, num_gpus) -> JobRates:
    """The failure rates of a job of ``num_gpus`` GPUs: each component's rate times how many of
    it the job holds (a series system: any one failure stops a synchronous job; Kokolis et al.
    2024, arXiv:2410.21680, MTTF = 1 / (N_nodes · r_f)). A user's MTBF replaces the components:
    per job as given, per node or GPU divided by the job's count."""
    n = _a(num_gpus)
    nodes = np.ceil(n / fm.gpus_per_node)
    nics = n * fm.nics_per_node / fm.gpus_per_node
    domains = np.ceil(n / fm.gpus_per_nvlink_domain)
    r = fm.rates
    by = {
        "gpu": n * r.gpu_per_s,
        "gpu_memory": n * r.gpu_memory_per_s,
        "nvlink": domains * r.nvlink_per_s,
        "network": nics * r.network_per_s,
        "nic": nics * r.nic_per_s,
        "host": nodes * r.host_per_s,
        "software": nodes * r.software_per_s,
    }
    if fm.mtbf_s is not None:
        count = {"job": np.ones_like(n), "node": nodes, "gpu": n}[fm.mtbf_per]
        by = {"user": count / fm.mtbf_s}
    unplanned = sum(by.values())
    planned = nodes * r.planned_per_s if fm.planned else np.zeros_like(n)
    return JobRates(
        _out(unplanned), _out(planned), _out(nodes), {k: _out(v) for k, v in by.items()}
    )


def checkpoint_bytes(params: float, dtype: str = "bf16") -> float:
    """Bytes of a whole job's checkpoint: every parameter's weights and optimiser state, as the
    memory model counts them (:func:`perfmodel.step.memory.model_state_bytes_per_param`: 2 + 12
    bytes in mixed precision, 4 + 8 in fp32), once for the job (replicas write one copy).

    Args:
      params: the model's parameters (all experts of an MoE model).
      dtype: the training dtype label (``bf16``, ``fp16``, ``fp8``, ``fp32``, ``tf32``).
    """
    w, _, o = model_state_bytes_per_param(int(Dtype.parse(dtype, "dtype")))
    return float(params) * (float(w) + float(o))


@dataclasses.dataclass(frozen=True)
class CheckpointIO:
    """Seconds to write and to read one checkpoint of the whole job."""

    write_s: Any
    read_s: Any


def checkpoint_io(tier, nbytes, nodes) -> CheckpointIO:
    """Write and read times of ``nbytes`` spread over ``nodes`` nodes on a storage tier: each
    node at its own bandwidth, all together at most at the tier's aggregate."""
    nodes, b = _a(nodes), _a(nbytes)
    write_bw = np.minimum(nodes * tier.write_bytes_per_s_per_node, tier.aggregate_write_bytes_per_s)
    read_bw = np.minimum(nodes * tier.read_bytes_per_s_per_node, tier.aggregate_read_bytes_per_s)
    return CheckpointIO(_out(b / write_bw), _out(b / read_bw))


def young_interval_s(blocking_s, mtbf_s):
    """Young's optimum compute time between checkpoints, ``sqrt(2·δ·M)`` (Young 1974, CACM
    17(9):530, first order in δ/M)."""
    return _out(np.sqrt(2.0 * _a(blocking_s) * _a(mtbf_s)))


def daly_interval_s(blocking_s, mtbf_s):
    """Daly's higher-order optimum (Daly 2006, FGCS 22(3):303): for δ < 2M,
    ``sqrt(2δM)·[1 + ⅓·sqrt(δ/2M) + (1/9)·(δ/2M)] − δ``, else ``M``."""
    d, m = _a(blocking_s), _a(mtbf_s)
    with np.errstate(invalid="ignore", divide="ignore"):
        x = np.where(np.isinf(m), 0.0, d / (2.0 * m))
        tau = np.sqrt(2.0 * d * m) * (1.0 + np.sqrt(x) / 3.0 + x / 9.0) - d
    return _out(np.where(d < 2.0 * m, tau, m))


def lost_work_moments(segment_s, mtbf_s) -> tuple[Any, Any]:
    """The first two moments of the work lost to a failure: the time ``x`` since the last
    checkpoint of an exponential failure (mean ``M``) that strikes within a segment of length
    ``L``, ``E[x] = M − L·e^{−L/M}/(1 − e^{−L/M})`` (about ``L/2``) and
    ``E[x²] = (2M² − e^{−L/M}(L² + 2LM + 2M²))/(1 − e^{−L/M})`` (about ``L²/3``); below
    ``L/M = 1e-3`` their series ``L/2·(1 − a/6)`` and ``L²/3·(1 − a/4)``, ``a = L/M``."""
    L, m = _a(segment_s), _a(mtbf_s)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        a = np.where(np.isinf(m), 0.0, L / m)
        e, em = np.exp(-a), -np.expm1(-a)
        m1 = m - L * e / em
        m2 = (2.0 * m * m - e * (L * L + 2.0 * L * m + 2.0 * m * m)) / em
    small = a < 1e-3
    m1 = np.where(small, L / 2.0 * (1.0 - a / 6.0), m1)
    m2 = np.where(small, L * L / 3.0 * (1.0 - a / 4.0), m2)
    return _out(m1), _out(m2)


def expected_lost_work_s(segment_s, mtbf_s):
    """The expected work lost to one failure within a segment of ``segment_s`` (the interval
    plus the checkpoint's stall): :func:`lost_work_moments`'s first moment."""
    return lost_work_moments(segment_s, mtbf_s)[0]


def expected_segment_s(interval_s, blocking_s, restart_s, mtbf_s):
    """The expected wall time to complete one segment of ``interval_s`` of progress and its
    checkpoint when failures arrive at rate ``1/M`` and each costs a restart ``R`` that can
    itself fail (Daly 2006): ``M·e^{R/M}·(e^{(τ+δ)/M} − 1)``; ``τ + δ`` when ``M`` is
    infinite."""
    L, r, m = _a(interval_s) + _a(blocking_s), _a(restart_s), _a(mtbf_s)
    with np.errstate(invalid="ignore", over="ignore"):
        finite = m * np.exp(r / m) * np.expm1(L / m)
    return _out(np.where(np.isinf(m), L, finite))


def _expected_max(n: float, cv: float, distribution: str) -> float:
    """``E[max of n draws]`` of a unit-mean step-time multiplier with coefficient of variation
    ``cv``, by quadrature of the maximum's density ``n·φ(z)·Φ(z)^(n−1)`` (order statistics:
    David & Nagaraja, *Order Statistics*, 3rd ed., eq. 2.1.1): normal ``1 + cv·z``; lognormal
    ``exp(σz − σ²/2)``, ``σ² = ln(1 + cv²)``."""
    if n <= 1.0 or cv == 0.0:
        return 1.0
    from scipy import special  # 0.1 s to import, and only a straggler plan needs it

    log_phi = -0.5 * _Z * _Z - 0.5 * math.log(2.0 * math.pi)  # the standard normal's log density
    logpdf = math.log(n) + log_phi + (n - 1.0) * special.log_ndtr(_Z)
    w = np.exp(logpdf)
    if distribution == "normal":
        return 1.0 + cv * float(np.trapezoid(_Z * w, _Z))
    s = math.sqrt(math.log1p(cv * cv))
    return math.exp(-s * s / 2.0) * float(np.trapezoid(np.exp(s * _Z) * w, _Z))


def straggler_slowdown(num_gpus, cv: float, distribution: str = "lognormal"):
    """How much longer a synchronous step takes than a mean rank's: ``E[max of n draws] / mean``
    of ``n = num_gpus`` per-rank step times with coefficient of variation ``cv``. For a normal
    it grows as ``1 + cv·sqrt(2·ln n)`` (the Gumbel asymptote of the maximum); the quadrature
    of :func:`_expected_max` is exact to ~1e-6 for any ``n``."""
    n = _a(num_gpus)
    unique, inverse = np.unique(n.ravel(), return_inverse=True)
    values = np.array([_expected_max(float(k), float(cv), distribution) for k in unique])
    return _out(values[inverse].reshape(n.shape))


@dataclasses.dataclass(frozen=True)
class FailurePlan:
    """The failure process of one run (floats, or arrays when the inputs are).

    Attributes:
      interruptions_per_day, unplanned_per_day, planned_per_day: expected interruptions per
        day of wall-clock time (all, failures, maintenance).
      interruptions: expected interruptions over the run.
      mtbf_hours: the job's mean time between failures (unplanned).
      checkpoint_bytes: one checkpoint of the whole job.
      checkpoint_write_s, checkpoint_read_s: writing and reading it on the storage tier.
      checkpoint_blocking_s: training stalled per checkpoint (δ).
      checkpoint_interval_s: compute seconds between checkpoints (τ).
      checkpoint_overhead: the fraction of wall time stalled by checkpoints.
      restart_s: a restart after a failure (detect, reschedule, read, warm up).
      lost_work_s: work redone after a failure, on average.
      straggler_slowdown: step time with stragglers over the mean rank's.
      goodput: useful compute time over wall time (the effective training time ratio).
      useful_s: compute time without failures or stragglers; wall_s: with both.
      train_days, train_days_sd: wall-clock days and the failure process's standard deviation.
      failure_sd_log: ``train_days_sd / train_days``, the log-space spread to add to an
        interval (:func:`train_days_bounds`).
      by_component_per_day: unplanned interruptions per day by component.
    """

    interruptions_per_day: Any
    unplanned_per_day: Any
    planned_per_day: Any
    interruptions: Any
    mtbf_hours: Any
    checkpoint_bytes: Any
    checkpoint_write_s: Any
    checkpoint_read_s: Any
    checkpoint_blocking_s: Any
    checkpoint_interval_s: Any
    checkpoint_overhead: Any
    restart_s: Any
    lost_work_s: Any
    straggler_slowdown: Any
    goodput: Any
    useful_s: Any
    wall_s: Any
    train_days: Any
    train_days_sd: Any
    failure_sd_log: Any
    by_component_per_day: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The plan's fields as a JSON-ready dict (floats; ``None`` for infinite values)."""

        def plain(v):
            v = np.asarray(v, dtype=np.float64)
            if v.ndim:
                return [plain(x) for x in v]
            return float(v) if math.isfinite(float(v)) else None

        doc = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        doc["by_component_per_day"] = {k: plain(v) for k, v in self.by_component_per_day.items()}
        return {k: (v if k == "by_component_per_day" else plain(v)) for k, v in doc.items()}


def checkpoint_interval_s(fm: FailureModel, blocking_s, mtbf_s, floor_s):
    """The compute time between checkpoints: the user's, else Daly's (or Young's) optimum, and
    never below ``floor_s`` (a step; the previous asynchronous save must finish first)."""
    if fm.checkpoint_interval_s is not None:
        tau = np.full_like(_a(blocking_s), fm.checkpoint_interval_s)
    elif fm.interval_rule == "young":
        tau = _a(young_interval_s(blocking_s, mtbf_s))
    else:
        tau = _a(daly_interval_s(blocking_s, mtbf_s))
    return _out(np.maximum(tau, floor_s))


def failure_plan(
    fm: FailureModel, *, num_gpus, useful_s, checkpoint_bytes, step_time_s=None
) -> FailurePlan:
    """The failure process of a run: interruptions, checkpoints, restarts, stragglers, goodput
    and the wall time they lead to (formulas in the module docstring).

    Args:
      fm: the :class:`~perfmodel.plan.failure_model.FailureModel`.
      num_gpus: the job's GPUs (ranks that synchronise every step).
      useful_s: compute seconds without failures or stragglers (tokens / tokens per second).
      checkpoint_bytes: one checkpoint of the job (:func:`checkpoint_bytes`).
      step_time_s: seconds per step (the checkpoint interval's floor; default 1 s).

    Returns:
      A :class:`FailurePlan`; its fields are arrays when any argument is one.
    """
    rates = job_rates(fm, num_gpus)
    lam_u, lam_p = _a(rates.unplanned_per_s), _a(rates.planned_per_s)
    io = checkpoint_io(fm.storage, checkpoint_bytes, rates.nodes)
    write, read = _a(io.write_s), _a(io.read_s)
    blocking = write * (fm.async_blocking_fraction if fm.async_checkpoint else 1.0)
    with np.errstate(divide="ignore"):
        mtbf = np.where(lam_u > 0, 1.0 / np.where(lam_u > 0, lam_u, 1.0), np.inf)
    floor = np.maximum(1.0 if step_time_s is None else _a(step_time_s), write * fm.async_checkpoint)
    tau = _a(checkpoint_interval_s(fm, blocking, mtbf, floor))
    rc = fm.restart
    in_flight = write - blocking  # a failure during an asynchronous save loses its checkpoint
    restart = rc.detect_s + rc.reschedule_s + read + rc.warmup_s
    cost = restart + in_flight
    slowdown = _a(straggler_slowdown(num_gpus, fm.straggler_cv, fm.straggler_distribution))
    work = _a(useful_s) * slowdown
    with np.errstate(invalid="ignore"):
        per_progress = _a(expected_segment_s(tau, blocking, cost, mtbf)) / tau
    unplanned_wall = work * np.where(np.isinf(tau), 1.0, per_progress)  # no failure, no save
    planned_cost = rc.reschedule_s + read + rc.warmup_s + write  # save, stop, restart
    load = lam_p * planned_cost
    with np.errstate(divide="ignore"):
        wall = np.where(load < 1.0, unplanned_wall / np.maximum(1.0 - load, 1e-300), np.inf)
    m1, m2 = (_a(m) for m in lost_work_moments(tau + blocking, mtbf))
    with np.errstate(invalid="ignore"):
        per_failure = np.where(lam_u > 0, cost * cost + 2.0 * cost * m1 + m2, 0.0)
    var = lam_u * wall * per_failure + lam_p * wall * planned_cost**2
    per_day = SECONDS_PER_DAY
    return FailurePlan(
        interruptions_per_day=_out((lam_u + lam_p) * per_day),
        unplanned_per_day=_out(lam_u * per_day),
        planned_per_day=_out(lam_p * per_day),
        interruptions=_out((lam_u + lam_p) * wall),
        mtbf_hours=_out(mtbf / 3600.0),
        checkpoint_bytes=_out(checkpoint_bytes),
        checkpoint_write_s=_out(write),
        checkpoint_read_s=_out(read),
        checkpoint_blocking_s=_out(blocking),
        checkpoint_interval_s=_out(tau),
        checkpoint_overhead=_out(work / tau * blocking / wall),
        restart_s=_out(restart),
        lost_work_s=_out(m1 + in_flight),
        straggler_slowdown=_out(slowdown),
        goodput=_out(work / wall),
        useful_s=_out(useful_s),
        wall_s=_out(wall),
        train_days=_out(wall / per_day),
        train_days_sd=_out(np.sqrt(var) / per_day),
        failure_sd_log=_out(np.sqrt(var) / wall),
        by_component_per_day={
            k: _out(_a(v) * per_day) for k, v in rates.by_component_per_s.items()
        },
    )


def train_days_bounds(
    train_days: float,
    *,
    step_sd_log: float = 0.0,
    failure_sd_log: float = 0.0,
    level: float = 0.9,
    dof: int | None = None,
) -> tuple[float, float]:
    """The interval of the time to train with both its sources of spread: the constants' (the
    step time's log-space standard deviation, :mod:`perfmodel.plan.uncertainty`) and the failure
    process's (:attr:`FailurePlan.failure_sd_log`), independent, so their log-space variances
    add: ``T·exp(±q·sqrt(sd_step² + sd_fail²))``, ``q`` the two-sided Student-t quantile of
    ``level`` with ``dof`` degrees of freedom (a normal's without).
    """
    sd = math.hypot(step_sd_log, failure_sd_log)
    p = 0.5 * (1.0 + level)
    from scipy import stats  # scipy.stats takes most of a second to import: only when asked

    q = float(stats.norm.ppf(p) if dof is None else stats.t.ppf(p, dof))
    return train_days * math.exp(-q * sd), train_days * math.exp(q * sd)
