"""FedBuff: buffered asynchronous aggregation on the simulated clock, one jitted server update.

Contract (Nguyen et al. 2022, "Federated Learning with Buffered Asynchronous Aggregation",
AISTATS, algorithm 1): ``concurrency`` clients are in flight at all times. A client is
dispatched at a simulated time ``t`` to a client that is available then and not already in
flight (:func:`pick_client`), trains on the model current at ``t`` and arrives at
``t + client_time_s`` (download, local compute, upload; :func:`fl.systems.client_time_s`). The
server adds each arriving update to a buffer with the staleness weight
``s(τ) = 1 / sqrt(1 + τ)`` (the paper's choice, §5), ``τ`` the number of server updates since the
client's model; after ``buffer_size`` arrivals it applies ``mean = Σ s(τ_k) Δ_k / K`` through the
server optax transformation (``x ← x + η_g · mean`` for SGD) and empties the buffer. Every arrival
is replaced at once by a new dispatch.

A client's update depends only on the model it starts from, so it is computed at dispatch time
(exactly equivalent to training at arrival on the stored version) and applied at its arrival.
The model does not change during one buffer fill, so the ``buffer_size`` clients dispatched in a
fill all start from the same model and train in one ``vmap`` (:func:`make_fill`). The in-flight
table keeps every in-flight client's update (``[concurrency, ...]`` per parameter leaf).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from fl import local_update as lu
from fl.aggregation import all_finite
from fl.cohort import train_chunk
from fl.round import Hyper, RoundInputs, RoundMetrics, RoundSpec, ServerState
from fl.server import server_update
from fl.systems import client_time_s
from fl.traces import SECONDS_PER_HOUR, available_now
from simbase.xla_options import fast_cpu_options

# How many times a dispatch looks again for an available client (one hour apart with a trace)
# before it takes any idle client: a week of hours.
MAX_WAITS = 24 * 7


def staleness_weight(staleness: Int[Array, "..."]) -> Float[Array, "..."]:
    """FedBuff's staleness weight ``1 / sqrt(1 + τ)`` (Nguyen et al. 2022, §5)."""
    return 1.0 / jnp.sqrt(1.0 + staleness.astype(jnp.float32))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AsyncState:
    """The server and the clients in flight (all ``[concurrency]``).

    ``ids``: who is in flight; ``finish_s``: their arrival times; ``version``: the server update
    count of the model each started from; ``delta``/``loss``: their updates (computed at
    dispatch) and mean local losses; ``clock_s``: the time of the last server update;
    ``pending``: clients dispatched at that update's time, not yet trained (the next fill trains
    them first, on the updated model).
    """

    server: ServerState
    clock_s: Float[Array, ""]
    ids: Int[Array, " concurrency"]
    finish_s: Float[Array, " concurrency"]
    version: Int[Array, " concurrency"]
    delta: object
    loss: Float[Array, " concurrency"]
    pending: Array

    @property
    def params(self):
        return self.server.params

    @property
    def round(self):
        return self.server.round


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AsyncMetrics(RoundMetrics):
    """What one server update did: :class:`fl.round.RoundMetrics`, plus the staleness of the
    updates it applied and which clients they came from."""

    staleness_mean: Float[Array, ""]
    staleness_max: Int[Array, ""]
    arrived_ids: Int[Array, " buffer"]
    arrived_staleness: Int[Array, " buffer"]


@dataclasses.dataclass(frozen=True)
class AsyncSpec:
    """Static choices of FedBuff: the round's local training and server optimiser, the buffer
    size ``K`` and the concurrency ``C``."""

    round: RoundSpec
    buffer_size: int
    concurrency: int


