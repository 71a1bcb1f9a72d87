"""perfmodel: closed-form step time, communication and memory of distributed training.

Public API (one screen). Everything under ``jit`` takes one strategy with scalar leaves;
:func:`evaluate_grid` is the one place that vectorises it. Errors are :class:`AisimError` data
(``source``, ``field``, ``value``, ``expected``), never text about a command line.

- **Loaders** (presets are JSON files shipped in ``perfmodel/profiles``): :func:`load_model`,
  :func:`load_model_file`, :func:`model_names`, :func:`mlp_from_params`,
  :func:`mlp_from_widths`, :func:`load_hardware`, :func:`load_hardware_file`,
  :func:`hardware_names`, :func:`resolve_model`, :func:`resolve_hardware`; the results
  :class:`Model` / :class:`ModelSpec`, :class:`Hardware` / :class:`HardwareSpec` and the
  efficiencies :class:`Constants`.
- **The strategy**: the pytree :class:`Strategy` (:func:`make_strategy`,
  :func:`stack_strategies`, :func:`strategy_to_dict`), user knobs validated by
  :func:`strategy_from_knobs`, and the named choices :class:`Schedule`, :class:`ZeroStage`,
  :class:`Recompute`, :class:`RecomputeModule`, :class:`Dtype`, :class:`MoeDispatch`,
  :class:`CpComm`, :class:`AttentionKernel`.
- **The model**: :func:`step_time` -> :class:`StepBreakdown` (terms in
  :data:`BREAKDOWN_TERMS`), :func:`memory_per_device` -> :class:`MemoryBreakdown`,
  :func:`evaluate_grid` (one ``jit(vmap)``), the cost models :data:`COST_MODELS` /
  :func:`select_step_fn`, and :func:`estimate` for one strategy end to end.
- **The grid and the search**: :func:`enumerate_strategies` -> :class:`StrategyGrid`
  (:func:`concat_grids`), :func:`sweep` -> :class:`SweepResult` over models × hardware, the
  on-device reduction :func:`perfmodel.search.search` -> :class:`SearchResult`,
  :func:`pareto_mask`, :func:`results_frame`, :func:`plot_sweep`, :func:`strategy_label`.
- **Planning** (time, cost and energy to train; what limits a run; how sure):
  :func:`plan_training` -> :class:`TrainingPlan`, :func:`plan_sweep` (a sweep ranked by
  ``time``, ``cost`` or ``energy``), :func:`elasticities` -> :class:`Sensitivity`,
  :func:`capacity_answer` -> :class:`CapacityAnswer`, :func:`prediction_intervals` from a
  profile's :class:`ConstantsCovariance`.
- **Cross-site collaboration**: the module :mod:`perfmodel.collab` (scenarios, the jittable
  round model and its sweep).
- **Collectives** (alpha-beta times in seconds): :func:`all_reduce_s`, :func:`all_gather_s`,
  :func:`reduce_scatter_s`, :func:`all_to_all_s`, :func:`p2p_s`.
"""

from perfmodel import collab
from perfmodel.breakdown import BREAKDOWN_TERMS, StepBreakdown
from perfmodel.choices import (
    AttentionKernel,
    CpComm,
    Dtype,
    MoeDispatch,
    Recompute,
    RecomputeModule,
    Schedule,
    ZeroStage,
)
from perfmodel.collectives import all_gather_s, all_reduce_s, all_to_all_s, p2p_s, reduce_scatter_s
from perfmodel.constants import Constants, constants_to_dict
from perfmodel.cost_models import COST_MODELS, select_step_fn
from perfmodel.estimate import Estimate, estimate, resolve_hardware, resolve_model
from perfmodel.figures import plot_sweep
from perfmodel.grid import StrategyGrid, concat_grids, enumerate_strategies
from perfmodel.hardware import (
    Hardware,
    HardwareSpec,
    hardware_names,
    load_hardware,
    load_hardware_file,
)
from perfmodel.knobs import strategy_from_knobs
from perfmodel.memory import MemoryBreakdown, memory_per_device
from perfmodel.planning import TrainingPlan, plan_sweep, plan_training
from perfmodel.report import results_frame
from perfmodel.search import SearchResult, pareto_mask
from perfmodel.sensitivity import CapacityAnswer, Sensitivity, capacity_answer, elasticities
from perfmodel.step_time import evaluate_grid, step_time
from perfmodel.strategy import (
    RECOMPUTE,
    SCHEDULES,
    Strategy,
    make_strategy,
    stack_strategies,
    strategy_to_dict,
)
from perfmodel.sweep import SweepResult, strategy_label, sweep
from perfmodel.uncertainty import ConstantsCovariance, Interval, prediction_intervals
from perfmodel.workload import (
    Model,
    ModelSpec,
    gpt_training_flops,
    load_model,
    load_model_file,
    mlp_from_params,
    mlp_from_widths,
    model_names,
    total_params,
)
from simbase.errors import AisimError

__all__ = [
    "collab",
    "AisimError",
    "BREAKDOWN_TERMS",
    "COST_MODELS",
    "CapacityAnswer",
    "ConstantsCovariance",
    "Constants",
    "Dtype",
    "Estimate",
    "Hardware",
    "HardwareSpec",
    "Interval",
    "MemoryBreakdown",
    "Model",
    "ModelSpec",
    "RECOMPUTE",
    "Recompute",
    "RecomputeModule",
    "MoeDispatch",
    "CpComm",
    "AttentionKernel",
    "SCHEDULES",
    "Schedule",
    "SearchResult",
    "Sensitivity",
    "StepBreakdown",
    "Strategy",
    "StrategyGrid",
    "SweepResult",
    "TrainingPlan",
    "ZeroStage",
    "all_gather_s",
    "all_reduce_s",
    "all_to_all_s",
    "capacity_answer",
    "concat_grids",
    "constants_to_dict",
    "elasticities",
    "enumerate_strategies",
    "estimate",
    "evaluate_grid",
    "gpt_training_flops",
    "hardware_names",
    "load_hardware",
    "load_hardware_file",
    "load_model",
    "load_model_file",
    "make_strategy",
    "memory_per_device",
    "mlp_from_params",
    "mlp_from_widths",
    "model_names",
    "p2p_s",
    "pareto_mask",
    "plan_sweep",
    "plan_training",
    "plot_sweep",
    "prediction_intervals",
    "reduce_scatter_s",
    "resolve_hardware",
    "resolve_model",
    "results_frame",
    "select_step_fn",
    "stack_strategies",
    "step_time",
    "strategy_from_knobs",
    "strategy_label",
    "strategy_to_dict",
    "sweep",
    "total_params",
]
