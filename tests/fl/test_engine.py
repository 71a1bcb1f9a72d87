"""The vmapped round against one-client references: loop, centralised SGD, chunking, seeds."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fl import local_update as lu
from fl import round as rnd
from fl.build import FAST_COMPILE_FLOPS, build, head_pays, padded_steps, run_flops
from fl.config import ExperimentConfig
from fl.models import cross_entropy, make_model
from fl.partition import from_lists
from fl.server import make_algorithm
from fl.simulation import simulate
from fl.systems import client_time_s, draw_systems


def _loop_round(b, state):
    """A Python loop over the cohort's clients, each with the one-client ``local_update``."""
    plan = jax.jit(lambda s: rnd.plan_cohort(b.spec, s, b.inputs, b.hyper))(state)
    g = state.params
    total, wsum = jax.tree.map(jnp.zeros_like, g), 0.0
    mu = b.hyper.mu
    upd = jax.jit(lu.local_update, static_argnums=(0, 5))
    for i in range(b.spec.cohort):
        cid = int(plan.ids[i])
        task = lu.ClientTask(
            start=b.inputs.starts[cid],
            n=plan.n[i],
            steps=plan.steps[i],
            key=jax.random.fold_in(plan.train_key, cid),
            correction=jax.tree.map(jnp.zeros_like, g),
        )
        out = upd(b.spec.local, task, g, mu, b.inputs.data, int(plan.steps.max()))
        w = float(plan.weight[i])
        total = jax.tree.map(lambda t, p, p0, w=w: t + w * (p - p0), total, out.params, g)
        wsum += w
    mean = jax.tree.map(lambda t: t / wsum, total)
    return jax.tree.map(jnp.add, g, mean), plan


@pytest.mark.slow
@pytest.mark.parametrize("chunk,clients", [(8, 40), (3, 40), (8, 200)])
def test_vmapped_round_equals_python_loop(chunk, clients, build_factory, rechunk):
    # 200 clients for a cohort of 8 is above fl.sampling.SPARSE_SAMPLING_RATIO: deduplicated draws.
    b = rechunk(build_factory(stragglers=0.5, algorithm="fedprox", mu=0.1, clients=clients), chunk)
    state = b.init_state
    expected, plan = _loop_round(b, state)
    assert int(plan.kept.sum()) == 8 and len(set(np.asarray(plan.steps))) > 1
    new, met = b.run_round(state, b.inputs, b.hyper)
    for a, e in zip(jax.tree.leaves(new.params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(a, e, rtol=2e-5, atol=2e-6)
    assert int(met.clients_kept) == 8


@pytest.mark.slow
def test_one_client_fedavg_one_epoch_is_centralised_sgd():
    rng = np.random.default_rng(0)
    n, bsz, lr = 120, 12, 0.1
    x = rng.normal(size=(n, 20)).astype(np.float32)
    y = rng.integers(0, 5, n).astype(np.int32)
    model = make_model("mlp", (20,), 5, hidden=(16,))
    pop = from_lists([np.arange(n)])
    local = lu.LocalSpec(model.apply, optax.sgd(lr), bsz, n, 1)
    spec = rnd.RoundSpec(
        local,
        make_algorithm("fedavg"),
        cohort=1,
        chunk=1,
        flops_per_sample=model.train_flops_per_sample,
        param_bytes=model.param_bytes,
    )
    systems = draw_systems({"server": 1.0}, 1, rng)
    inputs = rnd.RoundInputs(
        lu.LocalData(jnp.asarray(x), jnp.asarray(y), jnp.asarray(pop.order)),
        jnp.asarray(pop.starts),
        jnp.asarray(pop.sizes),
        systems,
    )
    hyper = rnd.Hyper(*(jnp.float32(v) for v in (0, lr, 0, np.inf, 1, 1)), jnp.int32(2**30))
    params = model.init(jax.random.key(1))
    state = rnd.init_server_state(spec, params, 1, seed=5)
    new, _ = jax.jit(rnd.make_round(spec))(state, inputs, hyper)

    plan = rnd.plan_cohort(spec, state, inputs, hyper)
    order = lu.epoch_permutations(jax.random.fold_in(plan.train_key, 0), n, n, 1)[0]
    w = params
    for s in range(n // bsz):
        idx = np.asarray(order[s * bsz : (s + 1) * bsz])
        g = jax.grad(lambda p, i=idx: cross_entropy(model.apply(p, x[i]), y[i], jnp.ones(bsz)))(w)
        w = jax.tree.map(lambda p, gi: p - lr * gi, w, g)
    assert int(plan.steps[0]) == n // bsz
    for a, e in zip(jax.tree.leaves(new.params), jax.tree.leaves(w), strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_chunking_does_not_change_the_result(build_factory, rechunk):
    b = build_factory(stragglers=0.3)
    small = rechunk(b, 2)
    s1, _ = b.run_round(b.init_state, b.inputs, b.hyper)
    s2, _ = small.run_round(small.init_state, small.inputs, small.hyper)
    for a, e in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params), strict=True):
        np.testing.assert_allclose(a, e, rtol=2e-5, atol=2e-6)


def test_the_growing_head_does_not_change_the_result(build_factory):
    b = build_factory(stragglers=0.3)
    assert not b.spec.head  # the digits clients are alike: equal chunks only
    spec = dataclasses.replace(b.spec, head=True)
    assert spec.segments != b.spec.segments
    s1, _ = b.run_round(b.init_state, b.inputs, b.hyper)
    s2, _ = jax.jit(rnd.make_round(spec))(b.init_state, b.inputs, b.hyper)
    for a, e in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params), strict=True):
        np.testing.assert_allclose(a, e, rtol=2e-5, atol=2e-6)


