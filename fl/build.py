"""Building an FL run from its config: data, model, systems, the jitted round and its inputs.

Contract: :func:`build` turns an :class:`~fl.config.ExperimentConfig` into a :class:`Built`,
everything :func:`fl.simulation.simulate` needs to loop over rounds. The model and the jitted
functions are memoised by their static description, so repeated runs in one process compile
each shape once. The chunk size (clients trained together) comes from the memory budget
(:func:`chunk_size`). Host-side; the only I/O is reading bundled data sets.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fl import data as fl_data
from fl import local_update as lu
from fl import round as rnd
from fl.algorithm import Algorithm, check_algorithm
from fl.asynchronous import build_async
from fl.config import ExperimentConfig, count_stddev, validate
from fl.datasets import FIELD_DATASETS, load_field, load_path
from fl.distributed import replicate
from fl.federated_data import FederatedData
from fl.models import DEFAULT_MODEL, Model, make_model
from fl.modules import import_object, model_from_path
from fl.personalization import split_local
from fl.server import make_algorithm
from fl.systems import draw_systems, parse_mix
from fl.tasks import CLASSIFICATION, NEXT_TOKEN, REGRESSION, Task
from fl.traces import load_trace
from simbase.errors import AisimError, bad_value
from simbase.units import parse_bytes
from simbase.xla_options import fast_cpu_options


@dataclasses.dataclass
class Built:
    """Everything a run needs, built once from a config."""

    cfg: ExperimentConfig
    data: FederatedData
    model: Model
    spec: rnd.RoundSpec
    run_round: Callable
    evaluate: Callable
    inputs: rnd.RoundInputs
    hyper: rnd.Hyper
    init_state: rnd.ServerState
    eval_sets: tuple
    local_test: object = None  # fl.personalization.LocalTests with client_eval, else None


def client_bytes(model: Model, local: lu.LocalSpec, scaffold: bool) -> float:
    """Working-set bytes of one client in a vmapped chunk (float32).

    Params, gradient, new params, delta, the broadcast global copy in flight, the optimiser state,
    SCAFFOLD's two control copies, the shuffle's round keys and a batch of activations (x3 for
    the backward pass and the fused update).
    """
    params = jax.eval_shape(model.init, jax.random.key(0))
    opt = jax.eval_shape(local.client_opt.init, params)
    opt_floats = sum(math.prod(x.shape) for x in jax.tree.leaves(opt))
    p = model.num_params
    floats = 5 * p + opt_floats + (2 * p if scaffold else 0)
    floats += local.max_epochs * 2 * lu.SHUFFLE_ROUNDS
    floats += 3 * local.batch_size * model.activation_floats_per_sample
    return 4.0 * floats


CPU_CACHE_BYTES = 5e6

# The growing head is compiled only where it pays: where it cuts the masked client-steps of a
# typical round by at least this fraction (each head chunk is one more loop to compile).
HEAD_MIN_SAVING = 0.2
HEAD_SAMPLE_COHORTS = 16
# A run that trains at most this many FLOPs in all (padded steps included) compiles its round
# with XLA:CPU's fast options (simbase.xla_options): a quarter to a fifth of the compile time, a
# round 1.2-3.3x slower. Measured: the fast program pays up to 1.1e10 FLOPs for the digits MLP
# (100 clients, cohort 10: about 140 rounds), 2.9e10 for the simple CNN and 3.9e10 for FedProx's
# synthetic(1,1) with 1,000 clients and cohorts of 100.
FAST_COMPILE_FLOPS = 1e10


def padded_steps(spec: rnd.RoundSpec, steps_desc: np.ndarray) -> int:
    """Client-steps a round's chunks run for a cohort whose local steps are ``steps_desc``
    (longest first, as :func:`fl.cohort.arrange_cohort` sorts it): each chunk runs its longest
    client's steps for all its slots."""
    total, offset = 0, 0
    for size, count in spec.segments:
        for _ in range(count):
            if offset < len(steps_desc):
                total += size * int(steps_desc[offset])
            offset += size
    return total


def _sample_cohorts(spec: rnd.RoundSpec, steps: np.ndarray, sizes: np.ndarray) -> list:
    """The local steps of :data:`HEAD_SAMPLE_COHORTS` cohorts drawn as the round draws them
    (uniformly, or in proportion to size with ``sampling="size"``), longest first. A property
    of the population, not of the run's seed."""
    rng = np.random.default_rng(0)
    m, n = spec.cohort, len(steps)
    p = sizes / sizes.sum() if spec.sampling == "size" else None
    return [
        np.sort(steps[rng.choice(n, m, replace=p is not None, p=p)])[::-1]
        for _ in range(HEAD_SAMPLE_COHORTS)
    ]


