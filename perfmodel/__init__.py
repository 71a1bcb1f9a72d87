"""perfmodel: closed-form step time, communication and memory of distributed training.

Public API (one screen):
"""

from perfmodel.collectives import all_gather_s, all_reduce_s, all_to_all_s, p2p_s, reduce_scatter_s
from perfmodel.constants import Constants, constants_to_dict
from perfmodel.estimate import Estimate, estimate, resolve_hardware, resolve_model
from perfmodel.figures import plot_sweep
from perfmodel.hardware import (
    Hardware,
    HardwareSpec,
    hardware_names,
    load_hardware,
    load_hardware_file,
)
from perfmodel.memory import MemoryBreakdown, memory_per_device
from perfmodel.step_time import BREAKDOWN_TERMS, StepBreakdown, evaluate_grid, step_time
from perfmodel.strategy import RECOMPUTE, SCHEDULES, Strategy, make_strategy, stack_strategies
from perfmodel.sweep import SweepResult, strategy_label, sweep
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
    "AisimError",
    "BREAKDOWN_TERMS",
    "Constants",
    "Estimate",
    "Hardware",
    "HardwareSpec",
    "MemoryBreakdown",
    "Model",
    "ModelSpec",
    "RECOMPUTE",
    "SCHEDULES",
    "StepBreakdown",
    "Strategy",
    "SweepResult",
    "all_gather_s",
    "all_reduce_s",
    "all_to_all_s",
    "constants_to_dict",
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
    "plot_sweep",
    "reduce_scatter_s",
    "resolve_hardware",
    "resolve_model",
    "stack_strategies",
    "step_time",
    "strategy_label",
    "sweep",
    "total_params",
]
