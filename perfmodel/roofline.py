"""Compute time of one class of kernels: a roofline with smooth, size-dependent efficiencies.

An op takes ``max(FLOPs / (peak · η_c), bytes / (bandwidth · η_m))`` plus a launch overhead per
kernel (Williams, Waterman & Patterson 2009, the roofline model). The efficiencies rise smoothly
with the work per kernel, ``η(x) = η_max · x / (x + x_half)``, so small kernels are slower per
FLOP than large ones; calibration fits ``η_max`` and ``x_half``.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float

from perfmodel.constants import Constants
from perfmodel.workload import OpClass

_TINY = 1e-30


def saturating_efficiency(size, eff_max, half_size) -> Float[Array, ""]:
    """``η_max · x / (x + x_half)``: 0 for empty kernels, ``η_max`` for very large ones."""
    return eff_max * size / (size + half_size + _TINY)


def op_time_s(
    op: OpClass,
    consts: Constants,
    tensor_flops_per_s,
    vector_flops_per_s,
    memory_bandwidth_bytes_per_s,
) -> Float[Array, ""]:
    """Seconds for ``op.kernels`` kernels sharing ``op.flops`` and ``op.bytes`` equally.

    Args:
      op: the kernel class (tensor-core matmuls, or vector/elementwise kernels).
      consts: efficiency curves and the per-kernel overhead.
      tensor_flops_per_s: peak of the matrix units for the step's dtype.
      vector_flops_per_s: peak of the vector units (fp32 CUDA cores), for non-matmul kernels.
      memory_bandwidth_bytes_per_s: peak HBM bandwidth.
    """
    k = jnp.maximum(op.kernels, 1.0)
    flops_per_kernel = op.flops / k
    bytes_per_kernel = op.bytes / k
    if op.tensor:
        eta_c = saturating_efficiency(
            flops_per_kernel, consts.matmul_efficiency_max, consts.matmul_half_flops
        )
        peak = tensor_flops_per_s
    else:
        eta_c = 1.0  # vector kernels are memory-bound; their FLOPs only bound them from below
        peak = vector_flops_per_s
    eta_m = saturating_efficiency(
        bytes_per_kernel, consts.memory_efficiency_max, consts.memory_half_bytes
    )
    # guarded divisions: an empty op class (an MLP has no attention) must give 0 and a finite
    # gradient, which 0 / (0 + tiny) does not in float32
    # (the double where keeps the unselected branch's derivative finite too)
    has_flops, has_bytes = op.flops > 0, op.bytes > 0
    t_compute = jnp.where(has_flops, op.flops / jnp.where(has_flops, peak * eta_c, 1.0), 0.0)
    t_memory = jnp.where(
        has_bytes, op.bytes / jnp.where(has_bytes, memory_bandwidth_bytes_per_s * eta_m, 1.0), 0.0
    )
    return jnp.maximum(t_compute, t_memory) + op.kernels * consts.kernel_overhead_s
