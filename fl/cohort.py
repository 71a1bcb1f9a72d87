"""Step 3 of a round: train a planned cohort chunk by chunk, vmapped over each chunk's clients.

Contract: :func:`arrange_cohort` sorts a :class:`fl.round.CohortPlan` by local steps (longest
first) and pads it to :attr:`fl.round.RoundSpec.slots`; :func:`train_cohort` runs every chunk of
:attr:`fl.round.RoundSpec.segments` (``lax.scan`` over equal chunks) and returns the
:class:`CohortSums` that the server step needs. In a chunk, step 0 runs from the shared global
model (vmapped with it unbatched), then ``vmap(train_step)`` runs inside a
loop whose trip count is that chunk's largest step count, with masks for shorter clients; the
client axis is sharded over the spec's ``mesh`` when one is given. Pure and jittable; called only
from :func:`fl.round.make_round`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec
from jaxtyping import Array, Float

from fl import aggregation as agg
from fl import local_update as lu
from fl.algorithm import CLIENT_AXES, ClientContext
from fl.state import CohortPlan, Hyper, RoundInputs, RoundSpec, ServerState


def _shard(spec: RoundSpec, tree):
    """``tree`` with its leading (client) axis sharded over ``spec.mesh`` (if any)."""
    if spec.mesh is None:
        return tree
    sharding = NamedSharding(spec.mesh, PartitionSpec("clients"))
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, sharding), tree)


class CohortSums(NamedTuple):
    """What the chunks of a cohort add up (the carry of the scan over chunks).

    ``delta``: weighted (DP: clipped) sum of the client updates; ``weight`` and ``loss``: the sum
    of the weights and of the weighted local losses; ``control_delta``: sum of SCAFFOLD's control
    changes; ``controls``: the population's client controls (``[clients]``, or ``None``);
    ``unclipped``: DP: the kept clients whose update norm was at most the clip norm (the count
    adaptive clipping estimates its quantile from).
    """

    delta: object
    weight: Float[Array, ""]
    loss: Float[Array, ""]
    control_delta: object
    controls: object
    unclipped: Float[Array, ""]


def arrange_cohort(spec: RoundSpec, plan: CohortPlan, num_clients: int) -> dict[str, Array]:
    """Step 3's bucketing: the cohort sorted by local steps, longest first, padded to
    :attr:`RoundSpec.slots`; padding slots get ``id = num_clients`` (dropped) and no steps."""
    by_steps = jnp.argsort(-plan.steps)
    pad = spec.slots - spec.cohort

    def arrange(x, fill):
        return jnp.concatenate([x[by_steps], jnp.full((pad,), fill, x.dtype)])

    return dict(
        ids=arrange(plan.ids, num_clients),
        n=arrange(plan.n, 1),
        steps=arrange(plan.steps, 0),
        weight=arrange(plan.weight, 0.0),
        kept=arrange(plan.kept, False),
    )


def _chunk_tasks(spec: RoundSpec, state: ServerState, inputs: RoundInputs, ch, controls, train_key):
    """The local tasks of one chunk's clients and their SCAFFOLD controls (``None`` without)."""
    c = ch["ids"].shape[0]
    if spec.algorithm.scaffold:
        c_i = jax.tree.map(lambda a: jnp.take(a, ch["ids"], axis=0, mode="clip"), controls)
        correction = jax.tree.map(lambda cg, ci: cg[None] - ci, state.control, c_i)
    else:
        c_i = None
        correction = jax.tree.map(lambda p: jnp.zeros((c, *p.shape), p.dtype), state.params)
    tasks = lu.ClientTask(
        start=jnp.take(inputs.starts, ch["ids"], mode="clip"),
        n=ch["n"],
        steps=ch["steps"],
        key=jax.vmap(lambda i: jax.random.fold_in(train_key, i))(ch["ids"]),
        correction=correction,
    )
    return _shard(spec, tasks), c_i