def run_flops(spec: rnd.RoundSpec, rounds: int, cohorts: list) -> float:
    """Training FLOPs a run of ``rounds`` rounds computes, padded steps included: the mean
    :func:`padded_steps` of ``cohorts`` times the batch and the model's FLOPs per sample."""
    steps = float(np.mean([padded_steps(spec, c) for c in cohorts]))
    return rounds * steps * spec.local.batch_size * spec.flops_per_sample


def round_compile_options(spec: rnd.RoundSpec) -> dict | None:
    """XLA's options for the round program: :data:`simbase.xla_options.FAST_CPU_COMPILE` where
    :attr:`~fl.state.RoundSpec.fast_compile` (decided by :func:`round_spec`), else the
    defaults."""
    return fast_cpu_options() if spec.fast_compile else None


def head_pays(spec: rnd.RoundSpec, steps: np.ndarray, sizes: np.ndarray, cohorts=None) -> bool:
    """Whether :attr:`~fl.state.RoundSpec.segments`' growing head is worth its extra compiled
    loops for a population whose clients hold ``sizes`` examples and run ``steps`` local steps:
    it must cut the padded client-steps of cohorts drawn as the round draws them (uniformly, or
    in proportion to size with ``sampling="size"``) by :data:`HEAD_MIN_SAVING`. A heavy-tailed population
    (FedProx's lognormal sizes: a third of the steps of one chunk per cohort of 100) gets it; one
    whose clients are alike (the digits partitions: a tenth or less) gets equal chunks only, which
    compile once and give the same metrics to float rounding. ``cohorts``: those draws
    (:func:`_sample_cohorts`), when the caller has them."""
    flat = dataclasses.replace(spec, head=False)
    if spec.segments == flat.segments:
        return False
    cohorts = _sample_cohorts(spec, steps, sizes) if cohorts is None else cohorts
    with_head = sum(padded_steps(spec, c) for c in cohorts)
    without = sum(padded_steps(flat, c) for c in cohorts)
    return with_head <= (1.0 - HEAD_MIN_SAVING) * without