def pick_client(
    key: Array, inputs: RoundInputs, t_s: Float[Array, ""], busy: Array
) -> tuple[Int[Array, ""], Float[Array, ""]]:
    """One dispatch: a client drawn uniformly among those available at ``t_s`` and not ``busy``.

    Returns the client and its start time: with a trace and nobody available, the dispatch
    waits for the next hour (at most :data:`MAX_WAITS` times, then takes any idle client).
    """
    num_clients = inputs.sizes.shape[0]
    hourly = inputs.systems.hourly_availability is not None

    def look(c):
        t, _, _, tries = c
        k_a, k_g = jax.random.split(jax.random.fold_in(key, tries))
        ok = available_now(k_a, inputs.systems, t) & ~busy
        ok = jnp.where(tries >= MAX_WAITS, ~busy, ok)
        score = jnp.where(ok, jax.random.gumbel(k_g, (num_clients,)), -jnp.inf)
        found = jnp.any(ok)
        wait = (jnp.floor(t / SECONDS_PER_HOUR) + 1.0) * SECONDS_PER_HOUR if hourly else t
        return jnp.where(found, t, wait), jnp.argmax(score).astype(jnp.int32), found, tries + 1

    t, cid, _, _ = jax.lax.while_loop(
        lambda c: ~c[2], look, (t_s, jnp.int32(0), jnp.bool_(False), jnp.int32(0))
    )
    return cid, t


def client_steps(spec: RoundSpec, hyper: Hyper, n: Int[Array, "..."]) -> Int[Array, "..."]:
    """A client's local steps: ``E`` epochs of ``ceil(n / B)`` batches, capped."""
    per_epoch = (n + spec.local.batch_size - 1) // spec.local.batch_size
    return jnp.minimum(per_epoch * spec.local.max_epochs, hyper.max_local_steps)


def duration_s(spec: RoundSpec, inputs: RoundInputs, hyper: Hyper, cid) -> Float[Array, ""]:
    """Time from dispatch to arrival of client ``cid``: :func:`fl.systems.client_time_s`."""
    sys_k = jax.tree.map(lambda a: a[cid], inputs.systems)
    steps = client_steps(spec, hyper, inputs.sizes[cid])
    payload = spec.payload_bytes
    return client_time_s(
        steps * spec.local.batch_size * spec.flops_per_sample,
        payload,
        payload,
        sys_k.flops_per_s,
        sys_k.downlink_bytes_per_s,
        sys_k.uplink_bytes_per_s,
        sys_k.latency_s,
        sys_k.serialize_bytes_per_s,
    ).total_s


def train_clients(spec: RoundSpec, params, inputs: RoundInputs, hyper: Hyper, ids, keys):
    """Updates ``Δ_k`` and mean local losses of clients ``ids`` (one ``vmap``), all starting from
    ``params``; ``keys[i]`` is dispatch ``i``'s shuffling key."""
    c = ids.shape[0]
    n = inputs.sizes[ids]
    steps = client_steps(spec, hyper, n)
    tasks = lu.ClientTask(
        start=inputs.starts[ids],
        n=n,
        steps=steps,
        key=keys,
        correction=jax.tree.map(lambda p: jnp.zeros((c, *p.shape), p.dtype), params),
    )
    st = train_chunk(spec, params, inputs, hyper, tasks, jnp.max(steps))
    delta = jax.tree.map(lambda p, p0: p - p0[None], st.params, params)
    return delta, st.loss_sum / jnp.maximum(st.steps_done, 1)


def dispatch_keys(key: Array, ids: Int[Array, " k"]) -> Array:
    """Shuffling key of the ``i``-th dispatch of a fill: ``fold_in(fold_in(key, i), id)``."""
    slots = jnp.arange(ids.shape[0])
    return jax.vmap(lambda i, c: jax.random.fold_in(jax.random.fold_in(key, i), c))(slots, ids)


def fill_keys(key: Array, version) -> tuple[Array, Array]:
    """Dispatch and training keys of fill ``version`` (``None``: the first dispatches)."""
    salt = jnp.iinfo(jnp.int32).max if version is None else version
    k_pick, k_train = jax.random.split(jax.random.fold_in(key, salt))
    return k_pick, k_train


