"""The imperative shell of an FL run: build (:mod:`fl.build`), loop over rounds, evaluate, checkpoint,
summarise.

Contract: :func:`simulate` turns a validated :class:`~fl.config.ExperimentConfig` into a
:class:`SimulationResult` (one metrics row per round, and a summary). With ``out_dir`` it writes
``config.json`` at the start, an atomic ``checkpoint.msgpack`` every ``checkpoint_every`` rounds,
and ``metrics.csv`` / ``summary.json`` at the end; ``resume=True`` continues from the checkpoint
and, since every round's randomness is keyed by the round number, reaches the same final metrics
as an uninterrupted run. A NaN or infinite model stops the run, keeping the rows so far.
With ``algorithm = "fedbuff"`` a row is one server update (:mod:`fl.asynchronous`) and the
metrics gain the staleness columns; with ``client_eval`` every evaluated row gains the per-client
accuracy statistics (:mod:`fl.personalization`), and Ditto's personal models are checkpointed
with the server state.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from flax import serialization

from fl.build import Built, build
from fl.config import ExperimentConfig
from fl.privacy import epsilon
from simbase.errors import AisimError, bad_value
from simbase.io import read_json

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


def client_columns(cfg: ExperimentConfig) -> tuple[str, ...]:
    """With client_eval: per-client accuracy statistics of the model each client uses, and with
    personalization the mean per-client accuracy of the global model beside them."""
    if not cfg.client_eval:
        return ()
    from fl.personalization import STAT_COLUMNS

    return STAT_COLUMNS + (("client_acc_global_mean",) if cfg.personalize != "none" else ())


# With fedbuff: the staleness (server updates since the client's model) of the arrived updates.
ASYNC_COLUMNS = ("staleness_mean", "staleness_max")
ACCURACY_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
CHECKPOINT = "checkpoint.msgpack"


@dataclasses.dataclass
class SimulationResult:
    """Metrics (one row per completed round, :data:`COLUMNS`) and the run's summary."""

    metrics: pd.DataFrame
    summary: dict


def _keyless(state):
    """``state`` without its PRNG key (a typed key is not serialisable; the run's seed gives it)."""
    if isinstance(state, tuple):  # the server state and Ditto's personal models
        return tuple(_keyless(s) for s in state)
    if hasattr(state, "server"):  # fedbuff's AsyncState
        return dataclasses.replace(state, server=_keyless(state.server))
    if hasattr(state, "key"):
        return dataclasses.replace(state, key=None)
    return state


def _with_key(state, template):
    if isinstance(state, tuple):
        return tuple(_with_key(s, t) for s, t in zip(state, template, strict=True))
    if hasattr(state, "server"):
        return dataclasses.replace(state, server=_with_key(state.server, template.server))
    if hasattr(template, "key"):
        return dataclasses.replace(state, key=template.key)
    return state


def _save_checkpoint(out_dir: Path, state, rows: list[dict], wall_s: float, clock: _TrainClock):
    from simbase.io import atomic_write_bytes

    leaves = jax.tree.leaves(_keyless(state))
    blob = serialization.msgpack_serialize(
        {
            "leaves": {str(i): np.asarray(x) for i, x in enumerate(leaves)},
            "rows": json.dumps(rows),
            "wall_time_s": wall_s,
            "client_updates": clock.updates,
            "train_time_s": clock.train_s,
            "timed_updates": clock.timed_updates,
        }
    )
    atomic_write_bytes(out_dir / CHECKPOINT, blob)


def _load_checkpoint(out_dir: Path, template):
    path = out_dir / CHECKPOINT
    if not path.exists():
        return template, [], 0.0, _TrainClock()
    blob = serialization.msgpack_restore(path.read_bytes())
    skeleton = _keyless(template)
    leaves, treedef = jax.tree.flatten(skeleton)
    stored = blob["leaves"]
    if len(stored) != len(leaves):
        raise AisimError(
            f"{path}: checkpoint holds {len(stored)} state arrays where this run has "
            f"{len(leaves)}: it was written for another config.json or by an older aisim; "
            "resume it with that version, or start in a new --out folder",
            usage=False,
        )
    restored = [jnp.asarray(stored[str(i)], leaves[i].dtype) for i in range(len(leaves))]
    state = _with_key(jax.tree.unflatten(treedef, restored), template)
    clock = _TrainClock(
        updates=int(blob["client_updates"]),
        train_s=float(blob.get("train_time_s", 0.0)),
        timed_updates=int(blob.get("timed_updates", 0)),
    )
    return state, json.loads(blob["rows"]), float(blob["wall_time_s"]), clock


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


@dataclasses.dataclass
class _TrainClock:
    """Client updates, and the seconds spent training them: each round's update and the fetch
    of its metrics, without evaluation, checkpoints, or a process's first round (it compiles)."""

    updates: int = 0
    train_s: float = 0.0
    timed_updates: int = 0


