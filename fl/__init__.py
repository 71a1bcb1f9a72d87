"""Federated training at scale: vmap over clients inside one jitted round, timed by perfmodel.

The entry point is :func:`simulate` (``fl.simulate(fl.ExperimentConfig(...))``), which is what
``aisim fl run`` calls; it takes the user's own model (:func:`model_from_linen`,
:func:`model_from_nnx`, :func:`model_from_functions`), data (:func:`from_arrays`,
:func:`from_leaf`, :func:`from_tff`, :func:`from_flwr`) and algorithm (:class:`Algorithm`). The
other names build a run piece by piece. Everything not listed in
``__all__`` is internal. Bad settings raise :class:`simbase.errors.AisimError` naming the
:class:`ExperimentConfig` field.
"""

from fl.algorithm import (
    AggregateContext,
    Algorithm,
    ClientContext,
    LocalContext,
    clipped_difference,
    control_variate_grad,
    model_difference,
    noised_mean,
    proximal_grad,
    weighted_mean,
)
from fl.asynchronous import AsyncSpec, AsyncState, init_async, make_fill, staleness_weight
from fl.build import Built, build
from fl.centralised import train_centralised
from fl.config import ExperimentConfig, load_toml, validate
from fl.data import digits, load, mnist, synthetic, synthetic_population
from fl.datasets import from_arrays, from_flwr, from_leaf, from_npz, from_tff, load_field, load_path
from fl.federated_data import FederatedData
from fl.models import cross_entropy, dense_dot_general, make_model
from fl.modules import Model, model_from_functions, model_from_linen, model_from_nnx
from fl.partition import Population, dirichlet, iid, quantity, shards
from fl.personalization import client_stats, make_client_eval, make_ditto_step, split_local
from fl.plotting import plot_accuracy, plot_loss
from fl.privacy import PrivacyReport, epsilon
from fl.round import (
    CohortPlan,
    Hyper,
    RoundInputs,
    RoundMetrics,
    RoundSpec,
    ServerState,
    init_server_state,
    make_round,
    plan_cohort,
)
from fl.sampling import sample_uniform
from fl.server import make_algorithm
from fl.simulation import SimulationResult, load_config_json, simulate
from fl.systems import DeviceProfile, Systems, client_time_s, draw_systems, load_profile, parse_mix
from fl.tasks import CLASSIFICATION, NEXT_TOKEN, REGRESSION, Task
from fl.traces import generate_trace, load_trace, read_trace

__all__ = [
    # runs
    "ExperimentConfig",
    "validate",
    "load_toml",
    "simulate",
    "SimulationResult",
    "load_config_json",
    "build",
    "Built",
    "train_centralised",
    "plot_accuracy",
    "plot_loss",
    # data and partitions (the user's own: fl.datasets)
    "FederatedData",
    "from_arrays",
    "from_npz",
    "from_leaf",
    "from_tff",
    "from_flwr",
    "load_path",
    "load_field",
    "load",
    "synthetic",
    "synthetic_population",
    "digits",
    "mnist",
    "Population",
    "iid",
    "dirichlet",
    "shards",
    "quantity",
    # models: built-in by name, or the user's flax module / init-apply pair
    "Model",
    "make_model",
    "model_from_linen",
    "model_from_nnx",
    "model_from_functions",
    "dense_dot_general",
    "cross_entropy",
    "Task",
    "CLASSIFICATION",
    "NEXT_TOKEN",
    "REGRESSION",
    # algorithms: the extension point (fl.algorithm) and the built-in presets
    "Algorithm",
    "LocalContext",
    "ClientContext",
    "AggregateContext",
    "model_difference",
    "weighted_mean",
    "proximal_grad",
    "control_variate_grad",
    "clipped_difference",
    "noised_mean",
    "make_algorithm",
    # the round engine (one jitted round, clients vmapped)
    "RoundSpec",
    "RoundInputs",
    "Hyper",
    "ServerState",
    "RoundMetrics",
    "CohortPlan",
    "init_server_state",
    "make_round",
    "plan_cohort",
    "sample_uniform",
    # systems heterogeneity (device presets in fl/profiles)
    "DeviceProfile",
    "Systems",
    "load_profile",
    "parse_mix",
    "draw_systems",
    "client_time_s",
    # availability and speed traces (fl.traces), FedBuff (fl.asynchronous)
    "generate_trace",
    "read_trace",
    "load_trace",
    "AsyncSpec",
    "AsyncState",
    "init_async",
    "make_fill",
    "staleness_weight",
    # per-client evaluation and personalization (fl.personalization)
    "split_local",
    "make_client_eval",
    "make_ditto_step",
    "client_stats",
    # privacy (DP-FedAvg accounting with dp-accounting)
    "epsilon",
    "PrivacyReport",
]
