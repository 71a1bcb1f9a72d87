"""One federated round as one jitted function: the only place where clients are vmapped.

Contract: :func:`make_round` closes over the static :class:`RoundSpec` and returns
``run_round(state, inputs, hyper) -> (state, RoundMetrics)``, pure and jittable. A round

1. samples ``cohort`` clients without replacement (:func:`sample_uniform`, or Gumbel-top-k
   proportionally to data size), keyed by ``fold_in(key, round)`` so that a resumed run repeats it;
2. draws availability and stragglers (a straggler runs a random number of epochs in ``[1, E]``,
   Li et al. 2020 §5.2) and times every client with :func:`fl.systems.client_time_s`; FedAvg drops
   stragglers and clients that miss the deadline, FedProx keeps their partial work;
3. (:mod:`fl.cohort`) sorts the cohort by local steps, longest first (bucketing), and cuts it
   into the chunks of :attr:`RoundSpec.segments`: chunks that grow 4x from ``unit`` clients up
   to ``chunk``, then equal chunks of at most ``chunk`` clients (``lax.scan`` over them bounds memory). In a chunk,
   ``vmap(train_step)`` runs inside a loop whose trip count is that chunk's largest step count,
   with masks for shorter clients (each iteration also computes the next step's batch positions,
   carried to the next iteration, see :func:`fl.local_update.train_step`). The growing head puts
   the few longest clients of a heavy-tailed cohort into small chunks, so that they do not make
   hundreds of short clients run masked steps; the client axis is sharded over ``mesh`` when one
   is given;
4. aggregates the weighted updates (or clipped + noised for DP-FedAvg), applies the server optax
   transformation, and updates SCAFFOLD's control variates for the whole population.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jaxtyping import Array, Float, Int

from fl import aggregation as agg
from fl import local_update as lu
from fl.cohort import CohortSums, arrange_cohort, train_cohort
from fl.sampling import sample_uniform
from fl.server import Algorithm, server_update
from fl.systems import Systems, client_time_s


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ServerState:
    """Global model, server optimiser state, SCAFFOLD controls and the round counter.

    ``client_controls`` has a leading ``[clients]`` axis (the whole population) or is ``None``.
    """

    params: object
    opt_state: object
    control: object
    client_controls: object
    round: Int[Array, ""]
    key: Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RoundInputs:
    """Device-resident data of a run: pool, population and per-client systems."""

    data: lu.LocalData
    starts: Int[Array, " clients"]
    sizes: Int[Array, " clients"]
    systems: Systems


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Hyper:
    """Numbers of a run that one might sweep (array leaves)."""

    mu: Float[Array, ""]
    client_lr: Float[Array, ""]
    straggler_fraction: Float[Array, ""]
    deadline_s: Float[Array, ""]
    clip_norm: Float[Array, ""]
    noise_multiplier: Float[Array, ""]
    max_local_steps: Int[Array, ""]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RoundMetrics:
    """What one round did."""

    clients_sampled: Int[Array, ""]
    clients_kept: Int[Array, ""]
    round_time_s: Float[Array, ""]
    bytes_up: Float[Array, ""]
    bytes_down: Float[Array, ""]
    local_loss: Float[Array, ""]
    finite: Array


@dataclasses.dataclass(frozen=True)
class RoundSpec:
    """Static shape and mode choices of a round."""

    local: lu.LocalSpec
    algorithm: Algorithm
    cohort: int
    chunk: int
    sampling: str = "uniform"
    flops_per_sample: float = 0.0
    param_bytes: float = 0.0
    mesh: Mesh | None = None

    @property
    def unit(self) -> int:
        """Chunk sizes are multiples of this (the number of devices the client axis spans)."""
        return 1 if self.mesh is None else int(self.mesh.devices.size)

    @property
    def segments(self) -> tuple[tuple[int, int], ...]:
        """``(chunk clients, number of chunks)`` groups covering the size-sorted cohort in order:
        a head of single chunks of ``unit, 4 unit, 16 unit, ...`` (below ``chunk``), then the rest
        split evenly into chunks of at most ``chunk`` clients (padded to a multiple of ``unit``)."""
        u, groups, covered, size = self.unit, [], 0, self.unit
        while size < self.chunk and covered + size < self.cohort:
            groups.append((size, 1))
            covered += size
            size *= 4
        rest = self.cohort - covered
        if rest > 0:
            count = -(-rest // self.chunk)
            per = -(-rest // count)
            groups.append((-(-per // u) * u, count))
        return tuple(groups)

    @property
    def slots(self) -> int:
        """Client slots of all chunks (the cohort plus padding)."""
        return sum(size * count for size, count in self.segments)

    @property
    def payload_bytes(self) -> float:
        """Bytes each way per client: the model, plus SCAFFOLD's control variate."""
        return (2.0 if self.algorithm.scaffold else 1.0) * self.param_bytes


def init_server_state(spec: RoundSpec, params, num_clients: int, seed: int) -> ServerState:
    """The state before round 0."""
    zeros = agg.tree_zeros_like(params)
    controls = None
    if spec.algorithm.scaffold:
        controls = jax.tree.map(lambda p: jnp.zeros((num_clients, *p.shape), p.dtype), params)
    return ServerState(
        params=params,
        opt_state=spec.algorithm.server_opt.init(params),
        control=zeros if spec.algorithm.scaffold else None,
        client_controls=controls,
        round=jnp.zeros((), jnp.int32),
        key=jax.random.key(seed),
    )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CohortPlan:
    """Who trains this round and how much (all ``[cohort]``), and the round's time."""

    ids: Int[Array, " cohort"]
    n: Int[Array, " cohort"]
    steps: Int[Array, " cohort"]
    weight: Float[Array, " cohort"]
    kept: Array
    available: Array
    round_time_s: Float[Array, ""]
    train_key: Array
    noise_key: Array


