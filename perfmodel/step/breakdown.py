"""The named result every cost model returns: :class:`StepBreakdown`.

Contract: a one-strategy step function (:func:`perfmodel.step.step_time.step_time`,
:func:`perfmodel.step.distir.distir_step_time`) returns a :class:`StepBreakdown` whose
:data:`BREAKDOWN_TERMS` add up to ``step_time_s``; a grid's breakdown has the same fields with a
leading axis. It lives apart from both models so that neither imports the other.
"""

from __future__ import annotations

import dataclasses

import jax
from jaxtyping import Array, Float

from perfmodel.step.memory import MemoryBreakdown

BREAKDOWN_TERMS = (
    "compute_s",
    "tp_comm_s",
    "cp_comm_s",
    "ep_comm_s",
    "dp_comm_exposed_s",
    "pp_p2p_s",
    "bubble_s",
    "optimizer_s",
    "overhead_s",
    "step_overhead_s",
)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StepBreakdown:
    """Named result of one strategy (seconds, bytes, FLOPs; booleans as arrays).

    The terms in :data:`BREAKDOWN_TERMS` add up to ``step_time_s``. ``mfu`` and ``hfu`` are
    model and hardware FLOPs over the step time and the dtype's listed peak (Chowdhery et al.
    2022, appendix B); ``feasible`` is ``fits_memory & valid``.
    """

    compute_s: Float[Array, "*n"]
    tp_comm_s: Float[Array, "*n"]
    cp_comm_s: Float[Array, "*n"]  # context-parallel K/V exchange left exposed
    ep_comm_s: Float[Array, "*n"]  # MoE token dispatch and combine left exposed
    dp_comm_exposed_s: Float[Array, "*n"]
    pp_p2p_s: Float[Array, "*n"]
    bubble_s: Float[Array, "*n"]
    optimizer_s: Float[Array, "*n"]
    overhead_s: Float[Array, "*n"]
    step_overhead_s: Float[Array, "*n"]  # fixed per-step costs: host loop, gradient norm
    step_time_s: Float[Array, "*n"]
    dp_comm_total_s: Float[Array, "*n"]
    throughput_samples_per_s: Float[Array, "*n"]
    tokens_per_s: Float[Array, "*n"]
    model_flops: Float[Array, "*n"]
    hardware_flops: Float[Array, "*n"]
    mfu: Float[Array, "*n"]
    hfu: Float[Array, "*n"]
    model_tflops_per_gpu: Float[Array, "*n"]
    hardware_tflops_per_gpu: Float[Array, "*n"]
    cost_per_million_tokens_usd: Float[Array, "*n"]
    memory: MemoryBreakdown
    memory_per_device_bytes: Float[Array, "*n"]
    fits_memory: Float[Array, "*n"]
    valid: Float[Array, "*n"]
    feasible: Float[Array, "*n"]
