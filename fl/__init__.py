"""Federated training at scale: vmap over clients inside one jitted round, timed by perfmodel.

Public API (everything else is internal):

- data: :func:`load`, :func:`synthetic`, :func:`synthetic_population`, :func:`digits`,
  :func:`mnist`, :class:`FederatedData`; populations: :class:`Population` and the partitioners
  :func:`iid`, :func:`dirichlet`, :func:`shards`, :func:`quantity`.
- models: :func:`make_model`, :class:`Model`.
- algorithms: :func:`make_algorithm`, :class:`Algorithm` (server optimiser = any optax transform).
- engine: :func:`make_round`, :func:`plan_cohort`, :func:`sample_uniform`, :class:`RoundSpec`,
  :class:`ServerState`,
  ``fl.local_update.local_update`` (one-client reference), :func:`client_time_s`, :func:`draw_systems`.
- privacy: :func:`epsilon`, :func:`rdp_sampled_gaussian`.
- runs: :class:`ExperimentConfig`, :func:`simulate`, :class:`SimulationResult`,
  :func:`train_centralised`.
"""

from fl.centralised import train_centralised
from fl.config import ExperimentConfig
from fl.data import FederatedData, digits, load, mnist, synthetic, synthetic_population
from fl.models import Model, make_model
from fl.partition import Population, dirichlet, iid, quantity, shards
from fl.privacy import epsilon, rdp_sampled_gaussian
from fl.round import RoundSpec, ServerState, make_round, plan_cohort
from fl.sampling import sample_uniform
from fl.server import Algorithm, make_algorithm
from fl.simulation import SimulationResult, simulate
from fl.systems import client_time_s, draw_systems

__all__ = [
    "Algorithm",
    "ExperimentConfig",
    "FederatedData",
    "Model",
    "Population",
    "RoundSpec",
    "ServerState",
    "SimulationResult",
    "client_time_s",
    "digits",
    "dirichlet",
    "draw_systems",
    "epsilon",
    "iid",
    "load",
    "make_algorithm",
    "make_model",
    "make_round",
    "mnist",
    "plan_cohort",
    "quantity",
    "rdp_sampled_gaussian",
    "sample_uniform",
    "shards",
    "simulate",
    "synthetic",
    "synthetic_population",
    "train_centralised",
]
