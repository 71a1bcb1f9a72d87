"""One federated round as one jitted function: the only place where clients are vmapped.

Contract: :func:`make_round` closes over the static :class:`RoundSpec` and returns
``run_round(state, inputs, hyper) -> (state, RoundMetrics)``, pure and jittable. A round

1. samples ``cohort`` clients (with a trace, :mod:`fl.traces`, only among the clients available
   at the round's simulated start, :func:`sample_available`; if fewer are, the cohort is smaller):
   uniformly without replacement (:func:`sample_uniform`, weighted
   by data size ``n_k``), or ``cohort`` i.i.d. draws with replacement proportional to ``n_k`` and a
   plain average over the draws (:func:`sample_by_size`, FedProx's scheme; a client drawn twice
   trains once and counts twice). Keyed by ``fold_in(key, round)`` so that a resumed run repeats it;
2. draws availability and stragglers as FedProx's reference code does (``flearn/trainers/
   fedprox.py``: exactly ``m − round(m·(1 − f))`` of the ``m`` sampled clients straggle, each doing
   ``randint(1, E)`` = 1..E−1 epochs) and times every client with
   :func:`fl.systems.client_time_s`; FedAvg drops stragglers and clients that miss the deadline,
   FedProx keeps their partial work. A client that does not answer (unavailable, dropped or cut)
   holds the server until the deadline, or without one for as long as its full work would take
   (the server's timeout), so a round that nobody answers still costs time;
3. (:mod:`fl.cohort`) sorts the cohort by local steps, longest first (bucketing), and cuts it
   into the chunks of :attr:`RoundSpec.segments`: where the population is heavy-tailed
   (:attr:`RoundSpec.head`), chunks that grow 4x from ``unit`` clients up to ``chunk``, then
   equal chunks of at most ``chunk`` clients (``lax.scan`` over them bounds memory). In a chunk,
   step 0 is vmapped with the global model unbatched (every client starts from it, so its forward
   pass is one matmul over the chunk's batches), then
   ``vmap(train_step)`` runs inside a loop whose trip count is that chunk's largest step count,
   with masks for shorter clients (each iteration also computes the next step's batch positions,
   carried to the next iteration, see :func:`fl.local_update.train_step`). The growing head puts
   the few longest clients of a heavy-tailed cohort into small chunks, so that they do not make
   hundreds of short clients run masked steps; the client axis is sharded over ``mesh`` when one
   is given;
4. aggregates the weighted updates (or clipped + noised for DP-FedAvg, with the clip norm adapted
   to a target quantile of the update norms when asked, Andrew et al. 2021), applies the server
   optax transformation, and updates SCAFFOLD's control variates for the whole population.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from fl import aggregation as agg
from fl.algorithm import AggregateContext
from fl.cohort import CohortSums, arrange_cohort, train_cohort
from fl.sampling import multiplicity, sample_available, sample_by_size, sample_uniform
from fl.server import server_update
from fl.state import CohortPlan, Hyper, RoundInputs, RoundMetrics, RoundSpec, ServerState
from fl.systems import client_time_s
from fl.tasks import CLASSIFICATION, Task
from fl.traces import available_now

__all__ = [  # the round's types live in fl.state; they are re-exported here, where rounds are made
    "CohortPlan",
    "Hyper",
    "RoundInputs",
    "RoundMetrics",
    "RoundSpec",
    "ServerState",
    "init_server_state",
    "make_evaluate",
    "make_round",
    "plan_cohort",
    "round_metrics",
    "round_time_s",
    "sample_cohort",
    "server_step",
]


def init_server_state(
    spec: RoundSpec, params, num_clients: int, seed: int, clip_norm: float = 1.0
) -> ServerState:
    """The state before round 0 (``clip_norm``: DP-FedAvg's initial clip norm)."""
    zeros = agg.tree_zeros_like(params)
    controls = None
    if spec.algorithm.scaffold:
        controls = jax.tree.map(lambda p: jnp.zeros((num_clients, *p.shape), p.dtype), params)
    return ServerState(
        params=params,
        opt_state=spec.algorithm.server_opt.init(params),
        control=zeros if spec.algorithm.scaffold else None,
        client_controls=controls,
        clip_norm=jnp.float32(clip_norm),
        round=jnp.zeros((), jnp.int32),
        key=jax.random.key(seed),
        clock_s=jnp.zeros((), jnp.float32),
    )


def sample_cohort(spec: RoundSpec, state: ServerState, inputs: RoundInputs, key) -> tuple:
    """Step 1: the cohort's ``[cohort]`` client ids and how many draws each slot stands for
    (0: a slot that is not contacted, a repeated draw or nobody available)."""
    m, num_clients = spec.cohort, inputs.sizes.shape[0]
    if inputs.systems.hourly_availability is not None:  # a trace: who is available now
        key, k_now = jax.random.split(key)
        now = available_now(k_now, inputs.systems, state.clock_s)
        ids = sample_available(key, now, m)
        return ids, now[ids].astype(jnp.int32)
    if spec.sampling == "uniform":
        return sample_uniform(key, num_clients, m), jnp.ones((m,), jnp.int32)
    # FedProx: m i.i.d. draws proportional to n_k, a repeated client trained once
    ids = sample_by_size(key, inputs.sizes, m)
    return ids, multiplicity(ids, num_clients)


def client_weight(spec: RoundSpec, kept, copies, n) -> Float[Array, " cohort"]:
    """Each slot's weight in the mean update: DP-FedAvg 1 per kept client (the sum is divided by
    the cohort), size sampling its draws (the plain average over the ``m`` draws), else ``n_k``."""
    if spec.algorithm.weighting == "uniform":
        return kept.astype(jnp.float32)
    if spec.sampling == "size":
        return jnp.where(kept, copies.astype(jnp.float32), 0.0)
    return jnp.where(kept, n.astype(jnp.float32), 0.0)


def round_time_s(t, full_t, kept, cut, contacted, hyper: Hyper) -> Float[Array, ""]:
    """The round's time: the server waits for the slowest kept client (``t``), until the deadline
    if it cut anyone, and for a client that never answers until the deadline or, without one, its
    full work's time (``full_t``)."""
    missing = contacted & ~kept
    wait_missing = jnp.where(
        jnp.isfinite(hyper.deadline_s),
        hyper.deadline_s,
        jnp.max(jnp.where(missing, full_t, 0.0)),
    )
    slowest = jnp.maximum(
        jnp.max(jnp.where(kept, t, 0.0)), jnp.where(jnp.any(cut), hyper.deadline_s, 0.0)
    )
    return jnp.maximum(slowest, jnp.where(jnp.any(missing), wait_missing, 0.0))


def plan_cohort(
    spec: RoundSpec, state: ServerState, inputs: RoundInputs, hyper: Hyper
) -> CohortPlan:
    """Steps 1 and 2 of a round (see module): sample, draw the systems, time every client."""
    local, alg = spec.local, spec.algorithm
    m = spec.cohort
    bsz, epochs = local.batch_size, local.max_epochs
    key = jax.random.fold_in(state.key, state.round)
    k_s, k_a, k_st, k_e, k_t, k_n = jax.random.split(key, 6)

    ids, copies = sample_cohort(spec, state, inputs, k_s)
    contacted = copies > 0
    n = inputs.sizes[ids]
    sys_k = jax.tree.map(lambda a: a[ids], inputs.systems)

    avail = contacted & (jax.random.uniform(k_a, (m,)) < sys_k.availability)
    # FedProx's reference code: exactly m - round(m (1 - f)) stragglers (numpy's round is half to
    # even, as jnp.round), chosen uniformly among the m slots, each doing randint(1, E) epochs.
    num_stragglers = m - jnp.round(m * (1.0 - hyper.straggler_fraction)).astype(jnp.int32)
    slot_rank = jnp.argsort(jnp.argsort(jax.random.uniform(k_st, (m,))))
    straggler = slot_rank < num_stragglers
    rand_epochs = jax.random.randint(k_e, (m,), 1, max(epochs, 2))
    per_epoch = (n + bsz - 1) // bsz
    full_steps = jnp.minimum(per_epoch * epochs, hyper.max_local_steps)
    step_flops = bsz * spec.flops_per_sample
    payload = spec.payload_bytes

    def times(steps):
        return jax.vmap(client_time_s, in_axes=(0, None, None, 0, 0, 0, 0, 0))(
            steps * step_flops,
            payload,
            payload,
            sys_k.flops_per_s,
            sys_k.downlink_bytes_per_s,
            sys_k.uplink_bytes_per_s,
            sys_k.latency_s,
            sys_k.serialize_bytes_per_s,
        )

    full_t = times(full_steps).total_s
    if alg.straggler_policy == "partial":
        wanted = jnp.where(
            straggler, jnp.minimum(per_epoch * rand_epochs, hyper.max_local_steps), full_steps
        )
        t0 = times(jnp.zeros_like(wanted))
        fit = jnp.floor((hyper.deadline_s - t0.comm_s) * sys_k.flops_per_s / step_flops)
        fit = jnp.clip(fit, 0, jnp.iinfo(jnp.int32).max // 2).astype(jnp.int32)
        steps = jnp.minimum(wanted, fit)
        cut = avail & (steps < wanted)
        kept = avail & (steps >= 1)
    else:
        late = full_t > hyper.deadline_s
        kept = avail & ~straggler & ~late
        cut = avail & ~straggler & late
        steps = full_steps
    steps = jnp.where(kept, steps, 0)
    round_time = round_time_s(times(steps).total_s, full_t, kept, cut, contacted, hyper)
    return CohortPlan(
        ids=ids,
        n=n,
        steps=steps,
        weight=client_weight(spec, kept, copies, n),
        kept=kept,
        available=avail,
        contacted=contacted,
        round_time_s=round_time,
        train_key=k_t,
        noise_key=k_n,
    )


def server_step(
    spec: RoundSpec, state: ServerState, hyper: Hyper, sums: CohortSums, noise_key, num_clients
) -> ServerState:
    """Step 4: the weighted mean update (DP: the noised sum over the cohort), the server optax
    step (skipped when no client was kept) and SCAFFOLD's global control.

    Adaptive clipping (Andrew et al. 2021, "Differentially Private Learning with Adaptive
    Clipping", alg. 1): the noised fraction of unclipped updates
    ``b = (Σ 1[‖Δ_k‖ ≤ C] + N(0, σ_b²)) / m`` moves the clip norm geometrically,
    ``C ← C · exp(−η_C (b − γ))``, and the update sum gets noise multiplier
    ``z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2)`` so that the pair of releases costs the privacy of one
    Gaussian mechanism with multiplier ``z`` (their theorem 1)."""
    alg, g = spec.algorithm, state.params
    any_kept = sums.weight > 0
    clip = state.clip_norm
    if alg.dp:
        z = hyper.noise_multiplier
        k_delta, k_count = jax.random.split(noise_key)
        if spec.adaptive_clip:
            sb = hyper.clip_count_stddev
            z = 1.0 / jnp.sqrt(1.0 / jnp.square(z) - 1.0 / jnp.square(2.0 * sb))
            noisy = sums.unclipped + sb * jax.random.normal(k_count, ())
            frac = noisy / spec.cohort
            clip = clip * jnp.exp(-hyper.clip_lr * (frac - hyper.clip_quantile))
        noise_std = z * state.clip_norm
    else:
        k_delta, noise_std = noise_key, jnp.zeros(())
    ctx = AggregateContext(cohort=jnp.float32(spec.cohort), noise_std=noise_std, key=k_delta)
    mean_delta = alg.aggregate(sums.delta, sums.weight, ctx)
    new_params, new_opt = server_update(alg.server_opt, g, state.opt_state, mean_delta)
    new_params = jax.tree.map(lambda a, b: jnp.where(any_kept, a, b), new_params, g)
    new_opt = jax.tree.map(lambda a, b: jnp.where(any_kept, a, b), new_opt, state.opt_state)
    control = state.control
    if alg.scaffold:
        control = jax.tree.map(
            lambda cg, d: cg + d / num_clients, state.control, sums.control_delta
        )
    return ServerState(
        params=new_params,
        opt_state=new_opt,
        control=control,
        client_controls=sums.controls,
        clip_norm=clip,
        round=state.round + 1,
        key=state.key,
        clock_s=state.clock_s,
    )


def round_metrics(
    spec: RoundSpec, plan: CohortPlan, sums: CohortSums, params, clip_norm
) -> RoundMetrics:
    """The round's metrics: clients (distinct ones contacted), systems time, bytes each way,
    loss, finiteness and the clip norm the round used."""
    payload = spec.payload_bytes
    return RoundMetrics(
        clients_sampled=jnp.sum(plan.contacted).astype(jnp.int32),
        clients_kept=jnp.sum(plan.kept).astype(jnp.int32),
        round_time_s=plan.round_time_s,
        bytes_up=payload * jnp.sum(plan.kept),
        bytes_down=payload * jnp.sum(plan.available),
        local_loss=sums.loss / jnp.maximum(sums.weight, 1e-12),
        finite=agg.all_finite(params),
        clip_norm=clip_norm,
    )


def make_round(spec: RoundSpec):
    """Builds ``run_round(state, inputs, hyper) -> (state, RoundMetrics)`` (see module): plan the
    cohort, bucket it, train it chunk by chunk, step the server, and measure the round."""

    def run_round(state: ServerState, inputs: RoundInputs, hyper: Hyper):
        num_clients = inputs.sizes.shape[0]
        plan = plan_cohort(spec, state, inputs, hyper)
        arranged = arrange_cohort(spec, plan, num_clients)
        sums = train_cohort(spec, state, inputs, hyper, arranged, plan.train_key)
        new_state = server_step(spec, state, hyper, sums, plan.noise_key, num_clients)
        new_state = dataclasses.replace(new_state, clock_s=state.clock_s + plan.round_time_s)
        return new_state, round_metrics(spec, plan, sums, new_state.params, state.clip_norm)

    return run_round


def make_evaluate(apply, batch: int = 2048, task: Task = CLASSIFICATION):
    """Builds ``evaluate(params, x, y) -> (loss, accuracy)`` over fixed-size padded batches: the
    mean of ``task``'s per-sample loss and accuracy (NaN for a task without one)."""

    def evaluate(params, x: Float[Array, "n ..."], y: Int[Array, "n ..."]):
        n = x.shape[0]
        nb = -(-n // batch)
        pad = nb * batch - n
        xp = jnp.concatenate([x, jnp.zeros((pad, *x.shape[1:]), x.dtype)]).reshape(
            nb, batch, *x.shape[1:]
        )
        yp = jnp.concatenate([y, jnp.zeros((pad, *y.shape[1:]), y.dtype)])
        yp = yp.reshape(nb, batch, *y.shape[1:])
        mask = (jnp.arange(nb * batch) < n).reshape(nb, batch).astype(jnp.float32)

        def one(args):
            xb, yb, mb = args
            out = apply(params, xb)
            loss = task.loss(out, yb)
            correct = task.correct(out, yb) if task.correct is not None else jnp.zeros_like(loss)
            return jnp.sum(loss * mb), jnp.sum(correct * mb)

        loss, correct = jax.lax.map(one, (xp, yp, mask))
        accuracy = jnp.sum(correct) / n if task.correct is not None else jnp.float32(jnp.nan)
        return jnp.sum(loss) / n, accuracy

    return evaluate
