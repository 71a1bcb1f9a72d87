"""What a strategy's dtype sets: bytes per activation element and the peaks its kernels run at.

Contract: :func:`precision` reads one strategy's dtype code (a traced leaf) and the hardware's
peaks into a :class:`Precision`; FP8's and FP4's terms are compiled only when the strategy's
scope allows them (:class:`~perfmodel.specs.strategy.Scope`: its ``fp8`` covers both).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Float

from perfmodel.specs.choices import Dtype
from perfmodel.specs.hardware import HardwareSpec
from perfmodel.specs.strategy import Strategy
from perfmodel.step.select import where

# bytes per element of activations and of communicated tensors, indexed by Dtype code; fp8 and
# fp4 training keep activations and gradients in 16-bit (Micikevicius et al. 2022, FP8 formats;
# NVIDIA's NVFP4 recipe quantizes only the GEMM inputs: Transformer Engine NVFP4BlockScaling).
_ACT_BYTES = {
    Dtype.FP32: 4.0,
    Dtype.TF32: 4.0,
    Dtype.BF16: 2.0,
    Dtype.FP16: 2.0,
    Dtype.FP8: 2.0,
    Dtype.FP4: 2.0,
}
ACT_BYTES = tuple(_ACT_BYTES[d] for d in Dtype)


def activation_bytes(dtype_code) -> Float[Array, ""]:
    """Bytes per activation element of a dtype code (:data:`ACT_BYTES`)."""
    return jnp.asarray(ACT_BYTES, jnp.float32)[jnp.asarray(dtype_code).astype(jnp.int32)]


class Precision(NamedTuple):
    """What the strategy's dtype sets: bytes per activation element and the peaks."""

    act_bytes: Float[Array, ""]
    nominal_peak: Float[Array, ""]  # the peak MFU is reported against (BF16's for FP8 runs)
    linear_peak: Float[Array, ""]  # the peak weight GEMMs run at (fp32's when none listed)
    half_peak: Float[Array, ""]  # the peak 16-bit GEMMs run at (attention, logits)
    vector_peak: Float[Array, ""]  # fp32: what elementwise ops run at
    fp8: Float[Array, ""] | bool  # FP8 or FP4 linear layers (the stack's recipe); False: none
    fp4: Float[Array, ""] | bool = False  # FP4 (NVFP4/MXFP4) linear layers


def precision(hw: HardwareSpec, s: Strategy) -> Precision:
    """Activation bytes (:data:`ACT_BYTES`) and peaks of the dtype: FP8 (FP4) runs its weight
    GEMMs at the FP8 (FP4) peak and everything else at BF16's, and reports MFU against BF16's
    (the convention of Megatron-Core, torchtitan and NVIDIA's tables)."""
    dtype = s.memory.dtype.astype(jnp.int32)
    listed = hw.peak_flops_per_s[dtype]
    fp32_peak = hw.peak_flops_per_s[Dtype.FP32]
    linear = where(listed > 0, listed, fp32_peak)
    act_b = activation_bytes(dtype)
    if not s.scope.fp8:
        return Precision(act_b, listed, linear, linear, fp32_peak, False)
    bf16_peak = hw.peak_flops_per_s[Dtype.BF16]
    fp8 = s.memory.dtype >= Dtype.FP8
    return Precision(
        act_bytes=act_b,
        nominal_peak=where(fp8 & (listed > 0), bf16_peak, listed),
        linear_peak=linear,
        half_peak=where(fp8, bf16_peak, linear),
        vector_peak=fp32_peak,
        fp8=fp8,
        fp4=s.memory.dtype == Dtype.FP4,
    )