def init_async(
    spec: AsyncSpec, server: ServerState, inputs: RoundInputs, hyper: Hyper
) -> AsyncState:
    """Dispatches the first ``concurrency`` clients at time 0, all on the initial model."""
    rs, c = spec.round, spec.concurrency
    num_clients = inputs.sizes.shape[0]
    k_pick, k_train = fill_keys(server.key, None)

    def one(busy, i):
        cid, t = pick_client(jax.random.fold_in(k_pick, i), inputs, jnp.float32(0.0), busy)
        return busy.at[cid].set(True), (cid, t + duration_s(rs, inputs, hyper, cid))

    _, (ids, finish) = jax.lax.scan(one, jnp.zeros((num_clients,), bool), jnp.arange(c))
    delta, loss = train_clients(rs, server.params, inputs, hyper, ids, dispatch_keys(k_train, ids))
    return AsyncState(
        server=server,
        clock_s=jnp.float32(0.0),
        ids=ids,
        finish_s=finish,
        version=jnp.zeros((c,), jnp.int32),
        delta=delta,
        loss=loss,
        pending=jnp.zeros((c,), bool),
    )


def _train_some(spec: AsyncSpec, params, inputs, hyper, ids, keys, active):
    """:func:`train_clients` on the ``active`` of ``2K`` candidates: ``K`` wide when at most ``K``
    are active (always, but when simultaneous and staggered arrivals alternate), else all."""
    k = spec.buffer_size
    first = jnp.argsort(~active, stable=True)  # the active ones first

    def narrow():
        take = first[:k]
        d, loss = train_clients(spec.round, params, inputs, hyper, ids[take], keys[take])
        d = jax.tree.map(lambda x: jnp.zeros((2 * k, *x.shape[1:]), x.dtype).at[take].set(x), d)
        return d, jnp.zeros((2 * k,), loss.dtype).at[take].set(loss)

    def wide():
        return train_clients(spec.round, params, inputs, hyper, ids, keys)

    return jax.lax.cond(jnp.sum(active) <= k, narrow, wide)


def _make_arrive(spec: AsyncSpec, inputs: RoundInputs, hyper: Hyper, k_pick, version_now):
    """One arrival of a fill (the body of its ``lax.scan`` over ``K``): the earliest in-flight
    client arrives and a new client is dispatched into its slot at that time."""
    rs, k, c = spec.round, spec.buffer_size, spec.concurrency
    num_clients = inputs.sizes.shape[0]

    def arrive(carry, i):
        ids, finish, version, src = carry
        s = jnp.argmin(finish)
        t = finish[s]
        busy = jnp.zeros((num_clients + 1,), bool).at[ids.at[s].set(num_clients)].set(True)
        cid, start = pick_client(jax.random.fold_in(k_pick, i), inputs, t, busy[:-1])
        out = (src[s], version[s], ids[s], t, s, start)
        carry = (
            ids.at[s].set(cid),
            finish.at[s].set(start + duration_s(rs, inputs, hyper, cid)),
            version.at[s].set(version_now),
            src.at[s].set(c + k + i),
        )
        return carry, (out, cid)

    return arrive