def summarise(
    b: Built, metrics: pd.DataFrame, wall_s: float, clock: _TrainClock, diverged_round
) -> dict:
    """The run's summary (the keys ``--json`` prints). ``client_updates_per_s`` counts training
    time only (see :class:`_TrainClock`); ``wall_time_s`` is everything."""
    cfg = b.cfg

    def last(col):
        vals = metrics[col].dropna()
        return float(vals.iloc[-1]) if len(vals) else None

    acc = metrics["test_accuracy"].dropna()
    summary = {
        "final_test_accuracy": last("test_accuracy"),
        "best_test_accuracy": float(acc.max()) if len(acc) else None,
        "final_train_loss": float(metrics["train_loss"].iloc[-1]) if len(metrics) else None,
        "final_test_loss": last("test_loss"),
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
        "num_params": b.model.num_params,
        "algorithm": cfg.algorithm,
        "clients": b.data.population.num_clients,
        "chunk_size": b.spec.chunk,
        "jax_devices": len(jax.devices()),
        "jax_processes": jax.process_count(),
        "time_to_accuracy": {f"{t:g}": time_to_accuracy(metrics, t) for t in ACCURACY_THRESHOLDS},
    }
    if cfg.algorithm == "fedbuff":
        st = metrics["staleness_mean"]
        summary["fedbuff"] = {
            "buffer_size": cfg.buffer_size,
            "concurrency": cfg.concurrency,
            "server_updates": int(len(metrics)),
            "staleness_mean": float(st.mean()) if len(st) else None,
            "staleness_max": int(metrics["staleness_max"].max()) if len(st) else None,
            "staleness_weight": "1/sqrt(1+staleness)",
        }
    if cfg.trace is not None:
        summary["trace"] = cfg.trace
    if cfg.client_eval:
        from fl.personalization import STAT_COLUMNS

        done = metrics.dropna(subset=[STAT_COLUMNS[0]])
        final = done.iloc[-1] if len(done) else None
        sizes = np.asarray(b.local_test.sizes)
        summary["client_eval"] = {
            "personalize": cfg.personalize,
            "local_test_fraction": cfg.local_test_fraction,
            "clients_with_test": int((sizes > 0).sum()),
            **({"finetune_steps": cfg.finetune_steps} if cfg.personalize == "finetune" else {}),
            **({"ditto_lambda": cfg.ditto_lambda} if cfg.personalize == "ditto" else {}),
            **({"personal_models": "all clients"} if cfg.personalize == "ditto" else {}),
            **{c: (float(final[c]) if final is not None else None) for c in client_columns(cfg)},
        }
    if cfg.target_accuracy is not None:
        hit = time_to_accuracy(metrics, cfg.target_accuracy)
        summary["target_accuracy"] = cfg.target_accuracy
        summary["rounds_to_target"] = hit and hit["round"]
        summary["time_to_target_s"] = hit and hit["sim_time_s"]
    if b.spec.algorithm.dp:
        rep = privacy_report(b, max(len(metrics), 1))
        summary["privacy"] = {
            "epsilon": rep.epsilon,
            "delta": rep.delta,
            "rdp_order": rep.order,
            "noise_multiplier": cfg.noise_multiplier,
            "clip_norm": cfg.clip_norm,
            "final_clip_norm": last("clip_norm"),
            "adaptive_clip": cfg.adaptive_clip,
            "sampling_rate": rep.sampling_rate,
            "accountant": rep.accountant,
            "sampling_bound": rep.sampling_bound,
        }
    summary["config"] = cfg.to_dict()
    return summary


class _ClientEval:
    """The jitted per-client evaluation (and Ditto's step) of a run (:mod:`fl.personalization`)."""

    def __init__(self, b: Built):
        from fl import personalization as p

        self.b, self.p = b, p
        cfg = b.cfg
        self.key = jax.random.key(cfg.seed + 17)
        self.run = jax.jit(
            p.make_client_eval(b.spec, cfg.personalize, cfg.finetune_steps, b.spec.chunk)
        )
        self.glob = None
        if cfg.personalize != "none":
            self.glob = jax.jit(p.make_client_eval(b.spec, "none", 0, b.spec.chunk))
        self.ditto = jax.jit(p.make_ditto_step(b.spec)) if cfg.personalize == "ditto" else None

    def init_personal(self):
        from simbase.units import parse_bytes

        if self.ditto is None:
            return None
        b = self.b
        return self.p.init_personal(
            b.init_state.params,
            b.data.population.num_clients,
            parse_bytes(b.cfg.memory_budget),
            b.model.param_bytes,
        )

    def evaluate(self, params, personal, r: int) -> dict:
        b = self.b
        key = jax.random.fold_in(self.key, r)
        acc = np.asarray(self.run(params, personal, b.inputs, b.local_test, key))
        out = self.p.client_stats(acc)
        if self.glob is not None:
            g = np.asarray(self.glob(params, None, b.inputs, b.local_test, key))
            out["client_acc_global_mean"] = self.p.client_stats(g)["client_acc_mean"]
        return out


