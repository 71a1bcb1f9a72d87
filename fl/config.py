"""The configuration of one federated experiment: defaults, validation and TOML loading.

Contract: :class:`ExperimentConfig` holds plain Python values; its field names are the names of
the experiment file's keys (the command line spells them with dashes). :func:`validate` checks
ranges and names and raises one :class:`~simbase.errors.AisimError` with ``source=None`` (the
values are arguments), ``field`` the config field, the value and what is expected;
:func:`load_toml` reads an ``EXPERIMENT.toml`` with the same keys (unknown keys are an error
naming the file).
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

from simbase.errors import AisimError, bad_value, suggest
from simbase.io import read_text
from simbase.units import parse_bytes


def unknown_name(field: str, value: object, choices, what: str) -> AisimError:
    """The error for a name not among ``choices``: ``field`` = value, expected a known ``what``
    with the closest names as the hint, or one of ``choices`` when none is close."""
    close = suggest(str(value), choices)
    if close.startswith("; known: "):
        return bad_value(None, field, value, "one of " + close[len("; known: ") :])
    return bad_value(None, field, value, f"a known {what}", hint=close[2:])


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """One federated experiment: plain values, the keys of an experiment file (see :func:`validate`
    for the ranges; the command line documents each field in its help)."""

    dataset: str = "synthetic"
    alpha: float = 1.0
    beta: float = 1.0
    iid: bool = False
    partition: str = "iid"
    dirichlet_alpha: float = 0.5
    model: str | None = None
    clients: int = 30
    clients_per_round: int = 10
    rounds: int = 200
    local_epochs: int = 1
    batch_size: int = 10
    lr: float = 0.01
    algorithm: str = "fedavg"
    mu: float = 0.0
    server_lr: float | None = None
    server_momentum: float = 0.9
    sampling: str = "uniform"
    stragglers: float = 0.0
    deadline_s: float | None = None
    devices: str = "phone"
    max_local_steps: int | None = None
    memory_budget: str = "4GB"
    clip_norm: float = 1.0
    noise_multiplier: float = 1.0
    delta: float = 1e-5
    seed: int = 0
    eval_every: int = 1
    checkpoint_every: int = 10
    target_accuracy: float | None = None
    shard: bool = True

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


FIELDS = {f.name: f for f in dataclasses.fields(ExperimentConfig)}


def validate(cfg: ExperimentConfig, where: str | None = None) -> None:
    """Raises an :class:`AisimError` for the first out-of-range or unknown setting.

    Args:
      cfg: the experiment.
      where: the errors' ``source`` (``None``: the values are arguments of the call).
    """
    from fl.data import DATASETS
    from fl.models import MODELS
    from fl.partition import PARTITIONS
    from fl.server import ALGORITHMS
    from fl.systems import parse_mix

    def choice(field, value, choices, what):
        if value not in choices:
            e = unknown_name(field, value, choices, what)
            raise e.relabel(source=where) if where is not None else e

    choice("dataset", cfg.dataset, DATASETS, "data set")
    choice("algorithm", cfg.algorithm, ALGORITHMS, "algorithm")
    choice("partition", cfg.partition, PARTITIONS, "partition")
    choice("sampling", cfg.sampling, ("uniform", "size"), "sampling")
    if cfg.model is not None:
        choice("model", cfg.model, MODELS, "model")
    positive_ints = (
        "clients",
        "clients_per_round",
        "rounds",
        "local_epochs",
        "batch_size",
        "eval_every",
        "checkpoint_every",
    )
    for f in positive_ints:
        v = getattr(cfg, f)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise bad_value(where, f, v, "an integer >= 1")
    if cfg.max_local_steps is not None and cfg.max_local_steps < 1:
        raise bad_value(where, "max_local_steps", cfg.max_local_steps, "an integer >= 1")
    if cfg.clients_per_round > cfg.clients:
        raise bad_value(
            where,
            "clients_per_round",
            cfg.clients_per_round,
            f"at most the population size, {cfg.clients}",
            hint="lower it or raise {clients}",
        )
    if not cfg.lr > 0:
        raise bad_value(where, "lr", cfg.lr, "a learning rate > 0")
    if cfg.server_lr is not None and not cfg.server_lr > 0:
        raise bad_value(where, "server_lr", cfg.server_lr, "a learning rate > 0")
    for f in ("mu", "alpha", "beta", "clip_norm", "noise_multiplier"):
        if not getattr(cfg, f) >= 0:
            raise bad_value(where, f, getattr(cfg, f), "a number >= 0")
    if not cfg.dirichlet_alpha > 0:
        raise bad_value(where, "dirichlet_alpha", cfg.dirichlet_alpha, "a number > 0")
    if not 0 <= cfg.stragglers <= 1:
        raise bad_value(where, "stragglers", cfg.stragglers, "a fraction in [0, 1]")
    if not 0 < cfg.delta < 1:
        raise bad_value(where, "delta", cfg.delta, "a probability in (0, 1)")
    if cfg.deadline_s is not None and not cfg.deadline_s > 0:
        raise bad_value(where, "deadline_s", cfg.deadline_s, "seconds > 0")
    if cfg.target_accuracy is not None and not 0 < cfg.target_accuracy <= 1:
        raise bad_value(where, "target_accuracy", cfg.target_accuracy, "a fraction in (0, 1]")
    try:
        budget = parse_bytes(cfg.memory_budget)
    except ValueError as e:
        raise bad_value(where, "memory_budget", cfg.memory_budget, "a size such as 4GB") from e
    if budget <= 0:
        raise bad_value(where, "memory_budget", cfg.memory_budget, "a size > 0")
    try:
        parse_mix(cfg.devices)
    except AisimError as e:
        raise e.relabel(source=where) from None


def _coerce(path: str, key: str, value, field: dataclasses.Field):
    kind = str(field.type)
    if value is None:
        return None
    if "bool" in kind:
        if not isinstance(value, bool):
            raise bad_value(path, key, value, "true or false")
        return value
    if "int" in kind and "float" not in kind:
        if not isinstance(value, int) or isinstance(value, bool):
            raise bad_value(path, key, value, "an integer")
        return value
    if "float" in kind:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise bad_value(path, key, value, "a number")
        return float(value)
    if not isinstance(value, str):
        raise bad_value(path, key, value, "a string")
    return value


def load_toml(path: str | Path) -> dict:
    """Reads an experiment file; returns ``{field: value}`` for the keys it sets."""
    path = Path(path)
    text = read_text(path, "experiment file")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise AisimError(f"{path}: not valid TOML ({e})") from None
    if isinstance(raw.get("fl"), dict) and len(raw) == 1:
        raw = raw["fl"]
    out = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in FIELDS:
            raise AisimError(
                f"{path}: unknown key {key!r}" + suggest(key, [f.replace("_", "-") for f in FIELDS])
            )
        out[name] = _coerce(str(path), key, value, FIELDS[name])
    return out
