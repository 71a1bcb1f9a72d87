"""The extension points proven by use: a user's flax module, algorithm and data run through the
same engine as the built-ins and give their metrics bit for bit; what cannot be traced is one
error naming the user's function; the command line takes all three by import path."""

from __future__ import annotations

import dataclasses
import json
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd
import pytest
from flax import nnx
from typer.testing import CliRunner

import fl
from aisim.app import app
from simbase.errors import AisimError


class UserMLP(nn.Module):
    """The digits MLP as a user writes it (the built-in ``mlp``'s layers)."""

    num_classes: int

    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], -1))
        for h in (200, 200):
            x = nn.relu(nn.Dense(h, dot_general=fl.dense_dot_general)(x))
        return nn.Dense(self.num_classes, dot_general=fl.dense_dot_general)(x)


def user_fedavg() -> fl.Algorithm:
    """FedAvg written on the extension point."""
    return fl.Algorithm(
        name="user-fedavg",
        server_opt=optax.sgd(1.0),
        client_update=lambda p, g, ctx: jax.tree.map(lambda a, b: a - b, p, g),
        aggregate=lambda s, w, ctx: jax.tree.map(lambda t: t / jnp.maximum(w, 1e-12), s),
    )


def user_fedprox() -> fl.Algorithm:
    """FedProx as the guide writes it: FedAvg with the proximal gradient, partial stragglers."""

    def local_grad(grad, params, global_params, ctx):
        return jax.tree.map(lambda g, w, w0: g + ctx.mu * (w - w0), grad, params, global_params)

    return fl.Algorithm("user-fedprox", optax.sgd(1.0), local_grad, straggler_policy="partial")


def _metrics(cfg, **kw) -> pd.DataFrame:
    return fl.simulate(cfg, **kw).metrics


@pytest.fixture(scope="module")
def cfg():
    return fl.ExperimentConfig(
        dataset="digits",
        clients=20,
        clients_per_round=6,
        rounds=3,
        local_epochs=1,
        lr=0.05,
        devices="server",
        partition="dirichlet",
    )


@pytest.fixture(scope="module")
def builtin(cfg):
    return _metrics(cfg)


@pytest.mark.slow
def test_user_module_gives_the_builtin_metrics_bit_for_bit(cfg, builtin):
    ds = fl.digits(20, "dirichlet", seed=0)
    model = fl.model_from_linen(UserMLP(10), ds.input_shape, name="user-mlp")
    assert model.num_params == fl.make_model("mlp", (64,), 10).num_params
    pd.testing.assert_frame_equal(_metrics(cfg, model=model), builtin, check_exact=True)


@pytest.mark.slow
def test_user_fedavg_gives_the_builtin_metrics_bit_for_bit(cfg, builtin):
    pd.testing.assert_frame_equal(_metrics(cfg, algorithm=user_fedavg()), builtin, check_exact=True)


@pytest.mark.slow
def test_user_fedprox_gives_the_builtin_fedprox(cfg):
    prox = dataclasses.replace(cfg, algorithm="fedprox", mu=0.3, stragglers=0.5, local_epochs=2)
    mine = dataclasses.replace(prox, algorithm="fedavg")
    pd.testing.assert_frame_equal(
        _metrics(mine, algorithm=user_fedprox()), _metrics(prox), check_exact=True
    )


@pytest.mark.slow  # its fixture runs the built-in simulation
def test_user_data_from_arrays_gives_the_builtin_metrics_bit_for_bit(cfg, builtin):
    ds = fl.digits(20, "dirichlet", seed=0)
    pop = ds.population  # the user's arrays: each client's samples, client after client
    ids = np.repeat(np.arange(pop.num_clients), pop.sizes)
    mine = fl.from_arrays(
        ds.x_train[pop.order], ds.y_train[pop.order], ids, x_test=ds.x_test, y_test=ds.y_test
    )
    np.testing.assert_array_equal(mine.population.sizes, pop.sizes)
    assert mine.num_classes == 10
    got = _metrics(cfg, data=dataclasses.replace(mine, name="digits"))
    # training is bit for bit the same; the train loss sums the pool, here in client order
    pd.testing.assert_frame_equal(
        got.drop(columns="train_loss"), builtin.drop(columns="train_loss"), check_exact=True
    )
    np.testing.assert_allclose(got["train_loss"], builtin["train_loss"], rtol=1e-6)


def not_traceable(grad, params, global_params, ctx):
    if ctx.mu > 0:  # a Python branch on a traced value
        return grad
    return grad