def simulate(
    cfg: ExperimentConfig,
    out_dir: str | Path | None = None,
    resume: bool = False,
    on_round: Callable[[dict], None] | None = None,
    stop_after: int | None = None,
) -> SimulationResult:
    """Runs ``cfg`` (see module). ``stop_after`` ends the run early (tests of ``resume``)."""
    from simbase.io import atomic_write_text, to_json, write_table

    out = Path(out_dir) if out_dir is not None else None
    b = build(cfg)
    per = _ClientEval(b) if cfg.client_eval else None
    personal = per.init_personal() if per is not None else None
    state, rows, wall_s, clock = b.init_state, [], 0.0, _TrainClock()
    if out is not None:
        if resume:
            template = state if personal is None else (state, personal)
            loaded, rows, wall_s, clock = _load_checkpoint(out, template)
            state, personal = loaded if personal is not None else (loaded, None)
        else:
            atomic_write_text(out / "config.json", to_json(cfg.to_dict()))
    sim_t = rows[-1]["sim_time_s"] if rows else 0.0
    diverged_round = None
    last = cfg.rounds if stop_after is None else min(cfg.rounds, stop_after)
    dp = b.spec.algorithm.dp
    eps = privacy_report(b, cfg.rounds).epsilons if dp else ()
    columns = list(COLUMNS) + (list(ASYNC_COLUMNS) if cfg.algorithm == "fedbuff" else [])
    columns += list(client_columns(cfg))
    t0 = time.perf_counter()
    first = len(rows) + 1
    for r in range(first, last + 1):
        before = state
        t_round = time.perf_counter()
        state, met = b.run_round(state, b.inputs, b.hyper)
        m = jax.device_get(met)
        if r > first:  # this process's first round compiles the round
            clock.train_s += time.perf_counter() - t_round
            clock.timed_updates += int(m.clients_kept)
        if personal is not None:
            personal = per.ditto(personal, before, b.inputs, b.hyper, jnp.float32(cfg.ditto_lambda))
        sim_t += float(m.round_time_s)
        clock.updates += int(m.clients_kept)
        row = {
            "round": r,
            "sim_time_s": sim_t,
            "train_loss": math.nan,
            "test_accuracy": math.nan,
            "test_loss": math.nan,
            "clients_sampled": int(m.clients_sampled),
            "clients_kept": int(m.clients_kept),
            "bytes_up": float(m.bytes_up),
            "bytes_down": float(m.bytes_down),
            "epsilon": eps[r - 1] if dp else math.nan,
            "clip_norm": float(m.clip_norm) if dp else math.nan,
        }
        if cfg.algorithm == "fedbuff":
            row.update(staleness_mean=float(m.staleness_mean), staleness_max=int(m.staleness_max))
        if r % cfg.eval_every == 0 or r == cfg.rounds or not m.finite:
            tr_loss, _ = b.evaluate(state.params, *b.eval_sets[0])
            te_loss, te_acc = b.evaluate(state.params, *b.eval_sets[1])
            row.update(
                train_loss=float(tr_loss), test_loss=float(te_loss), test_accuracy=float(te_acc)
            )
            if per is not None:
                row.update(per.evaluate(state.params, personal, r))
        rows.append(row)
        if on_round is not None:
            on_round(row)
        if not bool(m.finite) or not math.isfinite(row["train_loss"]) and r % cfg.eval_every == 0:
            diverged_round = r
            break
        if out is not None and r % cfg.checkpoint_every == 0:
            saved = state if personal is None else (state, personal)
            _save_checkpoint(out, saved, rows, wall_s + time.perf_counter() - t0, clock)
    wall_s += time.perf_counter() - t0
    metrics = pd.DataFrame(rows, columns=columns)
    summary = summarise(b, metrics, wall_s, clock, diverged_round)
    if out is not None:
        write_table(metrics, out / "metrics.csv")
        atomic_write_text(out / "summary.json", to_json(summary))
    return SimulationResult(metrics=metrics, summary=summary)


def load_config_json(out_dir: str | Path) -> ExperimentConfig:
    """The config a run in ``out_dir`` was started with (to resume it).

    Raises:
      AisimError: ``field`` ``out_dir`` when it holds no ``config.json``; the file's path when
        that is not a config.
    """
    path = Path(out_dir) / "config.json"
    if not path.exists():
        raise bad_value(
            None, "out_dir", str(out_dir), "the folder of a started run (it has no config.json)"
        )
    raw = read_json(path, "run configuration")
    try:
        return ExperimentConfig(**raw)
    except TypeError as e:
        raise AisimError(f"{path}: {e}") from None
