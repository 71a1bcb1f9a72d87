"""FedBuff (fl.asynchronous) against a plain-Python event loop, and its reduction to FedAvg."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from fl import asynchronous as fa
from fl import local_update as lu
from fl import round as rnd
from fl.simulation import simulate
from simbase.errors import AisimError


def _one_client(b, params, cid, key):
    """One client's update from ``params`` with the one-client ``local_update`` (lax.scan)."""
    n = b.inputs.sizes[cid]
    steps = int(fa.client_steps(b.spec, b.hyper, n))
    task = lu.ClientTask(
        start=b.inputs.starts[cid],
        n=n,
        steps=jnp.int32(steps),
        key=key,
        correction=jax.tree.map(jnp.zeros_like, params),
    )
    out = jax.jit(lu.local_update, static_argnums=(0, 5))(
        b.spec.local, task, params, jnp.zeros(()), b.inputs.data, steps
    )
    return jax.tree.map(lambda p, p0: p - p0, out.params, params)


def _loop_fedbuff(b, server, updates, k, c, server_lr):
    """FedBuff as a Python event loop over a list of in-flight clients: the same dispatch draws
    (``pick_client``) and durations; a client dispatched before the update's time trains on the
    current model, one dispatched at it trains first in the next fill (one-client training);
    staleness weights ``1/sqrt(1+τ)``; server SGD. Returns params, arrivals and clock."""
    n_clients = b.inputs.sizes.shape[0]
    pick = jax.jit(fa.pick_client)
    dur = jax.jit(lambda cid: fa.duration_s(b.spec, b.inputs, b.hyper, cid))
    g = server.params

    def key_of(k_train, i, cid):
        return jax.random.fold_in(jax.random.fold_in(k_train, i), cid)

    def dispatch(key_pick, i, t, busy_ids):
        busy = np.zeros(n_clients, bool)
        busy[list(busy_ids)] = True
        cid, start = pick(jax.random.fold_in(key_pick, i), b.inputs, jnp.float32(t), busy)
        cid = int(cid)
        return dict(id=cid, start=start, finish=np.float32(start) + np.float32(dur(cid)))

    kp, kt = fa.fill_keys(server.key, None)
    slots = []
    for i in range(c):
        d = dispatch(kp, i, 0.0, [s["id"] for s in slots])
        slots.append(
            {**d, "version": 0, "delta": _one_client(b, g, d["id"], key_of(kt, i, d["id"]))}
        )
    arrivals, clock = [], 0.0
    for v in range(updates):
        kp, kt = fa.fill_keys(server.key, v)
        for j, s in enumerate([s for s in slots if s.get("pending")]):
            s["delta"], s["pending"] = _one_client(b, g, s["id"], key_of(kt, j, s["id"])), False
        buffer = []
        for i in range(k):
            s = int(np.argmin([x["finish"] for x in slots]))
            done = slots[s]
            if done["delta"] is None:  # dispatched earlier in this fill, on this model
                done["delta"] = _one_client(b, g, done["id"], done["key"])
            buffer.append((done["delta"], v - done["version"]))
            arrivals.append((done["id"], v - done["version"]))
            clock = done["finish"]
            others = [x["id"] for j, x in enumerate(slots) if j != s]
            d = dispatch(kp, i, clock, others)
            slots[s] = {**d, "version": v, "delta": None, "key": key_of(kt, k + i, d["id"])}
        for s in slots:
            if s["delta"] is not None:
                continue
            if s["start"] < clock:  # dispatched before the update: trains on this model
                s["delta"] = _one_client(b, g, s["id"], s["key"])
            else:
                s["pending"], s["version"] = True, v + 1
        mean = jax.tree.map(
            lambda *ds, bf=buffer: (
                sum(d / np.sqrt(1.0 + st) for d, (_, st) in zip(ds, bf, strict=True)) / k
            ),
            *[d for d, _ in buffer],
        )
        g = jax.tree.map(lambda p, m: p + server_lr * m, g, mean)
    return g, arrivals, clock


# phones: lognormal speeds and availability 0.5, so arrivals interleave and go stale
LOOP_CASE = dict(
    algorithm="fedbuff", buffer_size=3, concurrency=5, devices="phone", clients=12,
    clients_per_round=10, server_lr=0.7, local_epochs=1, model="logreg", max_local_steps=4,
)  # fmt: skip


def _close(a, b, **kw):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, **kw)


@pytest.mark.slow
def test_fedbuff_equals_python_event_loop(build_factory):
    b = build_factory(**LOOP_CASE)
    state, arrived = b.init_state, []
    for _ in range(4):
        state, met = b.run_round(state, b.inputs, b.hyper)
        arrived += list(zip(met.arrived_ids.tolist(), met.arrived_staleness.tolist(), strict=True))
    server0 = dataclasses.replace(b.init_state.server)
    ref, ref_arrived, clock = _loop_fedbuff(b, server0, 4, 3, 5, 0.7)
    assert [(int(i), int(s)) for i, s in arrived] == ref_arrived
    assert max(s for _, s in ref_arrived) >= 1  # the case exercises staleness
    np.testing.assert_allclose(float(state.clock_s), clock, rtol=1e-6)
    _close(state.params, ref, rtol=2e-5, atol=2e-6)


