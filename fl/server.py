"""The built-in federated algorithms, written on the extension point of :mod:`fl.algorithm`.

Contract: :func:`make_algorithm` builds the named presets as :class:`~fl.algorithm.Algorithm`
values: a server optax transformation applied to the pseudo-gradient ``−mean(Δ)`` (Reddi et al.
2021, "Adaptive Federated Optimization", alg. 2) and the client and server functions of
:mod:`fl.algorithm` (FedProx's proximal gradient, SCAFFOLD's corrected gradient, DP-FedAvg's
clipped update and noised mean). :func:`reddi_adaptive` is FedAdagrad/FedAdam/FedYogi exactly as
Reddi et al. write them (no bias correction, ``τ`` added to ``√v``); :func:`server_update` is the
pure server step.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fl.algorithm import (
    Algorithm,
    clipped_difference,
    control_variate_grad,
    model_difference,
    noised_mean,
    proximal_grad,
    weighted_mean,
)
from fl.choices import unknown_name

ADAPTIVE = ("fedadam", "fedyogi", "fedadagrad")
ADAPTIVE_FORMS = ("reddi", "optax")

ALGORITHMS = (
    "fedavg",
    "fedprox",
    "fedavgm",
    "fedadam",
    "fedyogi",
    "fedadagrad",
    "scaffold",
    "dpfedavg",
    "fedbuff",
)


class ReddiState(NamedTuple):
    """First and second moment estimates ``m_t`` and ``v_t`` of Reddi et al.'s algorithm 2."""

    m: optax.Updates
    v: optax.Updates


def reddi_adaptive(
    kind: str, learning_rate: float, b1: float = 0.9, b2: float = 0.99, tau: float = 1e-3
) -> optax.GradientTransformation:
    """FedAdagrad, FedAdam or FedYogi as written in Reddi et al. (2021), "Adaptive Federated
    Optimization", algorithm 2, applied to the pseudo-gradient ``g = −Δ``:

    ``m_t = β1 m_{t−1} + (1 − β1) g``;
    Adagrad ``v_t = v_{t−1} + g²``, Adam ``v_t = β2 v_{t−1} + (1 − β2) g²``,
    Yogi ``v_t = v_{t−1} − (1 − β2) g² sign(v_{t−1} − g²)``;
    ``x_{t+1} = x_t − η m_t / (√v_t + τ)``, with no bias correction, ``m_{−1} = 0`` and
    ``v_{−1} = τ²`` (the algorithm's ``v_{−1} ≥ τ²`` at equality). ``τ`` is the adaptivity
    degree (the paper's experiments use 1e-3); optax's adam/yogi differ by bias correction and
    by where ``eps`` enters.
    """

    def init(params):
        return ReddiState(
            m=jax.tree.map(jnp.zeros_like, params),
            v=jax.tree.map(lambda p: jnp.full_like(p, tau * tau), params),
        )

    def second(v, g):
        g2 = g * g
        if kind == "fedadagrad":
            return v + g2
        if kind == "fedadam":
            return b2 * v + (1.0 - b2) * g2
        return v - (1.0 - b2) * g2 * jnp.sign(v - g2)

    def update(grads, state, params=None):
        del params
        m = jax.tree.map(lambda m_, g: b1 * m_ + (1.0 - b1) * g, state.m, grads)
        v = jax.tree.map(second, state.v, grads)
        upd = jax.tree.map(lambda m_, v_: -learning_rate * m_ / (jnp.sqrt(v_) + tau), m, v)
        return upd, ReddiState(m=m, v=v)

    return optax.GradientTransformation(init, update)


def make_algorithm(
    name: str,
    server_lr: float | None = None,
    server_momentum: float = 0.9,
    tau: float = 1e-3,
    adaptive_form: str = "reddi",
) -> Algorithm:
    """The named preset (one of :data:`ALGORITHMS`).

    FedBuff (:mod:`fl.asynchronous`) applies its staleness-weighted buffer mean with SGD at
    ``server_lr`` (Nguyen et al. 2022, algorithm 1, ``η_g``). FedAvgM uses SGD with momentum;
    FedAdam, FedYogi and FedAdagrad use ``β1 = 0.9``,
    ``β2 = 0.99`` and adaptivity ``τ`` (default 1e-3) as in Reddi et al. (2021), in the paper's
    form (:func:`reddi_adaptive`, ``adaptive_form="reddi"``) or as optax's adam/yogi/adagrad with
    ``eps = τ`` (``"optax"``: bias-corrected). ``server_lr`` defaults to 1 for the averaging
    algorithms and 0.01 for the adaptive ones.
    """
    adaptive = name in ADAPTIVE
    lr = server_lr if server_lr is not None else (0.01 if adaptive else 1.0)
    if name in ("fedavg", "fedprox", "scaffold", "dpfedavg", "fedbuff"):
        opt = optax.sgd(lr)
    elif name == "fedavgm":
        opt = optax.sgd(lr, momentum=server_momentum)
    elif adaptive and adaptive_form == "reddi":
        opt = reddi_adaptive(name, lr, tau=tau)
    elif name == "fedadam":
        opt = optax.adam(lr, b1=0.9, b2=0.99, eps=tau)
    elif name == "fedyogi":
        opt = optax.yogi(lr, b1=0.9, b2=0.99, eps=tau)
    elif name == "fedadagrad":
        opt = optax.adagrad(lr, initial_accumulator_value=0.0, eps=tau)
    else:
        raise unknown_name("algorithm", name, ALGORITHMS, "algorithm")
    return Algorithm(
        name=name,
        server_opt=opt,
        local_grad={"fedprox": proximal_grad, "scaffold": control_variate_grad}.get(name),
        client_update=clipped_difference if name == "dpfedavg" else model_difference,
        aggregate=noised_mean if name == "dpfedavg" else weighted_mean,
        weighting="uniform" if name == "dpfedavg" else "size",
        straggler_policy="partial" if name == "fedprox" else "drop",
        scaffold=name == "scaffold",
        dp=name == "dpfedavg",
    )


def server_update(server_opt: optax.GradientTransformation, params, opt_state, mean_delta):
    """One server step: ``params ← params + server_opt(−mean_delta)``; returns both states."""
    pseudo_grad = optax.tree_utils.tree_scale(-1.0, mean_delta)
    updates, opt_state = server_opt.update(pseudo_grad, opt_state, params)
    return optax.apply_updates(params, updates), opt_state