def train_chunk(spec: RoundSpec, g, inputs: RoundInputs, hyper: Hyper, tasks, max_steps):
    """``vmap(train_step)`` over a chunk's clients for ``max_steps`` steps (shorter clients are
    masked; step 0 from the unbatched global model, skipped when ``max_steps`` is 0); returns the
    clients' final local states."""
    local = spec.local
    table = jax.vmap(lambda k, n: lu.shuffle_table(lu.shuffle_keys(k, local.max_epochs), n))(
        tasks.key, tasks.n
    )
    mu = hyper.mu
    batch_all = jax.vmap(lu.batch_rows, in_axes=(None, None, 0, 0))
    train_all = jax.vmap(lu.train_step, in_axes=(None, 0, None, 0, 0, 0, None, None, None))
    # Step 0 starts every client from the same global model: vmapped with the state unbatched,
    # its forward pass is one matmul over the chunk's batches against one copy of the weights
    # instead of a batched matmul over c broadcast copies (no broadcast is written at all).
    first_all = jax.vmap(lu.train_step, in_axes=(None, None, None, 0, 0, 0, None, None, None))

    def loop(s, carry):  # the next step's batch is computed one step ahead (train_step)
        st, slots, mask = carry
        ahead = batch_all(local, s + 1, tasks, table)
        return train_all(local, st, s, tasks, slots, mask, g, mu, inputs.data), *ahead

    zero, c = jnp.zeros((), jnp.int32), tasks.n.shape[0]
    st0 = lu.init_state(local, g)

    def first(_):
        slots0, mask0 = batch_all(local, zero, tasks, table)
        return first_all(local, st0, zero, tasks, slots0, mask0, g, mu, inputs.data)

    def idle(_):  # a chunk where nobody trains (padding, dropped clients) skips even step 0
        return jax.tree.map(lambda x: jnp.broadcast_to(x, (c, *x.shape)), st0)

    st1 = jax.lax.cond(max_steps > 0, first, idle, None)
    carry1 = (_shard(spec, st1), *batch_all(local, zero + 1, tasks, table))
    st, _, _ = jax.lax.fori_loop(1, jnp.maximum(max_steps, 1), loop, carry1)
    return st


def _scaffold_controls(state: ServerState, hyper: Hyper, ch, c_i, st, delta):
    """SCAFFOLD option II: each kept client's new control ``c_i − c + (x − y_i)/(K·lr)``; the
    others keep theirs. Returns ``(new controls of the chunk, their changes)``."""
    c = ch["ids"].shape[0]
    k_lr = jnp.maximum(st.steps_done, 1).astype(jnp.float32) * hyper.client_lr
    c_new = jax.tree.map(
        lambda ci, cg, d: ci - cg[None] - d / k_lr.reshape((c,) + (1,) * (d.ndim - 1)),
        c_i,
        state.control,
        delta,
    )
    keep = ch["kept"]
    c_new = jax.tree.map(
        lambda a, b: jnp.where(keep.reshape((c,) + (1,) * (a.ndim - 1)), a, b), c_new, c_i
    )
    return c_new, jax.tree.map(lambda a, b: a - b, c_new, c_i)


def _add_chunk(spec, state, inputs, hyper, train_key, sums: CohortSums, ch) -> CohortSums:
    """Trains one chunk of clients and adds their weighted updates, losses and controls."""
    alg, g = spec.algorithm, state.params
    ch = _shard(spec, ch)
    tasks, c_i = _chunk_tasks(spec, state, inputs, ch, sums.controls, train_key)
    st = train_chunk(spec, g, inputs, hyper, tasks, jnp.max(ch["steps"]))
    unclipped = sums.unclipped
    if alg.dp:  # adaptive clipping's count of the updates within the clip norm
        norms = jax.vmap(agg.tree_norm)(jax.tree.map(lambda p, p0: p - p0[None], st.params, g))
        unclipped = unclipped + jnp.sum(ch["weight"] * (norms <= state.clip_norm))
    ctx = ClientContext(clip_norm=state.clip_norm, num_samples=ch["n"], steps=st.steps_done)
    delta = jax.vmap(alg.client_update, in_axes=(0, None, CLIENT_AXES))(st.params, g, ctx)
    sum_delta = jax.tree.map(jnp.add, sums.delta, agg.weighted_sum(delta, ch["weight"]))
    loss = st.loss_sum / jnp.maximum(st.steps_done, 1)
    sum_loss = sums.loss + jnp.sum(ch["weight"] * loss)
    sum_w = sums.weight + jnp.sum(ch["weight"])
    sum_dc, controls = sums.control_delta, sums.controls
    if alg.scaffold:
        c_new, dc = _scaffold_controls(state, hyper, ch, c_i, st, delta)
        sum_dc = jax.tree.map(lambda s_, d: s_ + jnp.sum(d, axis=0), sum_dc, dc)
        controls = jax.tree.map(lambda a, v: a.at[ch["ids"]].set(v, mode="drop"), controls, c_new)
    return CohortSums(sum_delta, sum_w, sum_loss, sum_dc, controls, unclipped)


def train_cohort(spec, state, inputs, hyper, arranged, train_key) -> CohortSums:
    """Step 3: every chunk of :attr:`RoundSpec.segments` in order (``lax.scan`` over equal
    chunks), accumulated into one :class:`CohortSums`."""

    def chunk_body(sums, ch):
        return _add_chunk(spec, state, inputs, hyper, train_key, sums, ch), None

    zeros = agg.tree_zeros_like(state.params)
    sums = CohortSums(
        zeros, jnp.zeros(()), jnp.zeros(()), zeros, state.client_controls, jnp.zeros(())
    )
    offset = 0
    for size, count in spec.segments:
        group = {k: v[offset : offset + size * count] for k, v in arranged.items()}
        offset += size * count
        if count == 1:
            sums, _ = chunk_body(sums, group)
        else:
            group = {k: v.reshape(count, size) for k, v in group.items()}
            sums, _ = jax.lax.scan(chunk_body, sums, group)
    return sums
