"""Checkpoints of a run: the server state, the rows so far, the clock, and the configuration.

Contract: :func:`save` writes ``DIR/checkpoint.msgpack`` atomically with the state's leaves
(without PRNG keys, which the run's seed rebuilds), the metrics rows, the training clock and the
configuration the run was started with; :func:`load` restores them into a template of the same
structure, and refuses a checkpoint written for another configuration
(:func:`fl.run_folder.check_same_config`) or by a run whose state has another shape.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from fl.run_folder import CHECKPOINT, check_same_config
from simbase.errors import AisimError
from simbase.io import atomic_write_bytes, jsonable


@dataclasses.dataclass
class TrainClock:
    """Client updates, and the seconds spent training them: the rounds after a process's first
    (it compiles), without evaluation or checkpoints."""

    updates: int = 0
    train_s: float = 0.0
    timed_updates: int = 0


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


def save(out_dir: Path, state, rows: list[dict], wall_s: float, clock: TrainClock, config: dict):
    """Writes ``out_dir/checkpoint.msgpack`` atomically (see module)."""
    leaves = jax.tree.leaves(_keyless(state))
    blob = serialization.msgpack_serialize(
        {
            "leaves": {str(i): np.asarray(x) for i, x in enumerate(leaves)},
            "rows": json.dumps(rows),
            "wall_time_s": wall_s,
            "client_updates": clock.updates,
            "train_time_s": clock.train_s,
            "timed_updates": clock.timed_updates,
            "config": json.dumps(jsonable(config)),
        }
    )
    atomic_write_bytes(out_dir / CHECKPOINT, blob)


def load(out_dir: Path, template, config: dict):
    """``(state, rows, wall_s, clock)`` from ``out_dir``'s checkpoint, or the template and an
    empty history when there is none; ``config`` is the configuration asked for."""
    path = out_dir / CHECKPOINT
    if not path.exists():
        return template, [], 0.0, TrainClock()
    blob = serialization.msgpack_restore(path.read_bytes())
    stored_config = json.loads(blob.get("config", "{}"))
    check_same_config(str(path), stored_config, jsonable(config))
    leaves, treedef = jax.tree.flatten(_keyless(template))
    stored = blob["leaves"]
    if len(stored) != len(leaves):
        raise AisimError(
            f"{path}: checkpoint holds {len(stored)} state arrays where this run has "
            f"{len(leaves)}: it was written by another version of aisim; resume it with that "
            "version, or start in a new --out folder",
            usage=False,
        )
    restored = [jnp.asarray(stored[str(i)], leaves[i].dtype) for i in range(len(leaves))]
    state = _with_key(jax.tree.unflatten(treedef, restored), template)
    clock = TrainClock(
        updates=int(blob["client_updates"]),
        train_s=float(blob.get("train_time_s", 0.0)),
        timed_updates=int(blob.get("timed_updates", 0)),
    )
    return state, json.loads(blob["rows"]), float(blob["wall_time_s"]), clock
