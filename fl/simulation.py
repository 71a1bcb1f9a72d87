"""The imperative shell of an FL run: build (:mod:`fl.build`), loop over rounds, evaluate,
checkpoint, summarise (:mod:`fl.summary`).

Contract: :func:`simulate` turns a validated :class:`~fl.config.ExperimentConfig` (and, from
Python, a model, data set or algorithm of the user's own) into a :class:`SimulationResult`
(one metrics row per round, and a summary). With ``out_dir`` it holds the folder's lock for the
whole run (:mod:`fl.run_folder`: a second run on the same folder is refused), writes
``config.json`` at the start, an atomic ``checkpoint.msgpack`` every ``checkpoint_every`` rounds
(with the configuration it belongs to), and ``metrics.csv`` / ``summary.json`` at the end;
``resume=True`` continues from the checkpoint, which must have been written for the same
configuration, and, since every round's randomness is keyed by the round number, reaches the
same final metrics as an uninterrupted run. Rounds are dispatched without waiting for their
metrics: the host reads them only at an evaluation, a checkpoint or the end, so the device is
never idle between rounds. A NaN or infinite model stops the run, keeping the rows up to the
round that diverged. With ``algorithm = "fedbuff"`` a row is one server update
(:mod:`fl.asynchronous`); with ``client_eval`` every evaluated row gains the per-client accuracy
statistics (:mod:`fl.personalization`), and Ditto's personal models are checkpointed with the
server state.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from fl import checkpoint
from fl import personalization as p
from fl.build import Built, build
from fl.checkpoint import TrainClock
from fl.config import ExperimentConfig
from fl.run_folder import CONFIG, check_same_config, locked, start_fresh
from fl.summary import columns, privacy_report, summarise
from simbase.errors import AisimError, bad_value
from simbase.io import atomic_write_text, read_json, to_json, write_table
from simbase.units import parse_bytes

# Rounds whose metrics may wait on the device before the host reads them (each pending round
# keeps its model alive, to evaluate it should it be the one that diverged).
MAX_PENDING_ROUNDS = 32
MAX_PENDING_BYTES = 256e6


@dataclasses.dataclass
class SimulationResult:
    """Metrics (one row per completed round, :data:`fl.summary.COLUMNS`) and the run's summary."""

    metrics: pd.DataFrame
    summary: dict


class _ClientEval:
    """The jitted per-client evaluation (and Ditto's step) of a run (:mod:`fl.personalization`)."""

    def __init__(self, b: Built):
        self.b = b
        cfg, task = b.cfg, b.model.task
        self.key = jax.random.key(cfg.seed + 17)
        chunk = b.spec.chunk
        self.run = jax.jit(
            p.make_client_eval(b.spec, cfg.personalize, cfg.finetune_steps, chunk, task)
        )
        self.glob = None
        if cfg.personalize != "none":
            self.glob = jax.jit(p.make_client_eval(b.spec, "none", 0, chunk, task))
        self.ditto = jax.jit(p.make_ditto_step(b.spec)) if cfg.personalize == "ditto" else None

    def init_personal(self):
        if self.ditto is None:
            return None
        b = self.b
        return p.init_personal(
            b.init_state.params,
            b.data.population.num_clients,
            parse_bytes(b.cfg.memory_budget),
            b.model.param_bytes,
        )

    def evaluate(self, params, personal, r: int) -> dict:
        b = self.b
        key = jax.random.fold_in(self.key, r)
        acc = np.asarray(self.run(params, personal, b.inputs, b.local_test, key))
        out = p.client_stats(acc)
        if self.glob is not None:
            g = np.asarray(self.glob(params, None, b.inputs, b.local_test, key))
            out["client_acc_global_mean"] = p.client_stats(g)["client_acc_mean"]
        return out


@dataclasses.dataclass
class _Loop:
    """The state of the round loop: rows so far, rounds waiting for the host, the clock."""

    b: Built
    per: _ClientEval | None
    eps: tuple
    rows: list
    clock: TrainClock
    sim_t: float
    pending: list = dataclasses.field(default_factory=list)  # (round, state, metrics)
    diverged_round: int | None = None
    paused_s: float = 0.0  # host time in evaluation and checkpoints (not training)

    def row(self, r: int, m) -> dict:
        cfg, dp = self.b.cfg, self.b.spec.algorithm.dp
        self.sim_t += float(m.round_time_s)
        row = {
            "round": r,
            "sim_time_s": self.sim_t,
            "train_loss": math.nan,
            "test_accuracy": math.nan,
            "test_loss": math.nan,
            "clients_sampled": int(m.clients_sampled),
            "clients_kept": int(m.clients_kept),
            "bytes_up": float(m.bytes_up),
            "bytes_down": float(m.bytes_down),
            "epsilon": self.eps[r - 1] if dp else math.nan,
            "clip_norm": float(m.clip_norm) if dp else math.nan,
        }
        if cfg.algorithm == "fedbuff":
            row.update(staleness_mean=float(m.staleness_mean), staleness_max=int(m.staleness_max))
        return row

    def evaluate(self, row: dict, params, personal) -> None:
        b = self.b
        tr_loss, _ = b.evaluate(params, *b.eval_sets[0])
        te_loss, te_acc = b.evaluate(params, *b.eval_sets[1])
        row.update(train_loss=float(tr_loss), test_loss=float(te_loss), test_accuracy=float(te_acc))
        if self.per is not None:
            row.update(self.per.evaluate(params, personal, row["round"]))

    def flush(self, on_round, timed_from: int, hold_last: bool) -> bool:
        """Reads the pending rounds' metrics (one transfer) into rows; returns ``False`` when one
        diverged. ``hold_last``: the last row is reported after its evaluation."""
        fetched = jax.device_get([m for _, _, m in self.pending])
        for i, ((r, st, _), m) in enumerate(zip(self.pending, fetched, strict=True)):
            self.clock.updates += int(m.clients_kept)
            if r >= timed_from:
                self.clock.timed_updates += int(m.clients_kept)
            row = self.row(r, m)
            self.rows.append(row)
            if not bool(m.finite):
                params, personal = st if isinstance(st, tuple) else (st, None)
                self.evaluate(row, params.params, personal)
                self.diverged_round = r
            held = hold_last and i == len(self.pending) - 1 and self.diverged_round is None
            if on_round is not None and not held:
                on_round(row)
            if self.diverged_round is not None:
                break
        self.pending = []
        return self.diverged_round is None


