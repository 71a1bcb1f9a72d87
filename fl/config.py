"""The configuration of one federated experiment: defaults, validation and TOML loading.

Contract: :class:`ExperimentConfig` holds plain Python values; its field names are the names of
the experiment file's keys (the command line spells them with dashes). :func:`validate` checks
ranges and names and raises one :class:`~simbase.errors.AisimError` with ``source=None`` (the
values are arguments), ``field`` the config field, the value and what is expected;
:func:`load_toml` reads an ``EXPERIMENT.toml`` with the same keys, plus the process-group keys
``coordinator``, ``num_processes`` and ``process_id`` (:data:`PROCESS_FIELDS`: how the run is
spread over processes, not what it simulates; the caller takes them out before building the
config). Unknown keys are an error naming the file.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from pathlib import Path

from fl.choices import unknown_name
from fl.data import DATASETS
from fl.datasets import FIELD_DATASETS, FORMATS
from fl.models import MODELS
from fl.partition import DIRICHLET_FORMS, PARTITIONS
from fl.server import ADAPTIVE, ADAPTIVE_FORMS, ALGORITHMS
from fl.systems import parse_mix
from simbase.errors import AisimError, bad_value, suggest
from simbase.io import read_text
from simbase.parse import check_seed
from simbase.units import parse_bytes


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """One federated experiment: plain values, the keys of an experiment file (see :func:`validate`
    for the ranges; the command line documents each field in its help)."""

    dataset: str = "synthetic"
    data: str | None = None
    data_format: str = "auto"
    data_dir: str | None = None
    download: bool = False
    alpha: float = 1.0
    beta: float = 1.0
    iid: bool = False
    partition: str = "iid"
    dirichlet_alpha: float = 0.5
    dirichlet_form: str = "per-class"
    model: str | None = None
    model_module: str | None = None
    clients: int = 30
    clients_per_round: int = 10
    rounds: int = 200
    local_epochs: int = 1
    batch_size: int = 10
    lr: float = 0.01
    algorithm: str = "fedavg"
    algorithm_module: str | None = None
    mu: float = 0.0
    server_lr: float | None = None
    server_momentum: float = 0.9
    tau: float = 1e-3
    adaptive_form: str = "reddi"
    sampling: str = "uniform"
    stragglers: float = 0.0
    deadline_s: float | None = None
    devices: str = "phone"
    max_local_steps: int | None = None
    memory_budget: str = "4GB"
    clip_norm: float = 1.0
    noise_multiplier: float = 1.0
    delta: float = 1e-5
    adaptive_clip: bool = False
    clip_quantile: float = 0.5
    clip_lr: float = 0.2
    clip_count_stddev: float | None = None
    seed: int = 0
    eval_every: int = 1
    checkpoint_every: int = 10
    target_accuracy: float | None = None
    shard: bool = True
    buffer_size: int = 10
    concurrency: int = 20
    trace: str | None = None
    client_eval: bool = False
    local_test_fraction: float = 0.2
    personalize: str = "none"
    finetune_steps: int = 5
    ditto_lambda: float = 0.1

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


FIELDS = {f.name: f for f in dataclasses.fields(ExperimentConfig)}


@dataclasses.dataclass(frozen=True)
class ProcessKeys:
    """Experiment-file keys that place the run on processes (:func:`fl.distributed.process_group`
    checks them); they say how the run is spread, not what it simulates."""

    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None


PROCESS_FIELDS = {f.name: f for f in dataclasses.fields(ProcessKeys)}


def _check_choices(cfg: ExperimentConfig, where: str | None) -> None:
    """The named choices: data set, format, algorithm, partition, sampling and model."""

    def choice(field, value, choices, what):
        if value not in choices:
            e = unknown_name(field, value, choices, what)
            raise e.relabel(source=where) if where is not None else e

    choice("dataset", cfg.dataset, DATASETS + FIELD_DATASETS, "data set")
    choice("data_format", cfg.data_format, FORMATS, "format")
    choice("algorithm", cfg.algorithm, ALGORITHMS, "algorithm")
    choice("partition", cfg.partition, PARTITIONS, "partition")
    choice("sampling", cfg.sampling, ("uniform", "size"), "sampling")
    if cfg.model is not None:
        choice("model", cfg.model, MODELS, "model")


def _check_counts(cfg: ExperimentConfig, where: str | None) -> None:
    """The counts: positive integers, a cohort no larger than the population, a 32-bit seed."""
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
    try:
        check_seed(cfg.seed)
    except AisimError as e:
        raise e.relabel(source=where) if where is not None else e from None
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


def _check_ranges(cfg: ExperimentConfig, where: str | None) -> None:
    """The real-valued settings' ranges, the memory budget and the device mix."""
    if not 0 < cfg.lr < math.inf:
        raise bad_value(where, "lr", cfg.lr, "a finite learning rate > 0")
    if cfg.server_lr is not None and not 0 < cfg.server_lr < math.inf:
        raise bad_value(where, "server_lr", cfg.server_lr, "a finite learning rate > 0")
    for f in ("mu", "alpha", "beta", "clip_norm", "noise_multiplier"):
        if not 0 <= getattr(cfg, f) < math.inf:
            raise bad_value(where, f, getattr(cfg, f), "a finite number >= 0")
    if not 0 < cfg.dirichlet_alpha < math.inf:
        raise bad_value(where, "dirichlet_alpha", cfg.dirichlet_alpha, "a finite number > 0")
    if not 0 <= cfg.stragglers <= 1:
        raise bad_value(where, "stragglers", cfg.stragglers, "a fraction in [0, 1]")
    if not 0 < cfg.delta < 1:
        raise bad_value(where, "delta", cfg.delta, "a probability in (0, 1)")
    if cfg.deadline_s is not None and not 0 < cfg.deadline_s < math.inf:
        raise bad_value(where, "deadline_s", cfg.deadline_s, "a finite number of seconds > 0")
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
    if not 0 <= cfg.server_momentum < 1:
        raise bad_value(where, "server_momentum", cfg.server_momentum, "a momentum in [0, 1)")
    if not 0 < cfg.tau < math.inf:
        raise bad_value(where, "tau", cfg.tau, "a finite number > 0")
    if not 0 < cfg.clip_quantile < 1:
        raise bad_value(where, "clip_quantile", cfg.clip_quantile, "a fraction in (0, 1)")
    if not 0 < cfg.clip_lr < math.inf:
        raise bad_value(where, "clip_lr", cfg.clip_lr, "a finite learning rate > 0")
    if cfg.clip_count_stddev is not None and not 0 < cfg.clip_count_stddev < math.inf:
        raise bad_value(where, "clip_count_stddev", cfg.clip_count_stddev, "a finite number > 0")


