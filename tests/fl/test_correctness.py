"""Issue 17 §1: size sampling is unbiased, stragglers are FedProx's, silent clients cost time,
the DP report runs every round, adaptive clipping and Reddi's optimisers are as published, the
Dirichlet forms, and settings that would do nothing are errors."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fl import round as rnd
from fl.config import ExperimentConfig, validate
from fl.partition import dirichlet
from fl.server import reddi_adaptive
from fl.simulation import build, simulate
from simbase.errors import AisimError

# FedProx (Li et al. 2020) Synthetic(1, 1): 30 devices, 10 per round.
FEDPROX = dict(dataset="synthetic", clients=30, clients_per_round=10, devices="server", rounds=2)


def _plans(b, rounds, hyper=None, inputs=None):
    """The cohort plans of rounds ``0..rounds-1`` (vmapped over the round counter)."""
    hyper, inputs = hyper or b.hyper, inputs or b.inputs

    def plan(r):
        return rnd.plan_cohort(b.spec, dataclasses.replace(b.init_state, round=r), inputs, hyper)

    return jax.jit(jax.vmap(plan))(jnp.arange(rounds, dtype=jnp.int32))


@pytest.mark.slow
def test_size_sampling_gives_each_client_its_data_share():
    # A client's effective weight is its share of the round's aggregation weight, averaged over
    # rounds; FedProx's scheme (with replacement, plain average) makes it n_k / Σ n exactly.
    b = build(ExperimentConfig(**FEDPROX, sampling="size"))
    sizes = np.asarray(b.inputs.sizes, float)
    share = sizes / sizes.sum()
    assert 0.2 < share.max() < 0.26  # the largest device holds ~0.23 of the data
    rounds = 4000
    p = _plans(b, rounds)
    w = np.asarray(p.weight) / np.asarray(p.weight).sum(axis=1, keepdims=True)
    eff = np.zeros(30)
    np.add.at(eff, np.asarray(p.ids).ravel(), w.ravel())
    eff /= rounds
    # per round a client's weight is Binomial(10, p_k) / 10: sd sqrt(p(1-p)/10/rounds) <= 0.0022
    np.testing.assert_allclose(eff, share, atol=0.011)
    # repeats are trained once and counted by multiplicity; the round still has 10 draws
    assert np.all(np.asarray(p.weight).sum(axis=1) == 10)
    assert np.any(np.asarray(p.contacted).sum(axis=1) < 10)


@pytest.mark.slow
@pytest.mark.parametrize("f, stragglers", [(0.5, 5), (0.25, 2), (0.35, 4), (0.9, 9)])
def test_stragglers_are_a_fixed_number_doing_1_to_e_minus_1_epochs(f, stragglers):
    # FedProx's flearn/trainers/fedprox.py: round(m (1 - f)) active (numpy rounds half to even:
    # 7.5 -> 8, 6.5 -> 6), the others np.random.randint(1, E) epochs; FedAvg drops them.
    e = 5
    avg = build(ExperimentConfig(**FEDPROX, stragglers=f, local_epochs=e))
    assert set(np.asarray(_plans(avg, 200).kept.sum(axis=1)).tolist()) == {10 - stragglers}
    prox = build(ExperimentConfig(**FEDPROX, stragglers=f, local_epochs=e, algorithm="fedprox"))
    p = _plans(prox, 200)
    per_epoch = -(-np.asarray(p.n) // 10)
    epochs = np.asarray(p.steps) / per_epoch
    assert np.all((epochs < e).sum(axis=1) == stragglers)
    assert set(np.unique(epochs[epochs < e]).tolist()) == set(range(1, e))


@pytest.mark.slow
def test_a_round_nobody_answers_costs_the_timeout_or_the_deadline():
    b = build(ExperimentConfig(**FEDPROX))
    silent = dataclasses.replace(
        b.inputs, systems=dataclasses.replace(b.inputs.systems, availability=jnp.zeros(30))
    )
    p = rnd.plan_cohort(b.spec, b.init_state, silent, b.hyper)
    full = rnd.plan_cohort(b.spec, b.init_state, b.inputs, b.hyper)  # everyone answers
    assert int(p.kept.sum()) == 0
    np.testing.assert_allclose(float(p.round_time_s), float(full.round_time_s), rtol=1e-6)
    hyper = dataclasses.replace(b.hyper, deadline_s=jnp.float32(123.0))
    p = rnd.plan_cohort(b.spec, b.init_state, silent, hyper)
    assert float(p.round_time_s) == 123.0
    new, met = b.run_round(b.init_state, silent, b.hyper)
    assert float(met.round_time_s) > 0 and int(met.clients_kept) == 0
    for a, c in zip(jax.tree.leaves(new.params), jax.tree.leaves(b.init_state.params), strict=True):
        np.testing.assert_array_equal(a, c)


@pytest.mark.slow
def test_dropped_stragglers_hold_the_server_until_their_timeout():
    b = build(ExperimentConfig(**FEDPROX, stragglers=0.5, local_epochs=3))
    p = _plans(b, 20)
    free = _plans(build(ExperimentConfig(**FEDPROX, local_epochs=3)), 20)
    np.testing.assert_allclose(p.round_time_s, free.round_time_s, rtol=1e-6)


@pytest.mark.slow
def test_epsilon_every_round_and_adaptive_clip_by_hand(tmp_path):
    # Adaptive clipping with negligible count noise: every update is below C = 1000, so the
    # unclipped fraction is 1 and C_r = 1000 exp(-η (1 - γ) r) (Andrew et al. 2021, alg. 1).
    cfg = ExperimentConfig(
        **dict(FEDPROX, rounds=4),
        algorithm="dpfedavg",
        clip_norm=1000.0,
        noise_multiplier=1e-7,
        adaptive_clip=True,
        clip_quantile=0.5,
        clip_lr=0.2,
        clip_count_stddev=1e-6,
    )
    r = simulate(cfg, tmp_path)
    want = 1000.0 * np.exp(-0.2 * 0.5 * np.arange(4))
    np.testing.assert_allclose(r.metrics["clip_norm"], want, rtol=1e-5)
    eps = r.metrics["epsilon"].to_numpy()
    assert np.all(np.diff(eps) > 0)
    assert r.summary["privacy"]["epsilon"] == eps[-1]
    assert "dp-accounting" in r.summary["privacy"]["accountant"]
    assert "without replacement" in r.summary["privacy"]["sampling_bound"]
    assert (tmp_path / "metrics.csv").read_text().splitlines()[0].endswith("epsilon,clip_norm")


@pytest.mark.parametrize("kind", ["fedadagrad", "fedadam", "fedyogi"])
def test_reddi_optimisers_match_algorithm_2_by_hand(kind):
    lr, b1, b2, tau = 0.1, 0.9, 0.99, 1e-3
    opt = reddi_adaptive(kind, lr, b1, b2, tau)
    x = jnp.array([0.5, -1.0, 2.0])
    state = opt.init(x)
    xs, m, v = np.asarray(x, float), np.zeros(3), np.full(3, tau**2)
    for g in ([0.3, -0.2, 0.0], [1.0, 0.5, -2.0], [-0.1, 0.1, 0.4]):
        upd, state = opt.update(jnp.array(g), state, x)
        x = optax.apply_updates(x, upd)
        g = np.array(g)
        m = b1 * m + (1 - b1) * g
        if kind == "fedadagrad":
            v = v + g * g
        elif kind == "fedadam":
            v = b2 * v + (1 - b2) * g * g
        else:
            v = v - (1 - b2) * g * g * np.sign(v - g * g)
        xs = xs - lr * m / (np.sqrt(v) + tau)
        np.testing.assert_allclose(x, xs, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("form", ["per-class", "per-client"])
def test_dirichlet_alpha_0_1_over_100_clients(form):
    from fl.data import digits

    d = digits(100, "dirichlet", 0.1, seed=0, dirichlet_form=form)
    pop = d.population
    assert pop.num_clients == 100 and pop.sizes.min() >= 2
    assert np.array_equal(np.sort(pop.order), np.arange(len(d.y_train)))
    if form == "per-client":  # Hsu et al.: equal sizes
        assert pop.sizes.max() - pop.sizes.min() <= 1


def test_per_client_dirichlet_follows_the_prior_and_is_more_skewed_at_equal_alpha():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), 1000)

    def top_share(pop):
        return np.mean(
            [
                np.bincount(labels[pop.client_rows(k)], minlength=10).max() / pop.sizes[k]
                for k in range(pop.num_clients)
            ]
        )

    flat = dirichlet(labels, 20, 1e4, rng, form="per-client")
    assert top_share(flat) < 0.2  # α → ∞: every client's classes follow the prior (0.1 each)
    skew_client = top_share(dirichlet(labels, 50, 1.0, rng, form="per-client"))
    skew_class = top_share(dirichlet(labels, 50, 1.0, rng, form="per-class"))
    assert skew_client > skew_class + 0.2


@pytest.mark.parametrize(
    "change, field",
    [
        ({"mu": 0.1}, "mu"),
        ({"algorithm": "scaffold", "mu": 0.1}, "mu"),
        ({"dataset": "digits", "iid": True}, "iid"),
        ({"clients": 20_000, "clients_per_round": 10, "iid": True}, "iid"),
        ({"iid": True, "alpha": 0.5}, "alpha"),
        ({"partition": "dirichlet"}, "partition"),
        ({"dataset": "digits", "dirichlet_alpha": 0.1}, "dirichlet_alpha"),
        ({"dataset": "digits", "dirichlet_form": "per-client"}, "dirichlet_form"),
        ({"server_momentum": 0.5}, "server_momentum"),
        ({"tau": 0.1}, "tau"),
        ({"noise_multiplier": 2.0}, "noise_multiplier"),
        ({"adaptive_clip": True}, "adaptive_clip"),
        ({"algorithm": "dpfedavg", "clip_lr": 0.5}, "clip_lr"),
        ({"algorithm": "dpfedavg", "sampling": "size"}, "sampling"),
        (
            {"algorithm": "dpfedavg", "adaptive_clip": True, "noise_multiplier": 2.0},
            "noise_multiplier",
        ),
        ({"algorithm": "fedprox", "stragglers": 0.5}, "stragglers"),
    ],
)
def test_settings_without_effect_are_errors(change, field):
    with pytest.raises(AisimError) as e:
        validate(ExperimentConfig(**change))
    assert e.value.field == field and e.value.usage


@pytest.mark.slow
def test_dp_adaptive_clip_resumes_bit_exactly(tmp_path):
    cfg = ExperimentConfig(
        **dict(FEDPROX, rounds=5, checkpoint_every=2),
        algorithm="dpfedavg",
        noise_multiplier=0.5,
        adaptive_clip=True,
    )
    full = simulate(cfg, tmp_path / "a").metrics
    simulate(cfg, tmp_path / "b", stop_after=3)
    resumed = simulate(cfg, tmp_path / "b", resume=True).metrics
    assert full.equals(resumed)
    assert full["clip_norm"].nunique() == 5
