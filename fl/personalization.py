"""Per-client evaluation and personalization: local test splits, fine-tuning and Ditto.

Contract: :func:`split_local` holds out a share of every client's samples as that client's
local test set (a seeded shuffle of its rows; a client keeps at least one training row, and one
with a single sample has no test rows and no accuracy), so the federated run trains on the rest.
:func:`make_client_eval` builds one jitted ``evaluate(params, personal, key) -> [clients]``
accuracy of the model each client would use on its own test rows, in chunks of clients
(``lax.map`` over chunks, ``vmap`` inside):

- ``none``: the global model;
- ``finetune``: the global model after ``finetune_steps`` local SGD steps on the client's
  training rows (batches as in local training; 0 steps: the global model);
- ``ditto`` (Li et al. 2021, "Ditto: Fair and Robust Federated Learning Through
  Personalization", ICML, algorithm 1): every client keeps a personal model ``v_k``; when the
  client is sampled and answers, it runs as many steps as its global update of
  ``v_k ← v_k − η (∇F_k(v_k) + λ (v_k − w^t))``, ``w^t`` the global model the round started
  from (:func:`make_ditto_step`, vmapped over the cohort). Personal models are kept for the
  whole population (``[clients, ...]`` per parameter leaf, checked against the memory budget);
  a client never sampled uses the global model.

:func:`client_stats` summarises the accuracies: mean, p10, p50, p90 and the mean of the worst
10 % of clients.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from fl import local_update as lu
from fl.algorithm import proximal_grad
from fl.data import FederatedData
from fl.partition import from_lists
from fl.round import Hyper, RoundInputs, RoundSpec, ServerState, plan_cohort
from fl.tasks import CLASSIFICATION, Task
from simbase.errors import bad_value

STAT_COLUMNS = (
    "client_acc_mean",
    "client_acc_p10",
    "client_acc_p50",
    "client_acc_p90",
    "client_acc_worst10",
)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LocalTests:
    """Every client's local test rows: client ``k`` holds ``x[starts[k] : starts[k] + sizes[k]]``;
    ``max_size`` (static) is the largest ``sizes[k]``."""

    x: Float[Array, "rows ..."]
    y: Int[Array, " rows"]
    starts: Int[Array, " clients"]
    sizes: Int[Array, " clients"]
    max_size: int = dataclasses.field(metadata=dict(static=True), default=1)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PersonalState:
    """Ditto's personal models (``[clients, ...]`` leaves) and which clients have trained one."""

    params: object
    trained: Array


def split_local(ds: FederatedData, fraction: float, seed: int) -> tuple[FederatedData, LocalTests]:
    """``ds`` with each client's local test rows removed from its training rows, and the tests.

    Each client's rows are shuffled (``numpy`` generator seeded by ``seed``) and the last
    ``round(fraction · n_k)`` (at least 1 when ``n_k >= 2``, at most ``n_k − 1``) are its test."""
    pop = ds.population
    rng = np.random.default_rng([seed, 17])
    train, test = [], []
    for k in range(pop.num_clients):
        rows = rng.permutation(pop.client_rows(k))
        n = len(rows)
        n_test = 0 if n < 2 else min(max(1, int(round(fraction * n))), n - 1)
        train.append(rows[: n - n_test])
        test.append(rows[n - n_test :])
    sizes = np.array([len(t) for t in test], np.int32)
    rows = np.concatenate(test).astype(np.int64) if sizes.sum() else np.zeros(0, np.int64)
    tests = LocalTests(
        x=jnp.asarray(ds.x_train[rows]),
        y=jnp.asarray(ds.y_train[rows]),
        starts=jnp.asarray((np.cumsum(sizes) - sizes).astype(np.int32)),
        sizes=jnp.asarray(sizes),
        max_size=max(int(sizes.max()), 1),
    )
    return dataclasses.replace(ds, population=from_lists(train)), tests


def client_accuracy(
    apply, params, tests: LocalTests, k: Int[Array, ""], task: Task = CLASSIFICATION
) -> Float[Array, ""]:
    """Accuracy of ``params`` on client ``k``'s local test rows (NaN when it has none or the task
    has no accuracy)."""
    j = jnp.arange(tests.max_size)
    valid = j < tests.sizes[k]
    idx = tests.starts[k] + jnp.where(valid, j, 0)
    idx = jnp.minimum(idx, tests.y.shape[0] - 1)
    if task.correct is None:
        return jnp.float32(jnp.nan)
    correct = task.correct(apply(params, tests.x[idx]), tests.y[idx]) * valid
    n = tests.sizes[k]
    return jnp.where(n > 0, jnp.sum(correct) / jnp.maximum(n, 1), jnp.nan)


def _train_from(local: lu.LocalSpec, start_params, anchor, data, tasks, mu, num_steps):
    """``vmap(train_step)`` over clients that start from their own ``start_params``
    (``[clients, ...]``), with the proximal anchor ``anchor`` (shared); returns the params."""
    table = jax.vmap(lambda k, n: lu.shuffle_table(lu.shuffle_keys(k, local.max_epochs), n))(
        tasks.key, tasks.n
    )
    st0 = jax.vmap(lambda p: lu.init_state(local, p))(start_params)
    batch_all = jax.vmap(lu.batch_rows, in_axes=(None, None, 0, 0))
    train_all = jax.vmap(lu.train_step, in_axes=(None, 0, None, 0, 0, 0, None, None, None))

    def body(s, st):
        slots, mask = batch_all(local, s, tasks, table)
        return train_all(local, st, s, tasks, slots, mask, anchor, mu, data)

    return jax.lax.fori_loop(0, num_steps, body, st0).params