def plan_cohort(
    spec: RoundSpec, state: ServerState, inputs: RoundInputs, hyper: Hyper
) -> CohortPlan:
    """Steps 1 and 2 of a round (see module): sample, draw the systems, time every client."""
    local, alg = spec.local, spec.algorithm
    m = spec.cohort
    bsz, epochs = local.batch_size, local.max_epochs
    num_clients = inputs.sizes.shape[0]
    key = jax.random.fold_in(state.key, state.round)
    k_s, k_a, k_st, k_e, k_t, k_n = jax.random.split(key, 6)

    if spec.sampling == "uniform":
        ids = sample_uniform(k_s, num_clients, m)
    else:  # Gumbel-top-k with log-size logits: proportional to data size, without replacement
        logits = jnp.log(inputs.sizes.astype(jnp.float32))
        _, ids = jax.lax.top_k(jax.random.gumbel(k_s, (num_clients,)) + logits, m)
    n = inputs.sizes[ids]
    sys_k = jax.tree.map(lambda a: a[ids], inputs.systems)

    avail = jax.random.uniform(k_a, (m,)) < sys_k.availability
    straggler = jax.random.uniform(k_st, (m,)) < hyper.straggler_fraction
    rand_epochs = jax.random.randint(k_e, (m,), 1, epochs + 1)
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
        late = times(full_steps).total_s > hyper.deadline_s
        kept = avail & ~straggler & ~late
        cut = avail & ~straggler & late
        steps = full_steps
    steps = jnp.where(kept, steps, 0)
    t = times(steps).total_s
    # The server waits for the slowest kept client, or until the deadline if it cut anyone.
    round_time = jnp.maximum(
        jnp.max(jnp.where(kept, t, 0.0)), jnp.where(jnp.any(cut), hyper.deadline_s, 0.0)
    )
    if alg.dp or spec.sampling != "uniform":
        weight = kept.astype(jnp.float32)
    else:
        weight = jnp.where(kept, n.astype(jnp.float32), 0.0)
    return CohortPlan(
        ids=ids,
        n=n,
        steps=steps,
        weight=weight,
        kept=kept,
        available=avail,
        round_time_s=round_time,
        train_key=k_t,
        noise_key=k_n,
    )


def server_step(
    spec: RoundSpec, state: ServerState, hyper: Hyper, sums: CohortSums, noise_key, num_clients
) -> ServerState:
    """Step 4: the weighted mean update (DP: the noised sum over the cohort), the server optax
    step (skipped when no client was kept) and SCAFFOLD's global control."""
    alg, g = spec.algorithm, state.params
    any_kept = sums.weight > 0
    if alg.dp:
        std = hyper.noise_multiplier * hyper.clip_norm
        noised = agg.gaussian_noise(sums.delta, noise_key, std)
        mean_delta = jax.tree.map(lambda s_: s_ / spec.cohort, noised)
    else:
        mean_delta = jax.tree.map(lambda s_: s_ / jnp.maximum(sums.weight, 1e-12), sums.delta)
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
        round=state.round + 1,
        key=state.key,
    )


def round_metrics(spec: RoundSpec, plan: CohortPlan, sums: CohortSums, params) -> RoundMetrics:
    """The round's metrics: clients, systems time, bytes each way, loss, finiteness."""
    payload = spec.payload_bytes
    return RoundMetrics(
        clients_sampled=jnp.asarray(spec.cohort, jnp.int32),
        clients_kept=jnp.sum(plan.kept).astype(jnp.int32),
        round_time_s=plan.round_time_s,
        bytes_up=payload * jnp.sum(plan.kept),
        bytes_down=payload * jnp.sum(plan.available),
        local_loss=sums.loss / jnp.maximum(sums.weight, 1e-12),
        finite=agg.all_finite(params),
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
        return new_state, round_metrics(spec, plan, sums, new_state.params)

    return run_round


def make_evaluate(apply, batch: int = 2048):
    """Builds ``evaluate(params, x, y) -> (loss, accuracy)`` over fixed-size padded batches."""

    def evaluate(params, x: Float[Array, "n ..."], y: Int[Array, " n"]):
        n = x.shape[0]
        nb = -(-n // batch)
        pad = nb * batch - n
        xp = jnp.concatenate([x, jnp.zeros((pad, *x.shape[1:]), x.dtype)]).reshape(
            nb, batch, *x.shape[1:]
        )
        yp = jnp.concatenate([y, jnp.zeros((pad,), y.dtype)]).reshape(nb, batch)
        mask = (jnp.arange(nb * batch) < n).reshape(nb, batch).astype(jnp.float32)

        def one(args):
            xb, yb, mb = args
            logits = apply(params, xb)
            logp = jax.nn.log_softmax(logits)
            nll = -jnp.take_along_axis(logp, yb[:, None], axis=1)[:, 0]
            correct = (jnp.argmax(logits, axis=1) == yb).astype(jnp.float32)
            return jnp.sum(nll * mb), jnp.sum(correct * mb)

        nll, correct = jax.lax.map(one, (xp, yp, mask))
        return jnp.sum(nll) / n, jnp.sum(correct) / n

    return evaluate
