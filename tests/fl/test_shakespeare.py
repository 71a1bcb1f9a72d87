"""LEAF's Shakespeare: the parser, the windows of the natural partition, the model, and learning."""

import dataclasses
import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fl import local_update as lu
from fl import round as rnd
from fl.build import hyper_of, round_inputs
from fl.config import ExperimentConfig, validate
from fl.models import cross_entropy, make_model
from fl.server import make_algorithm
from fl.shakespeare import SEQ_LEN, decode, roles, shakespeare, usable_roles
from simbase.errors import AisimError

ROOT = Path(__file__).resolve().parents[2]


def _maker():
    path = ROOT / "fl" / "datasets" / "make_shakespeare.py"
    spec = importlib.util.spec_from_file_location("make_shakespeare", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


PLAY = """PERSONS REPRESENTED.

Hamlet, a prince.

ACT I.

SCENE I. A platform.

HAM.
To be, or not to be.

HOR.
My lord?

[Exit Horatio.]

HAM.
That is the question.

HOR.
Good night.

[Enter Ghost.]

Stay, illusion!

HAM.
Words, words,
words.

GHOST
Remember me.
"""


def test_parser_follows_leaf_rules_on_a_hand_written_play():
    got = _maker().parse_play(PLAY)
    # Stage directions are dropped, a paragraph after one continues the last speaker, lines of a
    # speech are joined with spaces; GHOST heads one speech only, so it is no speaker.
    assert dict(got) == {
        "HAM": ["To be, or not to be.", "That is the question.", "Words, words, words."],
        "HOR": ["My lord?", "Good night. Stay, illusion!"],
    }
    ids = _maker().encode("a  b\nc~")
    assert decode(ids) == "a b c "  # spaces collapse, out-of-vocabulary characters are spaces


def test_natural_partition_windows_are_the_roles_text():
    names, texts, vocab = roles()
    assert len(vocab) == 80 and len(names) == len(texts) > 900
    ds = shakespeare(num_clients=5, seed=3)
    assert len(set(ds.client_names)) == 5
    for k, name in enumerate(ds.client_names):
        ids = texts[names.index(name)]
        cut = int(len(ids) * 0.9)
        rows = ds.population.client_rows(k)
        assert len(rows) == cut - SEQ_LEN  # every window of the train part, none across the cut
        x, y = ds.x_train[rows], ds.y_train[rows]
        np.testing.assert_array_equal(x[0], ids[:SEQ_LEN])
        np.testing.assert_array_equal(y, ids[SEQ_LEN:cut])
        np.testing.assert_array_equal(x[1:, :-1], x[:-1, 1:])  # consecutive windows slide by one
    tests = sum(
        len(texts[names.index(n)]) - int(len(texts[names.index(n)]) * 0.9) - SEQ_LEN
        for n in ds.client_names
    )
    assert ds.x_test.shape == (min(tests, 4000), SEQ_LEN) and ds.y_test.dtype == np.int32
    assert len(ds.train_eval_rows) == min(ds.population.sizes.sum(), 4000)
    big = shakespeare(num_clients=40, seed=3)
    assert big.x_test.shape == (4000, SEQ_LEN)  # subsampled
    again = shakespeare(num_clients=5, seed=3)
    assert again.client_names == ds.client_names  # deterministic
    np.testing.assert_array_equal(again.x_test, ds.x_test)


def test_lstm_is_leafs_model():
    m = make_model("lstm", (SEQ_LEN,), 80)
    # embedding 80x8; LSTM 256 on 8 inputs and on 256 inputs: 4 gates of input and recurrent
    # kernels, recurrent biases; dense 256 -> 80 with bias.
    layer1 = 4 * (8 * 256) + 4 * (256 * 256 + 256)
    layer2 = 4 * (256 * 256) + 4 * (256 * 256 + 256)
    assert m.num_params == 80 * 8 + layer1 + layer2 + 256 * 80 + 80 == 817_872
    per_position = 8 * 256 * (8 + 256) + 8 * 256 * (256 + 256) + 20 * 256
    assert m.train_flops_per_sample == 3 * (SEQ_LEN * per_position + 2 * 256 * 80)
    params = jax.eval_shape(m.init, jax.random.key(0))
    logits = jax.eval_shape(m.apply, params, jnp.zeros((3, SEQ_LEN), jnp.uint8))
    assert logits.shape == (3, 80)


def test_shakespeare_settings_without_effect_are_errors():
    ok = ExperimentConfig(dataset="shakespeare", clients=30)
    validate(ok)
    with pytest.raises(AisimError) as e:
        validate(dataclasses.replace(ok, partition="dirichlet"))
    assert e.value.field == "partition"
    with pytest.raises(AisimError) as e:
        shakespeare(num_clients=len(usable_roles()) + 1)
    assert e.value.field == "clients"


def _tiny(model_hidden=(32,)):
    ds = shakespeare(num_clients=4, seed=0)
    model = make_model("lstm", ds.input_shape, ds.num_classes, hidden=model_hidden)
    majority = np.bincount(ds.y_test).max() / len(ds.y_test)
    return ds, model, majority


@pytest.mark.slow
def test_tiny_lstm_learns_above_the_majority_character():
    """Fast twin of the federated test: one client's SGD on the pooled windows."""
    ds, model, majority = _tiny()
    params = model.init(jax.random.key(0))
    opt = optax.sgd(1.0)
    state = opt.init(params)

    @jax.jit
    def step(p, s, x, y):
        g = jax.grad(lambda q: cross_entropy(model.apply(q, x), y, jnp.ones(len(y))))(p)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

    rng = np.random.default_rng(0)
    for _ in range(150):
        r = rng.integers(0, len(ds.y_train), 10)
        params, state = step(params, state, ds.x_train[r], ds.y_train[r])
    acc = float(jnp.mean(jnp.argmax(model.apply(params, ds.x_test), 1) == ds.y_test))
    assert acc > majority + 0.04, (acc, majority)


@pytest.mark.slow
def test_federated_tiny_lstm_learns_above_the_majority_character():
    ds, model, majority = _tiny(model_hidden=(64,))
    cfg = ExperimentConfig(
        dataset="shakespeare",
        clients=4,
        clients_per_round=4,
        lr=1.0,
        devices="server",
        max_local_steps=25,
    )
    local = lu.LocalSpec(model.apply, optax.sgd(cfg.lr), 10, int(ds.population.sizes.max()), 1)
    spec = rnd.RoundSpec(
        local,
        make_algorithm("fedavg"),
        cohort=4,
        chunk=4,
        flops_per_sample=model.train_flops_per_sample,
        param_bytes=model.param_bytes,
    )
    run = jax.jit(rnd.make_round(spec))
    evaluate = jax.jit(rnd.make_evaluate(model.apply))
    inputs, hyper = round_inputs(cfg, ds), hyper_of(cfg)
    state = rnd.init_server_state(spec, model.init(jax.random.key(0)), 4, 0)
    _, acc0 = evaluate(state.params, ds.x_test, ds.y_test)
    for _ in range(8):
        state, met = run(state, inputs, hyper)
    _, acc = evaluate(state.params, ds.x_test, ds.y_test)
    assert int(met.clients_kept) == 4
    assert float(acc0) < majority + 0.02 < majority + 0.06 < float(acc), (acc0, acc, majority)