def validate(
    cfg: ExperimentConfig, where: str | None = None, custom_algorithm: bool = False
) -> None:
    """Raises an :class:`AisimError` for the first out-of-range or unknown setting.

    Args:
      cfg: the experiment.
      where: the errors' ``source`` (``None``: the values are arguments of the call).
      custom_algorithm: the run's algorithm is the user's own (passed from Python), so
        ``cfg.algorithm`` is not the one that runs.
    """
    _check_choices(cfg, where)
    _check_counts(cfg, where)
    _check_ranges(cfg, where)
    if custom_algorithm and cfg.algorithm_module is None:
        cfg = dataclasses.replace(cfg, algorithm_module="(python)")
    _check_effective(cfg, where)


DEFAULTS = ExperimentConfig()


def count_stddev(cfg: ExperimentConfig) -> float:
    """Adaptive clipping's noise on the unclipped count: ``σ_b`` as given, or ``m / 20``
    (Andrew et al. 2021, §4: "we use σ_b = m/20 in all experiments")."""
    if cfg.clip_count_stddev is not None:
        return cfg.clip_count_stddev
    return cfg.clients_per_round / 20.0


def _check_effective(cfg: ExperimentConfig, where: str | None) -> None:
    """A setting that the chosen configuration would ignore is an error, not a silent no-op:
    a field moved off its default that has no effect, and combinations that cannot be honoured."""

    def unused(field, why):
        default = getattr(DEFAULTS, field)
        raise bad_value(where, field, getattr(cfg, field), f"{default} here ({why})")

    def moved(field):
        return getattr(cfg, field) != getattr(DEFAULTS, field)

    _check_sources(cfg, unused, moved)
    population = cfg.dataset == "synthetic" and cfg.clients > 10_000 and cfg.data is None
    if moved("mu") and cfg.algorithm != "fedprox" and cfg.algorithm_module is None:
        unused("mu", f"μ is FedProx's proximal weight and {cfg.algorithm} has no proximal term")
    if cfg.iid and cfg.dataset != "synthetic" and cfg.data is None:
        unused("iid", f"iid picks Synthetic-IID; {cfg.dataset} is split by partition")
    if cfg.iid and population:
        unused("iid", "populations above 10,000 clients are Synthetic(α, β) windows")
    for f in ("alpha", "beta"):
        if moved(f) and (cfg.dataset != "synthetic" or cfg.iid) and cfg.data is None:
            unused(f, "α and β shape Synthetic(α, β) only")
    natural = cfg.data is None and cfg.dataset in NATURAL
    user_clients = cfg.data is not None and not cfg.data.startswith("flwr:")
    if moved("partition") and cfg.dataset == "synthetic" and cfg.data is None:
        unused("partition", "the synthetic data set comes partitioned by device")
    if moved("partition") and (natural or user_clients):
        unused("partition", f"{cfg.data or cfg.dataset} comes with its own clients")
    for f in ("dirichlet_alpha", "dirichlet_form"):
        synthetic = cfg.dataset == "synthetic" and cfg.data is None
        if moved(f) and (cfg.partition != "dirichlet" or natural or user_clients or synthetic):
            unused(f, "it shapes the dirichlet partition only")
    if moved("server_momentum") and cfg.algorithm != "fedavgm":
        unused("server_momentum", "server momentum is FedAvgM's")
    for f in ("tau", "adaptive_form"):
        if moved(f) and cfg.algorithm not in ADAPTIVE:
            unused(f, "it belongs to fedadam, fedyogi and fedadagrad")
    dp_fields = ("clip_norm", "noise_multiplier", "delta", "adaptive_clip")
    for f in dp_fields:
        if moved(f) and cfg.algorithm != "dpfedavg":
            unused(f, "it belongs to dpfedavg")
    for f in ("clip_quantile", "clip_lr", "clip_count_stddev"):
        if moved(f) and not cfg.adaptive_clip:
            unused(f, "it tunes adaptive clipping (adaptive_clip)")
    if cfg.algorithm == "dpfedavg" and cfg.sampling != "uniform":
        raise bad_value(
            where,
            "sampling",
            cfg.sampling,
            "uniform with dpfedavg (the accountant covers fixed-size uniform cohorts only)",
        )
    if cfg.adaptive_clip:
        z, sb = cfg.noise_multiplier, count_stddev(cfg)
        if not (z > 0 and 2 * sb > z):
            raise bad_value(
                where,
                "noise_multiplier",
                z,
                f"a number in (0, 2σ_b = {2 * sb:g}) with adaptive clipping (Andrew et al. 2021)",
            )
    if cfg.stragglers > 0 and cfg.algorithm == "fedprox" and cfg.local_epochs < 2:
        raise bad_value(
            where,
            "stragglers",
            cfg.stragglers,
            "0 with one local epoch (FedProx's stragglers do 1..E−1 epochs)",
            hint="raise {local_epochs}",
        )
    if cfg.dirichlet_form not in DIRICHLET_FORMS:
        raise unknown_name("dirichlet_form", cfg.dirichlet_form, DIRICHLET_FORMS, "form")
    if cfg.adaptive_form not in ADAPTIVE_FORMS:
        raise unknown_name("adaptive_form", cfg.adaptive_form, ADAPTIVE_FORMS, "form")
    _check_async_and_clients(cfg, where, unused, moved)


