"""Local training of one client, written for one client (the round vmaps it once).

Contract: a client holds the pool rows ``order[start : start + n]``. Each local epoch visits them
in a fresh random order in batches of ``batch_size``; the last batch of an epoch is partial and
masked. The order is a keyed swap-or-not permutation of ``0..n-1`` (Hoang, Morris & Rogaway,
CRYPTO 2012) evaluated only at the positions of the current batch, so a client's shuffle costs
``O(batch_size)`` work per step and ``epochs x ROUNDS`` round keys of state, not a sort of
``max_samples`` entries (:func:`epoch_permutations` materialises it, for references; the swap
offsets are reduced mod ``n`` once per client and round, by :func:`shuffle_table`).
:func:`client_step` is one optimiser step (:func:`batch_rows`, then :func:`train_step`), a no-op
once ``step >= task.steps``, so clients with fewer samples or epochs are padded by masks.
The loss is the task's per-sample loss averaged over the batch's valid samples
(:mod:`fl.tasks`); the gradient passes through the algorithm's ``local_grad`` (FedProx's proximal
term, SCAFFOLD's ``c − c_i``: :mod:`fl.algorithm`) before it enters the client's optax
transformation. :func:`local_update` runs a client's steps with ``lax.scan``; it is the
one-client reference that the vmapped round is tested against.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float, Int

from fl.algorithm import LocalContext
from fl.convlayout import cpu_canonical_convs
from fl.tasks import CLASSIFICATION, masked_mean


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ClientTask:
    """What one client does this round.

    Attributes:
      start: offset of the client's first row in ``order``.
      n: number of samples.
      steps: local steps to run (0: the client does nothing).
      key: the client's PRNG key for this round (shuffling).
      correction: pytree like params added to every gradient (SCAFFOLD ``c − c_i``; zeros).
    """

    start: Int[Array, ""]
    n: Int[Array, ""]
    steps: Int[Array, ""]
    key: Array
    correction: object


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ClientState:
    """A client's local model, optimiser state, and running loss."""

    params: object
    opt_state: object
    loss_sum: Float[Array, ""]
    steps_done: Int[Array, ""]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LocalData:
    """The shared training pool and the population's row order.

    With ``order = None`` the pool is already laid out in slot order (``x_pool[j]`` is the row of
    slot ``j``), which saves one gather per local step.
    """

    x_pool: Float[Array, "pool ..."]
    y_pool: Int[Array, " pool"]
    order: Int[Array, " slots"] | None = None


@dataclasses.dataclass(frozen=True)
class LocalSpec:
    """Static choices of local training (hashable; closed over by jit): the model's ``apply``,
    the client optimiser, the batch, the largest client and the epochs; ``local_grad`` the
    algorithm's gradient rule (:class:`fl.algorithm.Algorithm`), ``loss`` the task's per-sample
    loss (:class:`fl.tasks.Task`)."""

    apply: Callable
    client_opt: optax.GradientTransformation
    batch_size: int
    max_samples: int
    max_epochs: int
    local_grad: Callable | None = None
    loss: Callable = CLASSIFICATION.loss


SHUFFLE_ROUNDS = 16


def shuffle_keys(key: Array, epochs: int) -> Int[Array, "epochs rounds 2"]:
    """Round keys of a client's per-epoch permutations: ``[epochs, SHUFFLE_ROUNDS, 2]`` uint32
    (the swap offset's bits and the round's hash seed)."""
    return jax.random.bits(key, (epochs, SHUFFLE_ROUNDS, 2), jnp.uint32)


def _hash32(x: Array) -> Array:
    """MurmurHash3's 32-bit finaliser (a bijective avalanche mix of uint32)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def shuffle_table(
    keys: Int[Array, "epochs rounds 2"], n: Int[Array, ""]
) -> Int[Array, "epochs rounds 2"]:
    """A client's round keys (uint32) with each swap offset already reduced mod ``n``, so that a
    local step does no division: computed once per client and round, used by every step."""
    offsets = keys[..., 0] % jnp.maximum(n, 1).astype(jnp.uint32)
    return jnp.stack([offsets, keys[..., 1]], axis=-1)


def permute_reduced(
    table: Int[Array, "rounds 2"], n: Int[Array, ""], i: Int[Array, "..."]
) -> Int[Array, "..."]:
    """Position ``pi(i)`` for ``0 <= i < n``, from one epoch's :func:`shuffle_table` row.

    The rounds are a ``fori_loop``, not unrolled: a round program computes batch positions in
    several places, and 16 inlined copies of the hash in each made up almost half of its
    operations, a third of its compile time and a slower round."""
    n = jnp.maximum(n, 1).astype(jnp.int32)

    def swap_or_not(r, x):
        d = table[r, 0].astype(jnp.int32) - x  # in (-n, n): mod n without a division per element
        partner = jnp.where(d < 0, d + n, d)
        hi = jnp.maximum(x, partner).astype(jnp.uint32)
        flip = (_hash32(hi ^ table[r, 1]) & jnp.uint32(1)) == 1
        return jnp.where(flip, partner, x)

    return jax.lax.fori_loop(0, table.shape[0], swap_or_not, i.astype(jnp.int32))


def permute(
    keys: Int[Array, "rounds 2"], n: Int[Array, ""], i: Int[Array, "..."]
) -> Int[Array, "..."]:
    """Position ``pi(i)`` of a keyed permutation ``pi`` of ``0..n-1`` (``i`` is taken mod ``n``).

    Swap-or-not: each round pairs ``x`` with ``k_r - x mod n`` (an involution) and swaps both
    members of a pair or neither, as a hash of the pair's larger member decides; a composition of
    such rounds is a bijection of ``0..n-1`` for any ``n >= 1``."""
    i = i.astype(jnp.int32) % jnp.maximum(n, 1).astype(jnp.int32)
    return permute_reduced(shuffle_table(keys, n), n, i)


def epoch_permutations(
    key: Array, n: Int[Array, ""], max_samples: int, epochs: int
) -> Int[Array, "epochs max_samples"]:
    """The order of every epoch, materialised: ``[epochs, max_samples]`` positions, a permutation
    of ``0..n-1`` followed by ``n..max_samples-1``. Local training uses the same :func:`permute`
    batch by batch."""
    keys = shuffle_keys(key, epochs)
    j = jnp.arange(max_samples)
    return jax.vmap(lambda k: jnp.where(j < n, permute(k, n, j), j))(keys)


def init_state(spec: LocalSpec, global_params) -> ClientState:
    """A client's state at the start of a round: the global model, a fresh optimiser."""
    return ClientState(
        params=global_params,
        opt_state=spec.client_opt.init(global_params),
        loss_sum=jnp.zeros((), jnp.float32),
        steps_done=jnp.zeros((), jnp.int32),
    )


