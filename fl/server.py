"""Federated algorithms as data: the server optimiser, the local correction and the policies.

Contract: an :class:`Algorithm` names a server optax transformation, applied to the
pseudo-gradient ``−mean(Δ)`` (Reddi et al. 2021, "Adaptive Federated Optimization", alg. 2), and
flags for FedProx's proximal term, SCAFFOLD's control variates and DP-FedAvg's clipping and
noise. :func:`make_algorithm` builds the named presets; any optax transformation can be passed
instead. :func:`server_update` is the pure server step.
"""

from __future__ import annotations

import dataclasses

import optax

ALGORITHMS = (
    "fedavg",
    "fedprox",
    "fedavgm",
    "fedadam",
    "fedyogi",
    "fedadagrad",
    "scaffold",
    "dpfedavg",
)


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """A federated algorithm.

    Attributes:
      name: its name.
      server_opt: the optax transformation applied to the pseudo-gradient ``−mean(Δ)``.
      proximal: FedProx: add ``μ (w − w_global)`` to local gradients.
      scaffold: SCAFFOLD control variates (option II of Karimireddy et al. 2020).
      dp: DP-FedAvg: clip each update and add Gaussian noise to the sum.
      straggler_policy: ``drop`` (FedAvg: stragglers are discarded) or ``partial`` (FedProx:
        their partial work is kept).
    """

    name: str
    server_opt: optax.GradientTransformation
    proximal: bool = False
    scaffold: bool = False
    dp: bool = False
    straggler_policy: str = "drop"


def make_algorithm(
    name: str, server_lr: float | None = None, server_momentum: float = 0.9
) -> Algorithm:
    """The named preset (one of :data:`ALGORITHMS`).

    FedAvgM uses SGD with momentum; FedAdam, FedYogi and FedAdagrad use ``β1 = 0.9``,
    ``β2 = 0.99`` and ``τ = 1e-3`` as in Reddi et al. (2021). ``server_lr`` defaults to 1 for the
    averaging algorithms and 0.01 for the adaptive ones.
    """
    adaptive = name in ("fedadam", "fedyogi", "fedadagrad")
    lr = server_lr if server_lr is not None else (0.01 if adaptive else 1.0)
    if name in ("fedavg", "fedprox", "scaffold", "dpfedavg"):
        opt = optax.sgd(lr)
    elif name == "fedavgm":
        opt = optax.sgd(lr, momentum=server_momentum)
    elif name == "fedadam":
        opt = optax.adam(lr, b1=0.9, b2=0.99, eps=1e-3)
    elif name == "fedyogi":
        opt = optax.yogi(lr, b1=0.9, b2=0.99, eps=1e-3)
    elif name == "fedadagrad":
        opt = optax.adagrad(lr, initial_accumulator_value=0.0, eps=1e-3)
    else:
        from fl.config import unknown_name

        raise unknown_name("algorithm", name, ALGORITHMS, "algorithm")
    return Algorithm(
        name=name,
        server_opt=opt,
        proximal=name == "fedprox",
        scaffold=name == "scaffold",
        dp=name == "dpfedavg",
        straggler_policy="partial" if name == "fedprox" else "drop",
    )


def server_update(server_opt: optax.GradientTransformation, params, opt_state, mean_delta):
    """One server step: ``params ← params + server_opt(−mean_delta)``; returns both states."""
    pseudo_grad = optax.tree_utils.tree_scale(-1.0, mean_delta)
    updates, opt_state = server_opt.update(pseudo_grad, opt_state, params)
    return optax.apply_updates(params, updates), opt_state
