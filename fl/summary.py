"""What a run reports: its metrics columns, its summary (the keys ``--json`` prints) and the
lines a person reads.

Contract: :func:`summarise` turns a run's metrics table into the summary dict (full-precision
floats: JSON keeps every digit); :func:`summary_lines` renders the summary as text lines with
floats to 4 significant digits, the precision a float32 metric carries. Host-side, no I/O.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pandas as pd

from fl.build import Built
from fl.config import ExperimentConfig
from fl.personalization import STAT_COLUMNS
from fl.privacy import epsilon

COLUMNS = (
    "round",
    "sim_time_s",
    "train_loss",
    "test_accuracy",
    "test_loss",
    "clients_sampled",
    "clients_kept",
    "bytes_up",
    "bytes_down",
    "epsilon",
    "clip_norm",
)
# With fedbuff: the staleness (server updates since the client's model) of the arrived updates.
ASYNC_COLUMNS = ("staleness_mean", "staleness_max")
ACCURACY_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


def client_columns(cfg: ExperimentConfig) -> tuple[str, ...]:
    """With client_eval: per-client accuracy statistics of the model each client uses, and with
    personalization the mean per-client accuracy of the global model beside them."""
    if not cfg.client_eval:
        return ()
    return STAT_COLUMNS + (("client_acc_global_mean",) if cfg.personalize != "none" else ())


def columns(cfg: ExperimentConfig) -> list[str]:
    """The metrics columns of a run of ``cfg``."""
    extra = list(ASYNC_COLUMNS) if cfg.algorithm == "fedbuff" else []
    return list(COLUMNS) + extra + list(client_columns(cfg))


def time_to_accuracy(metrics: pd.DataFrame, threshold: float) -> dict | None:
    """The first round (and simulated time) at which test accuracy reaches ``threshold``."""
    hit = metrics[metrics["test_accuracy"] >= threshold]
    if hit.empty:
        return None
    row = hit.iloc[0]
    return {"round": int(row["round"]), "sim_time_s": float(row["sim_time_s"])}


def privacy_report(b: Built, rounds: int):
    """DP-FedAvg's (ε, δ) after each of ``rounds`` rounds (:func:`fl.privacy.epsilon`)."""
    n, m = b.data.population.num_clients, b.cfg.clients_per_round
    return epsilon(n, m, b.cfg.noise_multiplier, rounds, b.cfg.delta)


def _last(metrics: pd.DataFrame, col: str) -> float | None:
    vals = metrics[col].dropna()
    return float(vals.iloc[-1]) if len(vals) else None


def _fedbuff(cfg: ExperimentConfig, metrics: pd.DataFrame) -> dict:
    st = metrics["staleness_mean"]
    return {
        "buffer_size": cfg.buffer_size,
        "concurrency": cfg.concurrency,
        "server_updates": int(len(metrics)),
        "staleness_mean": float(st.mean()) if len(st) else None,
        "staleness_max": int(metrics["staleness_max"].max()) if len(st) else None,
        "staleness_weight": "1/sqrt(1+staleness)",
    }


def _client_eval(b: Built, metrics: pd.DataFrame) -> dict:
    cfg = b.cfg
    done = metrics.dropna(subset=[STAT_COLUMNS[0]])
    final = done.iloc[-1] if len(done) else None
    sizes = np.asarray(b.local_test.sizes)
    return {
        "personalize": cfg.personalize,
        "local_test_fraction": cfg.local_test_fraction,
        "clients_with_test": int((sizes > 0).sum()),
        **({"finetune_steps": cfg.finetune_steps} if cfg.personalize == "finetune" else {}),
        **({"ditto_lambda": cfg.ditto_lambda} if cfg.personalize == "ditto" else {}),
        **({"personal_models": "all clients"} if cfg.personalize == "ditto" else {}),
        **{c: (float(final[c]) if final is not None else None) for c in client_columns(cfg)},
    }


def _privacy(b: Built, metrics: pd.DataFrame) -> dict:
    cfg = b.cfg
    rep = privacy_report(b, max(len(metrics), 1))
    return {
        "epsilon": rep.epsilon,
        "delta": rep.delta,
        "rdp_order": rep.order,
        "noise_multiplier": cfg.noise_multiplier,
        "clip_norm": cfg.clip_norm,
        "final_clip_norm": _last(metrics, "clip_norm"),
        "adaptive_clip": cfg.adaptive_clip,
        "sampling_rate": rep.sampling_rate,
        "accountant": rep.accountant,
        "sampling_bound": rep.sampling_bound,
    }