def _run(b: Built, out: Path | None, resume: bool, on_round, stop_after) -> SimulationResult:
    cfg = b.cfg
    per = _ClientEval(b) if cfg.client_eval else None
    personal = per.init_personal() if per is not None else None
    state, rows, wall_s, clock = b.init_state, [], 0.0, TrainClock()
    if out is not None and resume:
        template = state if personal is None else (state, personal)
        loaded, rows, wall_s, clock = checkpoint.load(out, template, cfg.to_dict())
        state, personal = loaded if personal is not None else (loaded, None)
    elif out is not None:
        start_fresh(out, cfg.to_dict())
    eps = privacy_report(b, cfg.rounds).epsilons if b.spec.algorithm.dp else ()
    loop = _Loop(b, per, eps, rows, clock, rows[-1]["sim_time_s"] if rows else 0.0)
    last = cfg.rounds if stop_after is None else min(cfg.rounds, stop_after)
    first = len(rows) + 1
    window = max(1, min(MAX_PENDING_ROUNDS, int(MAX_PENDING_BYTES // b.model.param_bytes)))
    t0 = time.perf_counter()
    t_train = None  # the first round compiles: the training clock starts when it is done
    for r in range(first, last + 1):
        before = state
        state, met = b.run_round(state, b.inputs, b.hyper)
        if personal is not None:
            personal = per.ditto(personal, before, b.inputs, b.hyper, jnp.float32(cfg.ditto_lambda))
        saved = state if personal is None else (state, personal)
        loop.pending.append((r, saved, met))
        if r == first:
            jax.block_until_ready(state)
            t_train = time.perf_counter()
        evaluate = r % cfg.eval_every == 0 or r == cfg.rounds
        save = out is not None and r % cfg.checkpoint_every == 0
        if not (evaluate or save or r == last or len(loop.pending) >= window):
            continue
        if not loop.flush(on_round, first + 1, hold_last=evaluate):
            break
        t_pause = time.perf_counter()
        if evaluate:
            loop.evaluate(loop.rows[-1], state.params, personal)
            if on_round is not None:
                on_round(loop.rows[-1])
            if not math.isfinite(loop.rows[-1]["train_loss"]):
                loop.diverged_round = r
                break
        if save:
            checkpoint.save(out, saved, loop.rows, wall_s + t_pause - t0, clock, cfg.to_dict())
        loop.paused_s += time.perf_counter() - t_pause
    t_end = time.perf_counter()
    if t_train is not None:
        clock.train_s += max(t_end - t_train - loop.paused_s, 0.0)
    wall_s += t_end - t0
    metrics = pd.DataFrame(loop.rows, columns=columns(cfg))
    summary = summarise(b, metrics, wall_s, clock, loop.diverged_round)
    if out is not None:
        write_table(metrics, out / "metrics.csv")
        atomic_write_text(out / "summary.json", to_json(summary))
    return SimulationResult(metrics=metrics, summary=summary)


def simulate(
    cfg: ExperimentConfig,
    out_dir: str | Path | None = None,
    resume: bool = False,
    on_round: Callable[[dict], None] | None = None,
    stop_after: int | None = None,
    *,
    model=None,
    data=None,
    algorithm=None,
) -> SimulationResult:
    """Runs ``cfg`` (see module).

    Args:
      cfg: the experiment.
      out_dir: the output folder (locked for the run), or ``None`` to write nothing.
      resume: continue the run in ``out_dir`` from its checkpoint.
      on_round: called with each metrics row as the host reads it.
      stop_after: end after this round (tests of ``resume``).
      model: an :class:`fl.Model` of the user's own instead of ``cfg.model``.
      data: an :class:`fl.FederatedData` of the user's own instead of ``cfg.dataset``.
      algorithm: an :class:`fl.Algorithm` of the user's own instead of ``cfg.algorithm``.
    """
    b = build(cfg, model=model, data=data, algorithm=algorithm)
    if out_dir is None:
        return _run(b, None, False, on_round, stop_after)
    out = Path(out_dir)
    with locked(out):
        return _run(b, out, resume, on_round, stop_after)


def load_config_json(out_dir: str | Path, asked: dict | None = None) -> ExperimentConfig:
    """The config a run in ``out_dir`` was started with (to resume it); ``asked`` holds settings
    given for the resumed run, which must equal the stored ones.

    Raises:
      AisimError: ``field`` ``out_dir`` when it holds no ``config.json``; the file's path when
        that is not a config, or when it differs from ``asked``.
    """
    path = Path(out_dir) / CONFIG
    if not path.exists():
        raise bad_value(
            None, "out_dir", str(out_dir), "the folder of a started run (it has no config.json)"
        )
    raw = read_json(path, "run configuration")
    try:
        cfg = ExperimentConfig(**raw)
    except TypeError as e:
        raise AisimError(f"{path}: {e}") from None
    if asked:
        stored = cfg.to_dict()
        check_same_config(str(path), {k: stored[k] for k in asked}, asked)
    return cfg
