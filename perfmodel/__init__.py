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
- **The strategy**: the knob registry :data:`KNOBS` (one :class:`Knob` each), the nested
  pytree :class:`Strategy` of a :class:`Layout`, a :class:`Batching` and a :class:`MemoryPlan`
  with a static software :class:`Stack` and :class:`Scope` (:func:`make_strategy`,
  :func:`stack_strategies`, :func:`strategy_to_dict`, :func:`strategy_from_row`), user knobs
  validated by :func:`strategy_from_knobs`, and the named choices :class:`Schedule`,
  :class:`ZeroStage`, :class:`Recompute`, :class:`RecomputeModule`, :class:`Dtype`,
  :class:`MoeDispatch`, :class:`CpComm`, :class:`AttentionKernel`.
- **The model**: :func:`step_time` -> :class:`StepBreakdown` (terms in
  :data:`BREAKDOWN_TERMS`), :func:`memory_per_device` -> :class:`MemoryBreakdown`,
  :func:`evaluate_grid` (one ``jit(vmap)``), the cost models :data:`COST_MODELS` /
  :func:`select_step_fn`, and :func:`estimate` for one strategy end to end.
- **The grid and the search**: :func:`enumerate_strategies` -> :class:`StrategyGrid`
  (:func:`concat_grids`), :func:`sweep` -> :class:`SweepResult` over models × hardware, the
  on-device reduction :func:`perfmodel.search.reduce.search` -> :class:`SearchResult`,
  :func:`pareto_mask`, :func:`results_frame`, :func:`plot_sweep`, :func:`strategy_label`.
- **Planning** (time, cost and energy to train; what limits a run; how sure):
  :func:`plan_training` -> :class:`TrainingPlan`, :func:`plan_sweep` (a sweep ranked by
  ``time``, ``cost`` or ``energy``), :func:`elasticities` -> :class:`Sensitivity`,
  :func:`capacity_answer` -> :class:`CapacityAnswer`, :func:`prediction_intervals` from a
  profile's :class:`ConstantsCovariance`; failures, checkpoints and stragglers:
  :func:`failure_model` -> :class:`FailureModel` (:func:`storage_names`), :func:`failure_plan`
  -> :class:`FailurePlan`, :func:`straggler_slowdown`.
- **Software stacks**: :func:`load_stack` -> :class:`StackPreset` (:func:`stack_names`,
  :func:`explain`), and the constants a stack runs with on a hardware preset,
  :func:`stack_constants` -> :class:`StackConstants`.
- **Collectives** (alpha-beta times in seconds): :func:`all_reduce_s`, :func:`all_gather_s`,
  :func:`reduce_scatter_s`, :func:`all_to_all_s`, :func:`p2p_s`.
"""

from perfmodel.plan.estimate import Estimate, estimate, resolve_hardware, resolve_model
from perfmodel.plan.failure_model import FailureModel, failure_model, storage_names
from perfmodel.plan.reliability import FailurePlan, failure_plan, straggler_slowdown
from perfmodel.plan.sensitivity import CapacityAnswer, Sensitivity, capacity_answer, elasticities
from perfmodel.plan.stack_constants import StackConstants, stack_constants
from perfmodel.plan.training import TrainingPlan, plan_sweep, plan_training
from perfmodel.plan.uncertainty import ConstantsCovariance, Interval, prediction_intervals
from perfmodel.search.evaluate import evaluate_grid
from perfmodel.search.figures import plot_sweep
from perfmodel.search.grid import StrategyGrid, concat_grids, enumerate_strategies
from perfmodel.search.reduce import SearchResult, pareto_mask
from perfmodel.search.report import results_frame
from perfmodel.search.sweep import SweepResult, strategy_label, sweep
from perfmodel.specs.choices import (
    AttentionKernel,
    CpComm,
    Dtype,
    MoeDispatch,
    Recompute,
    RecomputeModule,
    Schedule,
    ZeroStage,
)
from perfmodel.specs.constants import Constants, constants_to_dict
from perfmodel.specs.hardware import (
    Hardware,
    HardwareSpec,
    hardware_names,
    load_hardware,
    load_hardware_file,
)
from perfmodel.specs.knobs import KNOBS, Knob
from perfmodel.specs.model import (
    Model,
    ModelSpec,
    gpt_training_flops,
    load_model,
    load_model_file,
    mlp_from_params,
    mlp_from_widths,
    model_names,
    tokens_per_sample,
    total_params,
)
from perfmodel.specs.stack import Stack
from perfmodel.specs.stack_preset import StackPreset, explain, load_stack, stack_names
from perfmodel.specs.strategy import (
    RECOMPUTE,
    SCHEDULES,
    Batching,
    Layout,
    MemoryPlan,
    Scope,
    Strategy,
    make_strategy,
    stack_strategies,
    strategy_from_row,
    strategy_to_dict,
)
from perfmodel.specs.validate import strategy_from_knobs
from perfmodel.step.breakdown import BREAKDOWN_TERMS, StepBreakdown
from perfmodel.step.collectives import (
    all_gather_s,
    all_reduce_s,
    all_to_all_s,
    p2p_s,
    reduce_scatter_s,
)
from perfmodel.step.cost_models import COST_MODELS, select_step_fn
from perfmodel.step.memory import MemoryBreakdown, memory_per_device
from perfmodel.step.precision import activation_bytes
from perfmodel.step.roofline import op_time_s
from perfmodel.step.step_time import step_time
from perfmodel.step.workload import OpClass
from simbase.errors import AisimError

__all__ = [
    "OpClass",
    "activation_bytes",
    "op_time_s",
    "tokens_per_sample",
    "KNOBS",
    "Knob",
    "Stack",
    "StackPreset",
    "load_stack",
    "stack_names",
    "explain",
    "Layout",
    "Batching",
    "MemoryPlan",
    "Scope",
    "strategy_from_row",
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
    "FailureModel",
    "FailurePlan",
    "failure_model",
    "failure_plan",
    "storage_names",
    "straggler_slowdown",
    "StackConstants",
    "stack_constants",
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