def summarise(b: Built, metrics: pd.DataFrame, wall_s: float, clock, diverged_round) -> dict:
    """The run's summary (the keys ``--json`` prints). ``client_updates_per_s`` counts training
    time only (:class:`fl.checkpoint.TrainClock`); ``wall_time_s`` is everything."""
    cfg = b.cfg
    acc = metrics["test_accuracy"].dropna()
    summary = {
        "final_test_accuracy": _last(metrics, "test_accuracy"),
        "best_test_accuracy": float(acc.max()) if len(acc) else None,
        "final_train_loss": float(metrics["train_loss"].iloc[-1]) if len(metrics) else None,
        "final_test_loss": _last(metrics, "test_loss"),
        "rounds": int(len(metrics)),
        "sim_time_s": float(metrics["sim_time_s"].iloc[-1]) if len(metrics) else 0.0,
        "wall_time_s": wall_s,
        "train_time_s": clock.train_s,
        "client_updates": clock.updates,
        "client_updates_per_s": clock.timed_updates / clock.train_s if clock.train_s > 0 else None,
        "diverged": diverged_round is not None,
        "diverged_round": diverged_round,
        "dataset": b.data.name,
        "model": b.model.name,
        "task": b.model.task.name,
        "num_params": b.model.num_params,
        "train_flops_per_sample": b.model.train_flops_per_sample,
        "algorithm": b.spec.algorithm.name,
        "clients": b.data.population.num_clients,
        "chunk_size": b.spec.chunk,
        "jax_devices": len(jax.devices()),
        "jax_processes": jax.process_count(),
        "time_to_accuracy": {f"{t:g}": time_to_accuracy(metrics, t) for t in ACCURACY_THRESHOLDS},
    }
    if cfg.algorithm == "fedbuff":
        summary["fedbuff"] = _fedbuff(cfg, metrics)
    if cfg.trace is not None:
        summary["trace"] = cfg.trace
    if cfg.client_eval:
        summary["client_eval"] = _client_eval(b, metrics)
    if cfg.target_accuracy is not None:
        hit = time_to_accuracy(metrics, cfg.target_accuracy)
        summary["target_accuracy"] = cfg.target_accuracy
        summary["rounds_to_target"] = hit and hit["round"]
        summary["time_to_target_s"] = hit and hit["sim_time_s"]
    if b.spec.algorithm.dp:
        summary["privacy"] = _privacy(b, metrics)
    summary["config"] = cfg.to_dict()
    return summary


def g4(x) -> str:
    """A number to 4 significant digits (``n/a`` for ``None`` or NaN)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.4g}"


def summary_lines(s: dict) -> list[str]:
    """The summary as the lines ``aisim fl run`` prints (floats to 4 significant digits)."""
    lines = [
        f"final test accuracy {g4(s['final_test_accuracy'])}, best "
        f"{g4(s['best_test_accuracy'])}, final train loss {g4(s['final_train_loss'])}, "
        f"{s['rounds']} rounds, simulated {g4(s['sim_time_s'])} s, wall "
        f"{s['wall_time_s']:.3g} s, {g4(s['client_updates_per_s'])} client updates/s (training "
        "only: no evaluation, no first-round compile)"
    ]
    if "privacy" in s:
        p = s["privacy"]
        lines.append(
            f"DP: noise multiplier {p['noise_multiplier']:g}, ε = {g4(p['epsilon'])} at "
            f"δ = {p['delta']:g} ({p['accountant']}; {p['sampling_bound']})"
        )
    if "fedbuff" in s:
        f = s["fedbuff"]
        lines.append(
            f"FedBuff: {f['server_updates']} server updates of K = {f['buffer_size']} with "
            f"C = {f['concurrency']} in flight, mean staleness {f['staleness_mean']:.3g} "
            f"(max {f['staleness_max']})"
        )
    if "client_eval" in s:
        c = s["client_eval"]
        line = (
            f"per-client accuracy ({c['personalize']}): mean {g4(c['client_acc_mean'])}, "
            f"p10 {g4(c['client_acc_p10'])}, p50 {g4(c['client_acc_p50'])}, "
            f"p90 {g4(c['client_acc_p90'])}, worst 10% {g4(c['client_acc_worst10'])}"
        )
        if "client_acc_global_mean" in c:
            line += f" (global model: mean {g4(c['client_acc_global_mean'])})"
        lines.append(line)
    if s.get("time_to_target_s") is not None:
        lines.append(
            f"reached {s['target_accuracy']:g} test accuracy at round {s['rounds_to_target']}, "
            f"simulated {g4(s['time_to_target_s'])} s"
        )
    return lines
