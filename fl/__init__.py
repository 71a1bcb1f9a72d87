"""Federated training at scale: vmap over clients inside one jitted round, timed by perfmodel.

The entry point is :func:`simulate` (``fl.simulate(fl.ExperimentConfig(...))``), which is what
``aisim fl run`` calls; the other names build a run piece by piece. Everything not listed in
``__all__`` is internal. Bad settings raise :class:`simbase.errors.AisimError` naming the
:class:`ExperimentConfig` field.
"""

from fl.asynchronous import AsyncSpec, AsyncState, init_async, make_fill, staleness_weight
from fl.build import Built, build
from fl.centralised import train_centralised
from fl.config import ExperimentConfig, load_toml, validate
from fl.data import FederatedData, digits, load, mnist, synthetic, synthetic_population
from fl.models import Model, cross_entropy, make_model
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
from fl.server import Algorithm, make_algorithm
from fl.simulation import SimulationResult, load_config_json, simulate
from fl.systems import DeviceProfile, Systems, client_time_s, draw_systems, load_profile, parse_mix
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
    # data and partitions
    "FederatedData",
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
    # models and algorithms (the server optimiser is any optax transformation)
    "Model",
    "make_model",
    "cross_entropy",
    "Algorithm",
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
