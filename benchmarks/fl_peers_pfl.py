"""pfl-research's simulation on a partition that ``fl_peers.py`` wrote: the pfl row of its table.

Run by ``benchmarks/fl_peers.py --pfl-python PATH`` in a separate interpreter (pfl with its
PyTorch backend, ``pip install 'pfl[pytorch]' torch`` outside the repository; it imports nothing
from aisim), because pfl pins ``dp-accounting`` below 0.6 and brings PyTorch, which aisim does
not need. The partition file (.npz) holds the training rows, each client's rows, the test set
and the hyper-parameters, so every simulator sees the same clients.

pfl's own single-process setting, as its benchmarks run it (pfl-research ``benchmarks/
image_classification/pytorch/train.py``): a ``PyTorchModel`` with ``torch.optim.SGD`` locally
and centrally (central learning rate 1), ``FederatedAveraging`` through ``SimulatedBackend``,
users in a ``FederatedDataset`` of torch tensors, every user each round (``minimize_reuse``
sampling with a cohort of all users), updates weighted by data points (as aisim's FedAvg), local
batches of B for E epochs, no evaluation during training. Timing matches the other rows: the
clock runs from the end of central iteration 1 to the end of iteration R
(``after_central_iteration``), so it covers R - 1 rounds. Client updates per second = clients x
(R - 1) / timed seconds; accuracy is that of the final model on the test set.

Usage: ``python fl_peers_pfl.py PARTITION.npz RESULT.json --rounds R``
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pfl
import torch
from pfl.aggregate.simulate import SimulatedBackend
from pfl.aggregate.weighting import WeightByDatapoints
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.callback.base import TrainingProcessCallback
from pfl.data import FederatedDataset
from pfl.data.dataset import Dataset
from pfl.data.sampling import get_user_sampler
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
from pfl.metrics import Metrics, Weighted
from pfl.model.pytorch import PyTorchModel


class MLP(torch.nn.Module):
    """The task's MLP (no hidden layer: logistic regression), initialised as flax's ``Dense``
    (aisim's model), with the ``loss`` and ``metrics`` methods pfl's ``PyTorchModel`` calls."""

    def __init__(self, sizes: list[int]):
        super().__init__()
        layers = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            layers.append(torch.nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(torch.nn.ReLU())
        self.net = torch.nn.Sequential(*layers)
        for layer in self.net:  # flax's Dense default, as aisim's model: LeCun normal, zero bias
            if isinstance(layer, torch.nn.Linear):
                std = 1.0 / np.sqrt(layer.in_features) / 0.87962566103423978
                torch.nn.init.trunc_normal_(layer.weight, std=std, a=-2 * std, b=2 * std)
                torch.nn.init.zeros_(layer.bias)

    def forward(self, x):
        return self.net(x)

    def loss(self, x, y, eval=False):
        self.eval() if eval else self.train()
        return torch.nn.functional.cross_entropy(self(x), y.long())

    @torch.no_grad()
    def metrics(self, x, y, eval=True):
        self.eval() if eval else self.train()
        logits = self(x)
        n = len(x)
        loss = torch.nn.functional.cross_entropy(logits, y.long(), reduction="sum").item()
        correct = (logits.argmax(-1) == y.long()).float().sum().item()
        return {"loss": Weighted(loss, n), "accuracy": Weighted(correct, n)}


class Clock(TrainingProcessCallback):
    """The time at the end of every central iteration."""

    def __init__(self):
        self.ends: list[float] = []

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        self.ends.append(time.perf_counter())
        return False, Metrics()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("partition")
    ap.add_argument("result")
    ap.add_argument("--rounds", type=int, required=True)
    args = ap.parse_args()
    with np.load(args.partition) as z:
        p = {k: z[k] for k in z.files}
    torch.manual_seed(int(p["seed"]))
    np.random.seed(int(p["seed"]))
    x = torch.as_tensor(p["x_train"].reshape(len(p["x_train"]), -1))
    y = torch.as_tensor(p["y_train"].astype(np.int64))
    rows, off = p["rows"], p["offsets"]
    users = {
        k: Dataset(raw_data=[x[rows[off[k] : off[k + 1]]], y[rows[off[k] : off[k + 1]]]])
        for k in range(len(off) - 1)
    }
    n_users = len(users)
    sampler = get_user_sampler("minimize_reuse", list(range(n_users)))
    data = FederatedDataset(lambda uid: users[uid], sampler)
    sizes = [x.shape[1], *[int(h) for h in p["hidden"]], int(p["num_classes"])]
    net = MLP(sizes)
    model = PyTorchModel(
        model=net,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(net.parameters(), 1.0),
    )
    backend = SimulatedBackend(
        training_data=data, val_data=None, postprocessors=[WeightByDatapoints()]
    )
    clock = Clock()
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=args.rounds,
            evaluation_frequency=args.rounds + 1,
            train_cohort_size=n_users,
            val_cohort_size=0,
        ),
        backend=backend,
        model=model,
        model_train_params=NNTrainHyperParams(
            local_learning_rate=float(p["lr"]),
            local_num_epochs=int(p["local_epochs"]),
            local_batch_size=int(p["batch_size"]),
        ),
        model_eval_params=NNEvalHyperParams(local_batch_size=10_000),
        callbacks=[clock],
    )
    timed = clock.ends[-1] - clock.ends[0]
    with torch.no_grad():  # the final global model, which pfl trains in place
        logits = net(torch.as_tensor(p["x_test"].reshape(len(p["x_test"]), -1)))
        accuracy = (logits.argmax(-1).numpy() == p["y_test"]).mean()
    result = {
        "updates_per_s": n_users * (args.rounds - 1) / timed,
        "accuracy": float(accuracy),
        "timed_s": timed,
        "version": getattr(pfl, "__version__", "?"),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    with open(args.result, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