def chunk_size(
    budget_bytes: float,
    per_client_bytes: float,
    cohort: int,
    n_devices: int,
    min_buckets: int = 4,
    cache_clients: int | None = None,
) -> int:
    """Clients per chunk: as many as fit in half the budget (the rest for the pool and XLA's
    temporaries), but at most ``cohort / min_buckets`` so that the size-sorted cohort falls into
    several buckets and small clients do not wait for the largest, and at most ``cache_clients``
    (on a CPU: the clients whose parameters fit in :data:`CPU_CACHE_BYTES`, since a vmapped step
    over more streams every client's weights from DRAM and runs several times slower per client);
    rounded to a multiple of the device count."""
    fit = int(0.5 * budget_bytes // max(per_client_bytes, 1.0))
    if fit < 1:
        raise AisimError(
            field="memory_budget",
            value=f"{budget_bytes:.3g} bytes",
            expected=f"at least twice the {per_client_bytes:.3g} bytes one client needs",
            hint="raise {memory_budget}",
        )
    size = min(fit, -(-cohort // min_buckets), cache_clients or fit)
    size = max(n_devices, (size // n_devices) * n_devices)
    return size


_CACHE: dict = {}


class Identity:
    """A cache key part equal only to itself's object (and keeping it alive, so that its ``id``
    cannot be reused by another while the entry exists)."""

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other) -> bool:
        return isinstance(other, Identity) and other.obj is self.obj


def _cached(key, make):
    """Memoises the model and the jitted functions of a run by their static description, so that
    repeated runs in one process (sweeps, tests, resume) compile each shape once."""
    if key not in _CACHE:
        if len(_CACHE) > 64:
            _CACHE.clear()
        _CACHE[key] = make()
    return _CACHE[key]


def load_data(cfg: ExperimentConfig) -> FederatedData:
    """The run's data set and population (``--data``, a field data set, or a bundled one)."""
    if cfg.data is not None:
        return load_path(
            cfg.data,
            cfg.data_format,
            num_clients=cfg.clients,
            partition=cfg.partition,
            dirichlet_alpha=cfg.dirichlet_alpha,
            seed=cfg.seed,
        )
    if cfg.dataset in FIELD_DATASETS:
        return load_field(
            cfg.dataset,
            num_clients=cfg.clients,
            partition=cfg.partition,
            dirichlet_alpha=cfg.dirichlet_alpha,
            dirichlet_form=cfg.dirichlet_form,
            seed=cfg.seed,
            data_dir=cfg.data_dir,
            download=cfg.download,
        )
    return fl_data.load(
        cfg.dataset,
        cfg.clients,
        cfg.partition,
        cfg.dirichlet_alpha,
        cfg.alpha,
        cfg.beta,
        cfg.iid,
        cfg.seed,
        cfg.dirichlet_form,
    )


def check_cohort(cfg: ExperimentConfig, ds: FederatedData) -> None:
    """The cohort fits in the population that the data set has."""
    if cfg.clients_per_round > ds.population.num_clients:
        raise bad_value(
            None,
            "clients_per_round",
            cfg.clients_per_round,
            f"at most the {ds.population.num_clients} clients of the population",
        )


def infer_task(ds: FederatedData) -> Task:
    """The task a user's data set asks for: regression for float labels, next-token for labels
    with a position axis, classification otherwise."""
    if not np.issubdtype(ds.y_train.dtype, np.integer):
        return REGRESSION
    return NEXT_TOKEN if ds.y_train.ndim > 1 else CLASSIFICATION


def model_of(cfg: ExperimentConfig, ds: FederatedData) -> Model:
    """The run's model: ``--model-module``'s factory, or a built-in by name (memoised)."""
    if cfg.model_module is not None:
        task = infer_task(ds)
        outputs = ds.num_classes if task.integer_labels else int(np.prod(ds.y_train.shape[1:]))
        dtype = jnp.int32 if np.issubdtype(ds.x_train.dtype, np.integer) else jnp.float32
        key = ("module", cfg.model_module, ds.input_shape, outputs, task.name)
        return _cached(
            key, lambda: model_from_path(cfg.model_module, ds.input_shape, outputs, task, dtype)
        )
    name = cfg.model or DEFAULT_MODEL.get(ds.name, DEFAULT_MODEL.get(cfg.dataset, "mlp"))
    key = ("model", name, ds.input_shape, ds.num_classes, ds.vocab_size)
    return _cached(
        key, lambda: make_model(name, ds.input_shape, ds.num_classes, vocab=ds.vocab_size)
    )


def algorithm_of(cfg: ExperimentConfig) -> Algorithm:
    """``--algorithm-module``'s :class:`Algorithm` (an instance, or a function returning one),
    or the built-in named by ``cfg.algorithm``."""
    if cfg.algorithm_module is None:
        return make_algorithm(
            cfg.algorithm, cfg.server_lr, cfg.server_momentum, cfg.tau, cfg.adaptive_form
        )
    obj = import_object(cfg.algorithm_module, "algorithm_module")
    alg = obj() if callable(obj) and not isinstance(obj, Algorithm) else obj
    if not isinstance(alg, Algorithm):
        raise bad_value(
            None,
            "algorithm_module",
            cfg.algorithm_module,
            "an fl.Algorithm or a function returning one",
        )
    return alg


def round_spec(
    cfg: ExperimentConfig, model: Model, alg: Algorithm, sizes: np.ndarray, mesh
) -> rnd.RoundSpec:
    """The static round: algorithm, local training, the chunk size the memory budget allows (on
    a CPU, also the clients whose parameters fit in :data:`CPU_CACHE_BYTES`), whether the
    population's sizes call for the growing head (:func:`head_pays`), and, on a CPU, whether
    the run is short enough (:data:`FAST_COMPILE_FLOPS`) to compile the round for a fast start."""
    max_samples = int(sizes.max())
    devices = jax.devices()
    local = lu.LocalSpec(
        apply=model.apply,
        client_opt=optax.sgd(cfg.lr),
        batch_size=cfg.batch_size,
        max_samples=max_samples,
        max_epochs=cfg.local_epochs,
        local_grad=alg.local_grad,
        loss=model.task.loss,
    )
    per_client = client_bytes(model, local, alg.scaffold)
    cache_clients = None
    if devices[0].platform == "cpu":
        cache_clients = max(1, int(CPU_CACHE_BYTES // model.param_bytes))
    chunk = chunk_size(
        parse_bytes(cfg.memory_budget),
        per_client,
        cfg.clients_per_round,
        len(devices) if mesh else 1,
        cache_clients=cache_clients,
    )
    spec = rnd.RoundSpec(
        local=local,
        algorithm=alg,
        cohort=cfg.clients_per_round,
        chunk=chunk,
        sampling=cfg.sampling,
        adaptive_clip=cfg.adaptive_clip,
        flops_per_sample=model.train_flops_per_sample,
        param_bytes=model.param_bytes,
        mesh=mesh,
    )
    steps = np.minimum(-(-sizes // cfg.batch_size) * cfg.local_epochs, cfg.max_local_steps or 2**30)
    cohorts = _sample_cohorts(spec, steps, sizes)  # drawn once for both decisions
    spec = dataclasses.replace(spec, head=head_pays(spec, steps, sizes, cohorts))
    flops = run_flops(spec, cfg.rounds, cohorts)
    cpu = devices[0].platform == "cpu"
    return dataclasses.replace(spec, fast_compile=cpu and flops <= FAST_COMPILE_FLOPS)


def round_inputs(cfg: ExperimentConfig, ds: FederatedData) -> rnd.RoundInputs:
    """The device-resident pool (in population order), windows and drawn systems."""
    pop = ds.population
    systems = draw_systems(
        parse_mix(cfg.devices), pop.num_clients, np.random.default_rng(cfg.seed + 1)
    )
    if cfg.trace is not None:
        systems = load_trace(cfg.trace, systems)
    return rnd.RoundInputs(
        data=lu.LocalData(
            x_pool=jnp.asarray(ds.x_train[pop.order]),
            y_pool=jnp.asarray(ds.y_train[pop.order]),
        ),
        starts=jnp.asarray(pop.starts),
        sizes=jnp.asarray(pop.sizes),
        systems=systems,
    )


def hyper_of(cfg: ExperimentConfig) -> rnd.Hyper:
    """The run's sweepable numbers as array leaves (no deadline: infinity)."""
    return rnd.Hyper(
        mu=jnp.float32(cfg.mu),
        client_lr=jnp.float32(cfg.lr),
        straggler_fraction=jnp.float32(cfg.stragglers),
        deadline_s=jnp.float32(cfg.deadline_s if cfg.deadline_s is not None else jnp.inf),
        clip_norm=jnp.float32(cfg.clip_norm),
        noise_multiplier=jnp.float32(cfg.noise_multiplier),
        max_local_steps=jnp.int32(min(cfg.max_local_steps or 2**30, 2**30)),
        clip_quantile=jnp.float32(cfg.clip_quantile),
        clip_lr=jnp.float32(cfg.clip_lr),
        clip_count_stddev=jnp.float32(count_stddev(cfg)),
    )


def build(
    cfg: ExperimentConfig,
    *,
    model: Model | None = None,
    data: FederatedData | None = None,
    algorithm: Algorithm | None = None,
) -> Built:
    """Loads the data, draws the systems, and jits the round for ``cfg``; ``model``, ``data``
    and ``algorithm`` replace the ones ``cfg`` names (a user's own, from Python)."""
    validate(cfg, custom_algorithm=algorithm is not None)
    ds = data if data is not None else load_data(cfg)
    check_cohort(cfg, ds)
    local_test = None
    if cfg.client_eval:  # each client's local test rows leave its training rows
        ds, local_test = split_local(ds, cfg.local_test_fraction, cfg.seed)
    pop = ds.population
    model = model if model is not None else model_of(cfg, ds)
    custom_alg = algorithm is not None or cfg.algorithm_module is not None
    alg = algorithm if algorithm is not None else algorithm_of(cfg)
    params = model.init(jax.random.key(cfg.seed))
    if custom_alg:
        check_algorithm(alg, params)
    devices = jax.devices()
    mesh = None
    if cfg.shard and len(devices) > 1:
        mesh = jax.sharding.Mesh(np.array(devices), ("clients",))
    spec = round_spec(cfg, model, alg, pop.sizes, mesh)
    static = (
        Identity(model),
        alg if custom_alg else None,
        ds.input_shape,
        ds.num_classes,
        cfg.algorithm,
        cfg.server_lr,
        cfg.server_momentum,
        cfg.lr,
        cfg.batch_size,
        cfg.local_epochs,
        int(pop.sizes.max()),
        cfg.clients_per_round,
        cfg.sampling,
        cfg.adaptive_clip,
        cfg.tau,
        cfg.adaptive_form,
        mesh is not None,
        cfg.memory_budget,
        cfg.max_local_steps,
        spec.head,
        spec.fast_compile,
    )

    def make_spec():
        return spec, jax.jit(rnd.make_round(spec), compiler_options=round_compile_options(spec))

    spec, run_round = _cached(("round", *static), make_spec)
    inputs = round_inputs(cfg, ds)
    state = rnd.init_server_state(spec, params, pop.num_clients, cfg.seed, cfg.clip_norm)
    if mesh is not None:
        # Replicated over the mesh, as the round returns it: the second round does not recompile.
        rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        if jax.process_count() > 1:  # the mesh spans processes (fl.distributed)
            inputs, state = replicate((inputs, state), rep)
        else:
            inputs, state = jax.device_put((inputs, state), rep)
    evaluate = _cached(
        ("eval", Identity(model), ds.input_shape, ds.num_classes),
        lambda: jax.jit(rnd.make_evaluate(model.apply, task=model.task)),
    )
    tr = slice(None) if ds.train_eval_rows is None else ds.train_eval_rows
    eval_sets = (
        (jnp.asarray(ds.x_train[tr]), jnp.asarray(ds.y_train[tr])),
        (jnp.asarray(ds.x_test), jnp.asarray(ds.y_test)),
    )
    b = Built(cfg, ds, model, spec, run_round, evaluate, inputs, hyper_of(cfg), state, eval_sets)
    b = dataclasses.replace(b, local_test=local_test)
    if cfg.algorithm == "fedbuff":
        b = build_async(b, _cached, static)
    return b