def batch_rows(
    spec: LocalSpec, step: Int[Array, ""], task: ClientTask, table: Int[Array, "epochs rounds 2"]
) -> tuple[Int[Array, " batch"], Float[Array, " batch"]]:
    """Positions in ``order`` of the batch of ``step``, and its validity mask (``table`` from
    :func:`shuffle_table`). Masked offsets past the client's last sample are clamped onto its
    last position: they stay in bounds and their weight is zero."""
    bsz = spec.batch_size
    per_epoch = jnp.maximum((task.n + bsz - 1) // bsz, 1)
    epoch = jnp.minimum(step // per_epoch, spec.max_epochs - 1)
    offs = (step % per_epoch) * bsz + jnp.arange(bsz)
    valid = offs < task.n
    pos = permute_reduced(table[epoch], task.n, jnp.minimum(offs, jnp.maximum(task.n, 1) - 1))
    return task.start + pos, valid.astype(jnp.float32)


def client_step(
    spec: LocalSpec,
    state: ClientState,
    step: Int[Array, ""],
    task: ClientTask,
    table: Int[Array, "epochs rounds 2"],
    global_params,
    mu: Float[Array, ""],
    data: LocalData,
) -> ClientState:
    """One local optimiser step of one client (``table`` from :func:`shuffle_table`); unchanged
    when ``step >= task.steps``."""
    slots, mask = batch_rows(spec, step, task, table)
    return train_step(spec, state, step, task, slots, mask, global_params, mu, data)


def train_step(
    spec: LocalSpec,
    state: ClientState,
    step: Int[Array, ""],
    task: ClientTask,
    slots: Int[Array, " batch"],
    mask: Float[Array, " batch"],
    global_params,
    mu: Float[Array, ""],
    data: LocalData,
) -> ClientState:
    """:func:`client_step` on the batch of ``step`` given by :func:`batch_rows` (``slots``,
    ``mask``). The vmapped round computes the next step's batch one iteration ahead and carries
    it, so that XLA keeps the positions in a buffer instead of fusing the 16-round shuffle into
    the gather, where it would be recomputed for every feature of every row."""
    # Every index is in bounds: batch_rows maps masked offsets onto the client's own rows.
    inb = "promise_in_bounds"
    rows = slots if data.order is None else data.order.at[slots].get(mode=inb)
    x = data.x_pool.at[rows].get(mode=inb)
    y = data.y_pool.at[rows].get(mode=inb)

    def loss_fn(p):
        return masked_mean(spec.loss(spec.apply(p, x), y), mask)

    # XLA:CPU runs the gradient's convolutions slowly in the loop over steps (jax-ml/jax#12868)
    loss, grad = cpu_canonical_convs(jax.value_and_grad(loss_fn))(state.params)
    if spec.local_grad is not None:  # None skips a pass over every client's parameters
        ctx = LocalContext(mu=mu, correction=task.correction, step=step)
        grad = spec.local_grad(grad, state.params, global_params, ctx)
    updates, opt_state = spec.client_opt.update(grad, state.opt_state, state.params)
    new = ClientState(
        params=optax.apply_updates(state.params, updates),
        opt_state=opt_state,
        loss_sum=state.loss_sum + loss,
        steps_done=state.steps_done + 1,
    )
    active = step < task.steps
    return jax.tree.map(lambda a, b: jnp.where(active, a, b), new, state)


def local_update(
    spec: LocalSpec,
    task: ClientTask,
    global_params,
    mu: Float[Array, ""],
    data: LocalData,
    num_steps: int,
) -> ClientState:
    """Runs one client's round with ``lax.scan`` over ``num_steps`` (>= ``task.steps``) steps."""
    table = shuffle_table(shuffle_keys(task.key, spec.max_epochs), task.n)

    def body(state, s):
        return client_step(spec, state, s, task, table, global_params, mu, data), None

    state, _ = jax.lax.scan(body, init_state(spec, global_params), jnp.arange(num_steps))
    return state