PERSONALIZE = ("none", "finetune", "ditto")
# Data sets whose clients are natural (writers, roles, users): no partition applies.
NATURAL = ("shakespeare", "femnist", "stackoverflow", "sent140")


def _check_sources(cfg: ExperimentConfig, unused, moved) -> None:
    """The user's data, model and algorithm against the named ones they replace."""
    if cfg.data is not None:
        if moved("dataset"):
            unused("dataset", f"--data {cfg.data} is the data set")
        if cfg.iid or moved("alpha") or moved("beta"):
            unused("iid" if cfg.iid else "alpha", "it shapes Synthetic(α, β), not --data")
    elif moved("data_format"):
        unused("data_format", "it says how to read --data")
    if cfg.dataset not in FIELD_DATASETS or cfg.data is not None:
        for f in ("data_dir", "download"):
            if moved(f):
                unused(f, f"it locates the field's data sets ({', '.join(FIELD_DATASETS)})")
    if cfg.model_module is not None and cfg.model is not None:
        unused("model", f"--model-module {cfg.model_module} is the model")
    if cfg.algorithm_module is not None and moved("algorithm"):
        unused("algorithm", f"--algorithm-module {cfg.algorithm_module} is the algorithm")


def _check_async_and_clients(cfg: ExperimentConfig, where: str | None, unused, moved) -> None:
    """FedBuff, traces and per-client evaluation: ranges, and settings without effect."""
    for f in ("buffer_size", "concurrency", "finetune_steps"):
        v = getattr(cfg, f)
        low = 0 if f == "finetune_steps" else 1
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise bad_value(where, f, v, f"an integer >= {low}")
    if cfg.algorithm == "fedbuff":
        if cfg.concurrency > cfg.clients:
            raise bad_value(
                where, "concurrency", cfg.concurrency, f"at most the population size, {cfg.clients}"
            )
        why = "FedBuff keeps clients in flight instead of sampling a cohort each round"
        for f in ("clients_per_round", "stragglers", "deadline_s", "sampling"):
            if moved(f):
                unused(f, why)
    else:
        for f in ("buffer_size", "concurrency"):
            if moved(f):
                unused(f, "it belongs to fedbuff")
    if cfg.trace is not None and cfg.sampling != "uniform":
        raise bad_value(
            where, "sampling", cfg.sampling, "uniform with a trace (among the available clients)"
        )
    if cfg.personalize not in PERSONALIZE:
        raise unknown_name("personalize", cfg.personalize, PERSONALIZE, "personalization")
    if not 0 < cfg.local_test_fraction < 1:
        raise bad_value(
            where, "local_test_fraction", cfg.local_test_fraction, "a fraction in (0, 1)"
        )
    if not 0 <= cfg.ditto_lambda < math.inf:
        raise bad_value(where, "ditto_lambda", cfg.ditto_lambda, "a finite number >= 0")
    if moved("local_test_fraction") and not cfg.client_eval:
        unused("local_test_fraction", "it sizes the local test sets of per-client evaluation")
    if moved("personalize") and not cfg.client_eval:
        unused("personalize", "personal models need per-client evaluation, which is off")
    if moved("finetune_steps") and cfg.personalize != "finetune":
        unused("finetune_steps", "it belongs to fine-tuning personalization")
    if moved("ditto_lambda") and cfg.personalize != "ditto":
        unused("ditto_lambda", "it belongs to Ditto personalization")
    if cfg.personalize == "ditto" and cfg.algorithm == "fedbuff":
        raise bad_value(
            where, "personalize", "ditto", "none or finetune with fedbuff (Ditto trains per round)"
        )
    if cfg.client_eval and cfg.dataset == "synthetic" and cfg.clients > 10_000:
        unused("client_eval", "populations above 10,000 clients are overlapping windows")


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
    """Reads an experiment file; returns ``{field: value}`` for the keys it sets (config fields
    and :data:`PROCESS_FIELDS`)."""
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
        field = FIELDS.get(name) or PROCESS_FIELDS.get(name)
        if field is None:
            known = [f.replace("_", "-") for f in [*FIELDS, *PROCESS_FIELDS]]
            raise AisimError(f"{path}: unknown key {key!r}" + suggest(key, known))
        out[name] = _coerce(str(path), key, value, field)
    return out