def test_head_only_where_it_cuts_the_masked_steps():
    spec = rnd.RoundSpec(None, make_algorithm("fedavg"), cohort=8, chunk=2)
    assert spec.segments == ((1, 1), (2, 4))
    flat = dataclasses.replace(spec, head=False)
    assert flat.segments == ((2, 4),)
    # one client of 100 steps among seven of 1 (the whole population is the cohort): the head
    # runs 1 x 100 + 4 chunks x 2 x 1 = 108 client-steps, equal chunks 2 x 100 + 3 x 2 x 1 = 206
    tail = np.array([100, 1, 1, 1, 1, 1, 1, 1])
    assert padded_steps(spec, tail) == 108 and padded_steps(flat, tail) == 206
    assert head_pays(spec, tail, tail)
    # alike clients: the head only adds a chunk (9 x 5 against 8 x 5)
    alike = np.full(8, 5)
    assert padded_steps(spec, alike) == 45 and padded_steps(flat, alike) == 40
    assert not head_pays(spec, alike, alike)
    # FedProx's lognormal sizes (synthetic(1,1)) get it, as a build of them shows
    cfg = ExperimentConfig(dataset="synthetic", clients=1000, clients_per_round=100, rounds=1)
    assert build(cfg).spec.head


@pytest.mark.slow  # compiles the round both ways
def test_a_short_run_compiles_its_round_for_a_fast_start(build_factory):
    b = build_factory(stragglers=0.3)
    cfg = b.cfg
    # alike clients, no head: every cohort pads to the same client-steps
    sizes = np.asarray(b.inputs.sizes)
    steps = np.minimum(-(-sizes // cfg.batch_size) * cfg.local_epochs, 2**30)
    cohort = np.sort(steps[: b.spec.cohort])[::-1]
    hand = cfg.rounds * padded_steps(b.spec, cohort) * cfg.batch_size * b.spec.flops_per_sample
    assert run_flops(b.spec, cfg.rounds, [cohort]) == pytest.approx(hand)
    assert hand <= FAST_COMPILE_FLOPS and b.spec.fast_compile
    long = build(dataclasses.replace(cfg, rounds=int(2 * FAST_COMPILE_FLOPS / hand * cfg.rounds)))
    assert not long.spec.fast_compile
    # both programs give the round's result to float rounding
    s1, _ = b.run_round(b.init_state, b.inputs, b.hyper)
    s2, _ = long.run_round(b.init_state, b.inputs, b.hyper)
    for a, e in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params), strict=True):
        np.testing.assert_allclose(a, e, rtol=2e-5, atol=2e-6)


def test_memory_budget_sets_chunk(build_factory):
    big = build_factory(clients_per_round=20, memory_budget="4GB")
    tiny = build_factory(clients_per_round=20, memory_budget="8MB")
    assert big.spec.chunk == 5 and 1 <= tiny.spec.chunk < 5


@pytest.mark.slow
def test_same_seed_same_metrics_other_seed_differs(cfg_factory):
    a = simulate(cfg_factory(rounds=3, seed=1)).metrics
    b = simulate(cfg_factory(rounds=3, seed=1)).metrics
    c = simulate(cfg_factory(rounds=3, seed=2)).metrics
    assert a.equals(b)
    assert not a["train_loss"].equals(c["train_loss"])


@pytest.mark.slow
def test_fedavg_drops_stragglers_fedprox_keeps_them(cfg_factory):
    avg = simulate(cfg_factory(rounds=4, stragglers=0.9, algorithm="fedavg")).metrics
    prox = simulate(cfg_factory(rounds=4, stragglers=0.9, algorithm="fedprox", mu=1.0)).metrics
    assert (prox["clients_kept"] == prox["clients_sampled"]).all()
    assert avg["clients_kept"].sum() < 0.4 * avg["clients_sampled"].sum()
    assert (avg["bytes_up"] < avg["bytes_down"]).any()


