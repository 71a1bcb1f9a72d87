"""Per-client evaluation, fine-tuning and Ditto (fl.personalization) against one-client loops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fl import local_update as lu
from fl import personalization as per
from fl import round as rnd
from fl.algorithm import proximal_grad
from fl.data import digits

CASE = dict(
    clients=12, clients_per_round=4, local_epochs=1, model="logreg", client_eval=True,
    devices="server", partition="dirichlet", max_local_steps=6,
)  # fmt: skip


def _accuracy(b, params, k):
    """Client ``k``'s accuracy on its local test rows, by numpy."""
    t = b.local_test
    s, n = int(t.starts[k]), int(t.sizes[k])
    logits = np.asarray(b.model.apply(params, t.x[s : s + n]))
    return float(np.mean(logits.argmax(-1) == np.asarray(t.y[s : s + n])))


def _loop_train(b, local, start, anchor, cid, steps, key, mu):
    """One client's ``steps`` local steps from ``start`` with ``client_step`` in a Python loop."""
    task = lu.ClientTask(
        start=b.inputs.starts[cid],
        n=b.inputs.sizes[cid],
        steps=jnp.int32(steps),
        key=key,
        correction=jax.tree.map(jnp.zeros_like, anchor),
    )
    table = lu.shuffle_table(lu.shuffle_keys(key, local.max_epochs), task.n)
    step = jax.jit(lu.client_step, static_argnums=0)
    st = lu.init_state(local, start)
    for s in range(steps):
        st = step(local, st, jnp.int32(s), task, table, anchor, jnp.float32(mu), b.inputs.data)
    return st.params


def _close(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=2e-5, atol=2e-6)


def test_split_keeps_every_row_once_and_trains_on_the_rest():
    ds = digits(10, "dirichlet", 0.5, seed=0)
    new, tests = per.split_local(ds, 0.25, seed=3)
    x_test = np.asarray(tests.x)
    for k in range(10):
        old = ds.population.client_rows(k)
        train = new.population.client_rows(k)
        s, n = int(tests.starts[k]), int(tests.sizes[k])
        assert n == min(max(1, round(0.25 * len(old))), len(old) - 1) and len(train) == len(old) - n
        # the test rows are the client's other rows: same multiset of features as old - train
        rest = np.setdiff1d(old, train)
        np.testing.assert_array_equal(
            np.sort(ds.x_train[rest].sum(1)), np.sort(x_test[s : s + n].sum(1))
        )


def test_client_stats_by_hand():
    acc = np.array([0.1, 0.9, 0.5, np.nan, 0.3, 0.7, 0.2, 0.4, 0.6, 0.8, 0.0, 1.0])
    st = per.client_stats(acc)
    a = np.sort(acc[np.isfinite(acc)])  # 11 clients: the worst 10 % are the 2 lowest
    assert st["client_acc_mean"] == pytest.approx(a.mean())
    assert st["client_acc_worst10"] == pytest.approx((0.0 + 0.1) / 2)
    assert st["client_acc_p50"] == pytest.approx(0.5)


@pytest.mark.slow
def test_finetune_vmap_equals_loop_and_zero_steps_is_global(build_factory):
    b = build_factory(**CASE, personalize="finetune", finetune_steps=3)
    g = b.init_state.params
    key = jax.random.key(4)
    ev = jax.jit(per.make_client_eval(b.spec, "finetune", 3, 5))  # 12 clients in chunks of 5
    got = np.asarray(ev(g, None, b.inputs, b.local_test, key))
    local = lu.LocalSpec(b.model.apply, b.spec.local.client_opt, 10, b.spec.local.max_samples, 1)
    for k in range(12):
        tuned = _loop_train(b, local, g, g, k, 3, jax.random.fold_in(key, k), 0.0)
        assert got[k] == pytest.approx(_accuracy(b, tuned, k), abs=1e-6)
    zero = jax.jit(per.make_client_eval(b.spec, "finetune", 0, 5))
    plain = jax.jit(per.make_client_eval(b.spec, "none", 0, 5))
    z = np.asarray(zero(g, None, b.inputs, b.local_test, key))
    np.testing.assert_array_equal(z, np.asarray(plain(g, None, b.inputs, b.local_test, key)))
    np.testing.assert_allclose(z, [_accuracy(b, g, k) for k in range(12)], atol=1e-6)
    assert not np.allclose(got, z)  # fine-tuning moved the models


@pytest.mark.slow
def test_ditto_vmap_equals_loop_over_two_rounds(build_factory):
    lam = 0.5
    b = build_factory(**{**CASE, "local_epochs": 2}, personalize="ditto", ditto_lambda=lam)
    spec = b.spec
    step = jax.jit(per.make_ditto_step(spec))
    personal = per.init_personal(b.init_state.params, 12, 1e9, b.model.param_bytes)
    local = lu.LocalSpec(
        b.model.apply, spec.local.client_opt, 10, spec.local.max_samples, 2, proximal_grad
    )
    ref = {}  # client -> personal params
    state = b.init_state
    plan_of = jax.jit(lambda s: rnd.plan_cohort(spec, s, b.inputs, b.hyper))
    for _ in range(2):
        plan = plan_of(state)
        personal = step(personal, state, b.inputs, b.hyper, jnp.float32(lam))
        key = jax.random.fold_in(plan.train_key, jnp.iinfo(jnp.int32).max)
        g = state.params
        for i, cid in enumerate(np.asarray(plan.ids).tolist()):
            if not bool(plan.kept[i]):
                continue
            steps = int(plan.steps[i])
            ref[cid] = _loop_train(
                b, local, ref.get(cid, g), g, cid, steps, jax.random.fold_in(key, cid), lam
            )
        state, _ = b.run_round(state, b.inputs, b.hyper)
    assert sorted(np.flatnonzero(np.asarray(personal.trained))) == sorted(ref)
    assert len(ref) > 4  # two cohorts of 4 that differ
    for cid, p in ref.items():
        _close(jax.tree.map(lambda a, c=cid: a[c], personal.params), p)