def wrong_shape(params, global_params, ctx):
    return jax.tree.map(lambda p: p[:1], params)


@pytest.mark.parametrize(
    "alg, needle",
    [
        (fl.Algorithm("bad", optax.sgd(1.0), local_grad=not_traceable), "not_traceable"),
        (fl.Algorithm("bad", optax.sgd(1.0), client_update=wrong_shape), "wrong_shape"),
    ],
)
def test_an_untraceable_user_function_is_one_error_naming_it(cfg, alg, needle):
    with pytest.raises(AisimError) as e:
        fl.build(cfg, algorithm=alg)
    msg = str(e.value)
    assert e.value.field == "algorithm" and needle in msg and "\n" not in msg
    assert "jax.jit and jax.vmap" in msg or "shaped like the model" in msg


class NNXLinear(nnx.Module):
    def __init__(self, din, dout, rngs):
        self.linear = nnx.Linear(din, dout, rngs=rngs)

    def __call__(self, x):
        return self.linear(x.reshape((x.shape[0], -1)))


@pytest.mark.slow
def test_nnx_module_and_regression_task(cfg):
    """An NNX model on the user's regression data: the loss falls, accuracy is NaN."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(5, 2)).astype(np.float32)
    x = rng.normal(size=(300, 5)).astype(np.float32)
    data = fl.from_arrays(x, x @ w, np.repeat(np.arange(10), 30), integer_labels=False)
    model = fl.model_from_nnx(lambda rngs: NNXLinear(5, 2, rngs), (5,), task=fl.REGRESSION)
    assert model.num_params == 12 and model.train_flops_per_sample > 0
    run = dataclasses.replace(cfg, clients=10, rounds=8, lr=0.1, partition="iid")
    res = fl.simulate(run, model=model, data=data)
    loss = res.metrics["test_loss"].dropna()
    assert loss.iloc[-1] < 0.5 * loss.iloc[0]
    assert res.summary["final_test_accuracy"] is None and res.summary["task"] == "regression"


USER_CODE = """
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import fl


class TinyMLP(nn.Module):
    num_classes: int

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(16)(x.reshape((x.shape[0], -1))))
        return nn.Dense(self.num_classes)(x)


def mlp(input_shape, num_outputs):
    return TinyMLP(num_outputs)


def fedavg():
    return fl.Algorithm(
        name="my-fedavg",
        server_opt=optax.sgd(1.0),
        aggregate=lambda s, w, ctx: jax.tree.map(lambda t: t / jnp.maximum(w, 1e-12), s),
    )
"""


@pytest.mark.slow
def test_cli_runs_a_user_model_data_and_algorithm(tmp_path, monkeypatch):
    (tmp_path / "my_fl.py").write_text(textwrap.dedent(USER_CODE))
    rng = np.random.default_rng(0)
    np.savez(
        tmp_path / "d.npz",
        x=rng.random((120, 8)),
        y=rng.integers(0, 3, 120),
        client_id=np.repeat(np.arange(12), 10),
    )
    monkeypatch.chdir(tmp_path)
    args = [
        "fl",
        "run",
        "--data",
        "d.npz",
        "--model-module",
        "my_fl:mlp",
        "--algorithm-module",
        "my_fl:fedavg",
        "--clients-per-round",
        "4",
        "--rounds",
        "3",
        "--devices",
        "server",
        "--lr",
        "0.1",
        "--json",
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert (s["model"], s["algorithm"], s["dataset"], s["clients"]) == (
        "my_fl:mlp",
        "my-fedavg",
        "d",
        12,
    )
    assert s["num_params"] == 8 * 16 + 16 + 16 * 3 + 3
    assert s["config"]["model_module"] == "my_fl:mlp" and s["config"]["data"] == "d.npz"
    res = CliRunner().invoke(app, [*args[:5], "my_fl:nothing", *args[6:]])
    assert res.exit_code == 2 and "'--model-module' = 'my_fl:nothing'" in res.stderr


def test_the_experiment_file_takes_the_new_keys(tmp_path):
    f = tmp_path / "exp.toml"
    f.write_text(
        'data = "d.npz"\ndata-format = "npz"\nmodel-module = "my_fl:mlp"\n'
        'algorithm-module = "my_fl:fedavg"\ndata-dir = "cache"\ndownload = true\n'
    )
    assert fl.load_toml(f) == {
        "data": "d.npz",
        "data_format": "npz",
        "model_module": "my_fl:mlp",
        "algorithm_module": "my_fl:fedavg",
        "data_dir": "cache",
        "download": True,
    }