@pytest.mark.slow
def test_deadline_cuts_clients_and_bounds_round_time(build_factory):
    def plan(alg, deadline_s):
        b = build_factory(algorithm=alg, local_epochs=5)
        slow = dataclasses.replace(
            b.inputs.systems, flops_per_s=b.inputs.systems.flops_per_s * 1e-5
        )
        inputs = dataclasses.replace(b.inputs, systems=slow)
        hyper = dataclasses.replace(b.hyper, deadline_s=jnp.float32(deadline_s))
        return rnd.plan_cohort(b.spec, b.init_state, inputs, hyper)

    free = plan("fedavg", np.inf)
    deadline = float(free.round_time_s) * 0.8
    avg, prox = plan("fedavg", deadline), plan("fedprox", deadline)
    assert np.array_equal(free.ids, avg.ids) and int(free.kept.sum()) == 8
    assert float(avg.round_time_s) <= deadline * 1.0001
    assert float(prox.round_time_s) <= deadline * 1.0001
    assert 0 < int(avg.kept.sum()) < 8 and int(prox.kept.sum()) == 8
    # FedAvg keeps whole work or nothing; FedProx keeps the steps that fit.
    assert np.all(
        np.asarray(avg.steps)[np.asarray(avg.kept)] == np.asarray(free.steps)[np.asarray(avg.kept)]
    )
    assert int(prox.steps.sum()) < int(free.steps.sum())


def test_client_time_formula_by_hand():
    t = client_time_s(1e9, 4e6, 4e6, 1e10, 5e6, 1.25e6, 0.05, 5e8)
    assert np.isclose(t.compute_s, 0.1)
    assert np.isclose(t.download_s, 0.05 + 0.8) and np.isclose(t.upload_s, 0.05 + 3.2)
    assert np.isclose(t.serialize_s, 8e6 / 5e8)
    assert np.isclose(t.total_s, 0.1 + 0.85 + 3.25 + 0.016)


@pytest.mark.slow
def test_scaffold_controls_average_over_the_population(build_factory):
    b = build_factory(algorithm="scaffold", clients=8, clients_per_round=8)
    new, _ = b.run_round(b.init_state, b.inputs, b.hyper)
    for c, ci in zip(
        jax.tree.leaves(new.control), jax.tree.leaves(new.client_controls), strict=True
    ):
        assert ci.shape[0] == 8
        np.testing.assert_allclose(c, ci.mean(axis=0), rtol=1e-4, atol=1e-6)
        assert float(jnp.abs(ci).max()) > 0