def _tasks(inputs: RoundInputs, ids, steps, key, params_like):
    c = ids.shape[0]
    return lu.ClientTask(
        start=inputs.starts[ids],
        n=inputs.sizes[ids],
        steps=steps,
        key=jax.vmap(lambda i: jax.random.fold_in(key, i))(ids),
        correction=jax.tree.map(lambda p: jnp.zeros((c, *p.shape), p.dtype), params_like),
    )


def _broadcast(tree, c):
    return jax.tree.map(lambda p: jnp.broadcast_to(p, (c, *p.shape)), tree)


def make_client_eval(
    spec: RoundSpec, mode: str, finetune_steps: int, chunk: int, task: Task = CLASSIFICATION
):
    """Builds ``evaluate(params, personal, inputs, tests, key) -> [clients]`` accuracies of the
    model each client uses (see module); ``personal`` is a :class:`PersonalState` for ``ditto``
    and ``None`` otherwise. Jit it; clients go ``chunk`` at a time."""
    local = dataclasses.replace(spec.local, local_grad=None)
    apply = spec.local.apply

    def evaluate(params, personal, inputs: RoundInputs, tests: LocalTests, key):
        num_clients = tests.sizes.shape[0]
        n_chunks = -(-num_clients // chunk)
        all_ids = jnp.arange(n_chunks * chunk, dtype=jnp.int32).reshape(n_chunks, chunk)

        def one_chunk(ids):
            ids = jnp.minimum(ids, num_clients - 1)
            if mode == "ditto":
                own = jax.tree.map(lambda a: a[ids], personal.params)
                have = personal.trained[ids]
                use = jax.tree.map(
                    lambda a, g: jnp.where(have.reshape((-1,) + (1,) * g.ndim), a, g[None]),
                    own,
                    params,
                )
            elif mode == "finetune" and finetune_steps > 0:
                steps = jnp.full(ids.shape, finetune_steps, jnp.int32)
                tasks = _tasks(inputs, ids, steps, key, params)
                use = _train_from(
                    local,
                    _broadcast(params, chunk),
                    params,
                    inputs.data,
                    tasks,
                    jnp.zeros(()),
                    finetune_steps,
                )
            else:
                use = _broadcast(params, chunk)
            return jax.vmap(lambda p, k: client_accuracy(apply, p, tests, k, task))(use, ids)

        return jax.lax.map(one_chunk, all_ids).reshape(-1)[:num_clients]

    return evaluate


def init_personal(params, num_clients: int, budget_bytes: float, param_bytes: float):
    """Ditto's personal models, one per client (the global model's shape), none trained yet.

    Raises:
      AisimError: ``field`` ``memory_budget`` when the population's personal models do not fit.
    """
    need = num_clients * param_bytes
    if need > budget_bytes:
        raise bad_value(
            None,
            "memory_budget",
            f"{budget_bytes:.3g} bytes",
            f"at least the {need:.3g} bytes of Ditto's {num_clients} personal models",
            hint="raise {memory_budget}",
        )
    return PersonalState(
        params=_broadcast(params, num_clients), trained=jnp.zeros((num_clients,), bool)
    )


def make_ditto_step(spec: RoundSpec):
    """Builds ``step(personal, server_before, inputs, hyper, lam) -> personal``: Ditto's personal
    update of the round that started from ``server_before`` (see module). The cohort is the
    round's own (:func:`fl.round.plan_cohort` is keyed by the round), and each kept client runs
    as many steps as its global update."""
    local = dataclasses.replace(spec.local, local_grad=proximal_grad)

    def step(personal: PersonalState, server: ServerState, inputs, hyper: Hyper, lam):
        plan = plan_cohort(spec, server, inputs, hyper)
        g = server.params
        ids = plan.ids
        steps = jnp.where(plan.kept, plan.steps, 0)
        have = personal.trained[ids]
        start = jax.tree.map(
            lambda a, p: jnp.where(have.reshape((-1,) + (1,) * p.ndim), a[ids], p[None]),
            personal.params,
            g,
        )
        key = jax.random.fold_in(plan.train_key, jnp.iinfo(jnp.int32).max)
        tasks = _tasks(inputs, ids, steps, key, g)
        new = _train_from(local, start, g, inputs.data, tasks, lam, jnp.max(steps))
        # only kept clients write (a repeated draw of size sampling is kept once)
        target = jnp.where(plan.kept, ids, ids.shape[0] + personal.trained.shape[0])
        return PersonalState(
            params=jax.tree.map(
                lambda a, v: a.at[target].set(v, mode="drop"), personal.params, new
            ),
            trained=personal.trained.at[target].set(True, mode="drop"),
        )

    return step


def client_stats(acc: np.ndarray) -> dict[str, float]:
    """Mean, p10, p50, p90 and worst-10 % mean of the per-client accuracies (clients without a
    local test set are left out); the worst 10 % are the ``ceil(n / 10)`` lowest."""
    a = np.sort(np.asarray(acc, np.float64)[np.isfinite(acc)])
    if len(a) == 0:
        return dict.fromkeys(STAT_COLUMNS, float("nan"))
    worst = a[: -(-len(a) // 10)]
    p10, p50, p90 = np.percentile(a, [10, 50, 90])
    return dict(
        client_acc_mean=float(a.mean()),
        client_acc_p10=float(p10),
        client_acc_p50=float(p50),
        client_acc_p90=float(p90),
        client_acc_worst10=float(worst.mean()),
    )
