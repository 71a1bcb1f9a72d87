"""Draws the FL figures of the README (docs/figures/fl_*.png) with aisim's own runs.

FedProx's Synthetic experiments (Li et al. 2020, fig. 1-2) at 30 of the paper's 200 rounds:
30 devices, 10 per round, E = 20, B = 10, lr 0.01. Then digits accuracy against rounds and
simulated time. Runtime: a few minutes on 2 CPU cores. Usage: ``python docs/make_fl_figures.py``
"""

from __future__ import annotations

from pathlib import Path

from fl import ExperimentConfig, plot_accuracy, plot_loss, simulate

OUT = Path(__file__).parent / "figures"
ROUNDS = 30
BASE = dict(
    dataset="synthetic",
    clients=30,
    clients_per_round=10,
    rounds=ROUNDS,
    local_epochs=20,
    batch_size=10,
    lr=0.01,
    devices="server",
)


def main() -> None:
    strag = {
        "FedAvg (drops stragglers)": dict(algorithm="fedavg"),
        "FedProx μ=0 (keeps partial work)": dict(algorithm="fedprox", mu=0.0),
        "FedProx μ=1": dict(algorithm="fedprox", mu=1.0),
    }
    runs_s = {
        k: simulate(ExperimentConfig(**BASE, stragglers=0.9, **v)).metrics for k, v in strag.items()
    }
    runs_i = {
        f"FedProx μ={mu:g}": simulate(
            ExperimentConfig(**BASE, iid=True, algorithm="fedprox", mu=mu)
        ).metrics
        for mu in (0.0, 1.0)
    }
    plot_loss(
        {"Synthetic(1,1), 90% stragglers": runs_s, "Synthetic-IID, no stragglers": runs_i},
        OUT / "fl_fedprox_synthetic.png",
    )
    for name, runs in (("stragglers", runs_s), ("iid", runs_i)):
        for k, m in runs.items():
            print(
                f"{name:10s} {k:34s} train loss: round 1 {m['train_loss'].iloc[0]:.3f}, "
                f"max {m['train_loss'].max():.3f}, round {ROUNDS} {m['train_loss'].iloc[-1]:.3f}"
            )
    digits = dict(
        dataset="digits",
        partition="dirichlet",
        dirichlet_alpha=0.5,
        clients=100,
        clients_per_round=10,
        rounds=200,
        local_epochs=5,
        batch_size=10,
        lr=0.1,
        eval_every=5,
    )
    runs_d = {
        "FedAvg, phones": simulate(ExperimentConfig(**digits, devices="phone")).metrics,
        "FedAvg, laptops": simulate(ExperimentConfig(**digits, devices="laptop")).metrics,
        "FedAdam, phones": simulate(
            ExperimentConfig(**digits, devices="phone", algorithm="fedadam", server_lr=0.01)
        ).metrics,
    }
    plot_accuracy(
        runs_d,
        OUT / "fl_digits_accuracy.png",
        title="digits, Dirichlet(0.5) over 100 clients, 10 per round",
    )
    for k, m in runs_d.items():
        m = m.dropna()
        print(
            f"digits     {k:34s} final acc {m['test_accuracy'].iloc[-1]:.3f}, "
            f"simulated {m['sim_time_s'].iloc[-1]:.0f} s"
        )


if __name__ == "__main__":
    main()