@pytest.mark.slow
def test_dp_clips_and_reports_epsilon(build_factory, cfg_factory):
    b = build_factory(algorithm="dpfedavg", clip_norm=1e-3, noise_multiplier=0.0)
    new, _ = b.run_round(b.init_state, b.inputs, b.hyper)
    diff = jax.tree.map(lambda a, c: a - c, new.params, b.init_state.params)
    norm = float(jnp.sqrt(sum(jnp.sum(d**2) for d in jax.tree.leaves(diff))))
    assert 0 < norm <= 1e-3 * 1.0001
    s = simulate(cfg_factory(algorithm="dpfedavg", rounds=2, noise_multiplier=1.0)).summary
    assert s["privacy"]["epsilon"] > 0 and s["privacy"]["noise_multiplier"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("alg", ["fedavgm", "fedadam", "fedyogi", "fedadagrad", "scaffold"])
def test_every_algorithm_learns(alg, cfg_factory):
    kw = dict(server_lr=0.03) if alg in ("fedadam", "fedyogi", "fedadagrad") else {}
    if alg == "fedavgm":
        kw = dict(server_lr=0.5)
    m = simulate(cfg_factory(rounds=6, algorithm=alg, partition="iid", **kw)).metrics
    assert m["test_accuracy"].iloc[-1] > 0.5
    assert m["train_loss"].iloc[-1] < m["train_loss"].iloc[0]


@pytest.mark.slow
def test_size_proportional_sampling_runs(cfg_factory):
    # 8 draws with replacement: a client drawn twice is contacted (and counted) once
    m = simulate(cfg_factory(rounds=2, sampling="size", partition="quantity")).metrics
    assert m["clients_sampled"].between(1, 8).all() and (m["clients_kept"] >= 1).all()


@pytest.mark.slow
def test_divergence_stops_and_keeps_rows(tmp_path, cfg_factory):
    cfg = cfg_factory(rounds=30, lr=1e36, dataset="synthetic", clients=30, partition="iid")
    r = simulate(cfg, tmp_path)
    assert r.summary["diverged"]
    assert 1 <= len(r.metrics) < 30
    assert (tmp_path / "metrics.csv").exists()


@pytest.mark.slow
def test_resume_equals_uninterrupted(tmp_path, cfg_factory):
    cfg = cfg_factory(rounds=5, checkpoint_every=2, stragglers=0.5, algorithm="fedprox", mu=0.1)
    full = simulate(cfg, tmp_path / "a").metrics
    simulate(cfg, tmp_path / "b", stop_after=3)
    resumed = simulate(cfg, tmp_path / "b", resume=True).metrics
    assert full.equals(resumed)


@pytest.mark.slow
def test_a_checkpoint_of_another_state_layout_is_refused_in_one_line(tmp_path, cfg_factory):
    # An older aisim's checkpoint has fewer state arrays (e.g. before the simulated clock).
    from flax import serialization

    from fl.run_folder import CHECKPOINT
    from simbase.errors import AisimError

    cfg = cfg_factory(rounds=3, checkpoint_every=1)
    simulate(cfg, tmp_path, stop_after=2)
    path = tmp_path / CHECKPOINT
    blob = serialization.msgpack_restore(path.read_bytes())
    n = len(blob["leaves"])
    blob["leaves"] = {str(i): blob["leaves"][str(i)] for i in range(n - 1)}
    path.write_bytes(serialization.msgpack_serialize(blob))
    with pytest.raises(AisimError, match=f"holds {n - 1} state arrays where this run has {n}"):
        simulate(cfg, tmp_path, resume=True)


@pytest.mark.slow
def test_works_under_rank_promotion_raise(build_factory):
    assert jax.config.jax_numpy_rank_promotion == "raise"
    b = build_factory(algorithm="scaffold")
    b.run_round(b.init_state, b.inputs, b.hyper)
    dataclasses.replace(b.cfg)


@pytest.mark.parametrize("n", [1, 2, 3, 10, 57, 1000, 12295])
def test_shuffle_is_a_permutation_of_the_client_rows(n):
    perms = np.asarray(lu.epoch_permutations(jax.random.key(n), n, n + 7, 3))
    for p in perms:
        assert np.array_equal(np.sort(p[:n]), np.arange(n))
        assert np.array_equal(p[n:], np.arange(n, n + 7))
    if n >= 10:
        assert not np.array_equal(perms[0], perms[1])  # a fresh order each epoch


@pytest.mark.parametrize("n", [1, 3, 10, 23])
def test_batch_rows_cover_each_epoch_once_and_stay_in_bounds(n):
    # The steps of one epoch visit epoch_permutations' order (the reference), batch by batch;
    # masked slots (past the client's n rows, n < batch size included) stay on the client's rows.
    spec = lu.LocalSpec(apply=None, client_opt=None, batch_size=10, max_samples=n, max_epochs=2)
    key, start = jax.random.key(7), 100
    task = lu.ClientTask(
        start=jnp.int32(start), n=jnp.int32(n), steps=jnp.int32(0), key=key, correction=None
    )
    table = lu.shuffle_table(lu.shuffle_keys(key, 2), task.n)
    ref = np.asarray(lu.epoch_permutations(key, n, n, 2))
    per_epoch = -(-n // 10)
    for epoch in range(2):
        got, masks = [], []
        for s in range(epoch * per_epoch, (epoch + 1) * per_epoch):
            slots, mask = lu.batch_rows(spec, jnp.int32(s), task, table)
            slots, mask = np.asarray(slots), np.asarray(mask)
            assert ((slots >= start) & (slots < start + n)).all()
            got.append(slots[mask > 0] - start)
            masks.append(mask)
        assert np.array_equal(np.concatenate(got), ref[epoch])
        assert np.concatenate(masks).sum() == n


def test_shuffle_positions_are_close_to_uniform():
    # Where row 0 of a 10-row client lands, over 4000 keys: every position about 400 times.
    n, trials = 10, 4000
    keys = jax.random.split(jax.random.key(0), trials)
    first = jax.vmap(lambda k: lu.permute(lu.shuffle_keys(k, 1)[0], n, jnp.zeros((), jnp.int32)))(
        keys
    )
    counts = np.bincount(np.asarray(first), minlength=n)
    chi2 = float(((counts - trials / n) ** 2 / (trials / n)).sum())
    assert chi2 < 30.0, counts  # 9 degrees of freedom: p ~ 4e-4


def test_segments_cover_the_cohort_with_growing_head():
    local = None
    spec = rnd.RoundSpec(local, make_algorithm("fedavg"), cohort=1000, chunk=250)
    assert spec.segments == ((1, 1), (4, 1), (16, 1), (64, 1), (229, 4))
    assert spec.slots == 1001
    for m, c in [(8, 3), (8, 8), (1, 1), (20, 5), (10000, 2500)]:
        s = rnd.RoundSpec(local, make_algorithm("fedavg"), cohort=m, chunk=c)
        assert s.slots >= m and all(size <= c for size, _ in s.segments)