@pytest.mark.slow
def test_buffer_equal_to_concurrency_with_equal_clients_is_fedavg(build_factory):
    b = build_factory(
        algorithm="fedbuff", buffer_size=4, concurrency=4, devices="server", clients=12,
        clients_per_round=10, local_epochs=1, partition="iid", model="logreg", max_local_steps=4,
    )  # fmt: skip
    # equal clients: the same data size (a prefix of each client's rows) and the same device
    n = int(b.inputs.sizes.min())
    inputs = dataclasses.replace(b.inputs, sizes=jnp.full_like(b.inputs.sizes, n))
    spec = fa.AsyncSpec(b.spec, 4, 4)
    state = jax.jit(lambda s, i, h: fa.init_async(spec, s, i, h))(
        b.init_state.server, inputs, b.hyper
    )
    fill = jax.jit(fa.make_fill(spec))
    eq = dataclasses.replace(b, inputs=inputs)
    # the synchronous engine's round time for a cohort of such clients
    sync_spec = dataclasses.replace(b.spec, cohort=4)
    plan = rnd.plan_cohort(sync_spec, b.init_state.server, inputs, b.hyper)
    round_s = float(plan.round_time_s)
    cohort, g = list(np.asarray(state.ids)), b.init_state.server.params
    for r in range(1, 4):
        before = state
        state, met = fill(state, inputs, b.hyper)
        # the buffer is exactly the previous cohort, none of it stale, one sync round later
        assert sorted(np.asarray(met.arrived_ids)) == sorted(cohort)
        assert int(met.staleness_max) == 0
        np.testing.assert_allclose(float(state.clock_s), r * round_s, rtol=1e-5)
        # FedAvg: w + mean of the cohort's updates (equal sizes: FedAvg's n_k weights are equal),
        # each trained from the model of the fill that dispatched it (slot i trains i-th)
        _, k_train = fa.fill_keys(b.init_state.server.key, None if r == 1 else r - 1)
        upd = []
        for i, cid in enumerate(np.asarray(before.ids)):
            key = jax.random.fold_in(jax.random.fold_in(k_train, i), int(cid))
            upd.append(_one_client(eq, g, int(cid), key))
        g = jax.tree.map(lambda p, *u: p + sum(u) / 4, g, *upd)
        _close(state.params, g, rtol=2e-5, atol=2e-6)
        cohort = list(np.asarray(state.ids))


def test_staleness_weight_is_the_papers():
    w = fa.staleness_weight(jnp.arange(4))
    np.testing.assert_allclose(w, [1.0, 2**-0.5, 3**-0.5, 0.5], rtol=1e-6)


@pytest.mark.slow
def test_fedbuff_run_reports_time_to_target(cfg_factory):
    cfg = cfg_factory(**LOOP_CASE, rounds=6, target_accuracy=0.2)  # the loop case's compile
    res = simulate(cfg)
    m, s = res.metrics, res.summary
    assert list(m.columns[-2:]) == ["staleness_mean", "staleness_max"] and len(m) == 6
    assert (m["clients_kept"] == 3).all() and m["sim_time_s"].is_monotonic_increasing
    assert s["fedbuff"]["server_updates"] == 6 and s["fedbuff"]["staleness_max"] >= 1
    hit = m[m["test_accuracy"] >= 0.2]
    assert s["time_to_target_s"] == (float(hit["sim_time_s"].iloc[0]) if len(hit) else None)


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(algorithm="fedbuff", clients_per_round=5), "clients_per_round"),
        (dict(algorithm="fedbuff", clients_per_round=10, stragglers=0.5), "stragglers"),
        (dict(algorithm="fedbuff", clients_per_round=10, concurrency=50), "concurrency"),
        (dict(buffer_size=5), "buffer_size"),
        (dict(algorithm="fedbuff", buffer_size=0), "buffer_size"),
    ],
)
def test_fedbuff_settings_without_effect_are_errors(change, field, cfg_factory):
    from fl.config import validate

    with pytest.raises(AisimError) as e:
        validate(cfg_factory(**change))
    assert e.value.field == field


@pytest.mark.slow
def test_fedbuff_resumes_to_the_same_metrics(cfg_factory, tmp_path):
    cfg = cfg_factory(**LOOP_CASE, rounds=5, checkpoint_every=2)
    full = simulate(cfg, tmp_path / "a").metrics
    simulate(cfg, tmp_path / "b", stop_after=3)  # interrupted after update 3, checkpoint at 2
    resumed = simulate(cfg, tmp_path / "b", resume=True).metrics
    pd.testing.assert_frame_equal(full, resumed)