def make_fill(spec: AsyncSpec):
    """Builds ``fill(state, inputs, hyper) -> (state, AsyncMetrics)``: one server update (see
    module), pure and jittable.

    1. ``K`` arrivals in time order (``lax.scan``): the earliest in-flight client arrives and a
       new client is dispatched into its slot at that time;
    2. a dispatch before the update's time trains now, on the current model; one at the update's
       time (simultaneous arrivals, the usual case at the start) sees the updated model, so its
       training waits for the next fill (``pending``), which trains it first; all of a fill's
       training is one ``vmap``;
    3. the staleness-weighted mean of the arrived updates goes through the server optimiser.
    """
    rs, k, c = spec.round, spec.buffer_size, spec.concurrency

    def fill(state: AsyncState, inputs: RoundInputs, hyper: Hyper):
        v = state.server.round
        k_pick, k_train = fill_keys(state.server.key, v)
        # slots dispatched at the last update's time: they train now, on this model
        pend_slots = jnp.nonzero(state.pending, size=k, fill_value=c)[0]
        pend_ok = pend_slots < c
        src0 = jnp.arange(c).at[pend_slots].set(c + jnp.arange(k), mode="drop")

        arrive = _make_arrive(spec, inputs, hyper, k_pick, v)
        carry0 = (state.ids, state.finish_s, state.version, src0)
        (ids, finish, version, src), (arr, new_ids) = jax.lax.scan(arrive, carry0, jnp.arange(k))
        a_src, a_ver, a_ids, a_t, a_slot, d_start = arr
        clock = a_t[-1]
        now = d_start < clock  # dispatched before the update: trains on this model
        cand = jnp.concatenate([state.ids[jnp.minimum(pend_slots, c - 1)], new_ids])
        active = jnp.concatenate([pend_ok, now])
        keys = dispatch_keys(k_train, cand)
        new_delta, new_loss = _train_some(
            spec, state.server.params, inputs, hyper, cand, keys, active
        )
        every = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), state.delta, new_delta)
        losses = jnp.concatenate([state.loss, new_loss])
        staleness = v - a_ver
        w = staleness_weight(staleness)
        mean = jax.tree.map(lambda d: jnp.tensordot(w, d[a_src], axes=1) / k, every)
        params, opt = server_update(
            rs.algorithm.server_opt, state.server.params, state.server.opt_state, mean
        )
        server = dataclasses.replace(state.server, params=params, opt_state=opt, round=v + 1)
        # a dispatch at (or, waiting for an available client, after) the update's time
        order = jnp.arange(k)
        again = (a_slot[None, :] == a_slot[:, None]) & (order[None, :] > order[:, None])
        newest = ~jnp.any(again, axis=1)  # the slot's last dispatch of this fill
        pending = jnp.zeros((c,), bool).at[a_slot].max(newest & ~now)
        new_state = AsyncState(
            server=server,
            clock_s=clock,
            ids=ids,
            finish_s=finish,
            version=jnp.where(pending, v + 1, version),
            delta=jax.tree.map(lambda d: d[src], every),
            loss=losses[src],
            pending=pending,
        )
        payload = rs.payload_bytes
        met = AsyncMetrics(
            clients_sampled=jnp.int32(k),
            clients_kept=jnp.int32(k),
            round_time_s=clock - state.clock_s,
            bytes_up=jnp.float32(payload * k),
            bytes_down=jnp.float32(payload * k),
            local_loss=jnp.mean(losses[a_src]),
            finite=all_finite(params),
            clip_norm=jnp.float32(0.0),
            staleness_mean=jnp.mean(staleness.astype(jnp.float32)),
            staleness_max=jnp.max(staleness),
            arrived_ids=a_ids,
            arrived_staleness=staleness,
        )
        return new_state, met

    return fill


def build_async(built, cached, static):
    """A :class:`fl.build.Built` turned into a FedBuff run: ``run_round`` is the jitted
    :func:`make_fill` and ``init_state`` the :class:`AsyncState` after the first dispatches
    (``cached(key, make)`` memoises the jitted functions by ``static``)."""
    cfg = built.cfg
    rs = dataclasses.replace(built.spec, mesh=None)  # C and K need not divide the devices
    spec = AsyncSpec(rs, cfg.buffer_size, cfg.concurrency)

    def make():
        # the fill program as the synchronous round (fl.build.round_compile_options); the
        # first dispatches run once, so they compile for a fast start on a CPU
        fill_options = fast_cpu_options() if rs.fast_compile else None
        return (
            jax.jit(make_fill(spec), compiler_options=fill_options),
            jax.jit(lambda s, i, h: init_async(spec, s, i, h), compiler_options=fast_cpu_options()),
        )

    fill, init = cached(("async", *static, cfg.buffer_size, cfg.concurrency), make)
    server = jax.device_put(built.init_state, jax.devices()[0])
    inputs = jax.device_put(built.inputs, jax.devices()[0])
    state = init(server, inputs, built.hyper)
    return dataclasses.replace(built, spec=rs, run_round=fill, init_state=state, inputs=inputs)
