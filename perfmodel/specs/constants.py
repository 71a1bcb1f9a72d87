"""The model's calibratable constants: efficiencies, overheads and link behaviour (a pytree).

Every field is an array leaf so that ``calibration`` can differentiate through it, and the grid
can be evaluated under a calibrated profile unchanged. Defaults come from each hardware preset's
``constants`` block; a calibrated profile (written by :func:`calibration.fit`) overrides them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from perfmodel.specs.arrays import f32
from simbase import units
from simbase.errors import bad_value

TIER_KEYS = ("intra_node", "inter_node", "wan")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Constants:
    """Efficiency and overhead constants (SI units; all leaves).

    Attributes:
      matmul_efficiency_max: asymptotic fraction of tensor peak reached by large matmuls.
      matmul_half_flops: matmul size (FLOPs per kernel) at which half of the maximum is reached;
        efficiency is ``max · F / (F + F_half)``.
      memory_efficiency_max: asymptotic fraction of HBM bandwidth reached by memory-bound kernels.
      memory_half_bytes: bytes per kernel at which memory efficiency is half of its maximum.
      kernel_overhead_s: launch and tail cost per kernel.
      link_bandwidth_efficiency: achieved / line-rate bandwidth per tier (intra, inter, wan).
      link_latency_s: the alpha of each tier.
      dp_overlap_fraction: the most of the DP gradient traffic hidden behind the backward pass.
      microbatch_overhead_s: fixed scheduling cost per microbatch (per model chunk).
      optimizer_time_factor: multiplier on the memory-bound optimizer-step time.
      fp8_matmul_efficiency_ratio: FP8 GEMMs' maximum efficiency over the 16-bit one (FP8
        kernels reach a smaller share of their doubled peak).
      attention_efficiency_ratio: a fused attention kernel's maximum efficiency over a GEMM's.
      tp_overlap_fraction: the most of the tensor-parallel traffic hidden behind GEMMs when
        ``tp_overlap`` is on.
      moe_layer_overhead_s: host-bound time of one MoE layer for one microbatch, forward and
        backward together, that no GPU work hides: the token dispatcher's device-to-host syncs
        of per-expert token counts (the all-to-all and grouped-GEMM sizes are set on the host)
        and the launches of the small routing kernels that follow each sync. A behaviour of the
        software stack: a stack preset overrides the hardware's value
        (:func:`constants_with_overrides`).
      step_overhead_s: fixed cost of one optimizer step that no kernel of the model accounts
        for: the training loop's host work between steps (data loader hand-off, learning-rate
        schedule, logging, the optimizer's launches); the gradient-norm pass and its reduction
        are priced apart (:func:`perfmodel.step.step_time.step_overhead`).
      fabric_congestion: how much a collective's inter-node bandwidth falls per doubling of
        the leaf groups it spans beyond one (:func:`perfmodel.step.collectives.
        fabric_efficiency`: ``1 / (1 + c·log2(D / D_leaf))``).
      fp8_block_scaled_gemm_ratio: a block- or row-scaled FP8 GEMM's efficiency (the
        ``rowwise``, ``blockwise`` and ``mxfp8`` recipes) over a per-tensor-scaled one's.
      fp4_matmul_efficiency_ratio: FP4 GEMMs' maximum efficiency over the 16-bit one (against
        the FP4 peak).
      wave_quantization_weight: the share of a GEMM's idle tile-slots (tile and wave
        quantization, :func:`perfmodel.step.roofline.tile_wave_efficiency`) that costs time: 1
        for one fixed tile per SM, as NVIDIA's GEMM guide measures it; less where the library
        picks smaller tiles or splits the last wave (split-K, stream-K).
    """

    matmul_efficiency_max: Float[Array, ""]
    matmul_half_flops: Float[Array, ""]
    memory_efficiency_max: Float[Array, ""]
    memory_half_bytes: Float[Array, ""]
    kernel_overhead_s: Float[Array, ""]
    link_bandwidth_efficiency: Float[Array, " tiers"]
    link_latency_s: Float[Array, " tiers"]
    dp_overlap_fraction: Float[Array, ""]
    microbatch_overhead_s: Float[Array, ""]
    optimizer_time_factor: Float[Array, ""]
    fp8_matmul_efficiency_ratio: Float[Array, ""]
    attention_efficiency_ratio: Float[Array, ""]
    tp_overlap_fraction: Float[Array, ""]
    moe_layer_overhead_s: Float[Array, ""]
    step_overhead_s: Float[Array, ""]
    fabric_congestion: Float[Array, ""]
    fp8_block_scaled_gemm_ratio: Float[Array, ""]
    fp4_matmul_efficiency_ratio: Float[Array, ""]
    wave_quantization_weight: Float[Array, ""]


# name in the JSON file -> (Constants field, scale to SI, unit for messages, upper bound)
_FILE_FIELDS = {
    "matmul_efficiency_max": ("matmul_efficiency_max", 1.0, "a fraction in (0, 1]", 1.0),
    "matmul_half_gflop": ("matmul_half_flops", units.GIGA, "GFLOP per kernel", math.inf),
    "memory_efficiency_max": ("memory_efficiency_max", 1.0, "a fraction in (0, 1]", 1.0),
    "memory_half_mib": ("memory_half_bytes", units.MIB, "MiB per kernel", math.inf),
    "kernel_overhead_us": ("kernel_overhead_s", units.US, "microseconds", math.inf),
    "dp_overlap_fraction": ("dp_overlap_fraction", 1.0, "a fraction in [0, 1]", 1.0),
    "microbatch_overhead_ms": ("microbatch_overhead_s", units.MS, "milliseconds", math.inf),
    "optimizer_time_factor": ("optimizer_time_factor", 1.0, "a positive factor", math.inf),
    "fp8_matmul_efficiency_ratio": (
        "fp8_matmul_efficiency_ratio",
        1.0,
        "a fraction in (0, 1]",
        1.0,
    ),
    "attention_efficiency_ratio": ("attention_efficiency_ratio", 1.0, "a fraction in (0, 1]", 1.0),
    "tp_overlap_fraction": ("tp_overlap_fraction", 1.0, "a fraction in [0, 1]", 1.0),
    "moe_layer_overhead_ms": ("moe_layer_overhead_s", units.MS, "milliseconds", math.inf),
    "step_overhead_ms": ("step_overhead_s", units.MS, "milliseconds", math.inf),
    "fabric_congestion": ("fabric_congestion", 1.0, "a non-negative factor", math.inf),
    "fp8_block_scaled_gemm_ratio": (
        "fp8_block_scaled_gemm_ratio",
        1.0,
        "a fraction in (0, 1]",
        1.0,
    ),
    "fp4_matmul_efficiency_ratio": (
        "fp4_matmul_efficiency_ratio",
        1.0,
        "a fraction in (0, 1]",
        1.0,
    ),
    "wave_quantization_weight": ("wave_quantization_weight", 1.0, "a fraction in [0, 1]", 1.0),
}
_DEFAULTS = {
    "matmul_efficiency_max": 0.85,
    "matmul_half_gflop": 1.0,
    "memory_efficiency_max": 0.85,
    "memory_half_mib": 1.0,
    "kernel_overhead_us": 5.0,
    "dp_overlap_fraction": 0.8,
    "microbatch_overhead_ms": 0.0,
    "optimizer_time_factor": 1.0,
    # cuBLASLt FP8 GEMMs on H100 reach about 1300-1450 of 1979 dense TFLOP/s where BF16 ones
    # reach about 700-800 of 989 (NVIDIA Transformer Engine and cuBLAS benchmarks): ~0.85
    "fp8_matmul_efficiency_ratio": 0.85,
    # FlashAttention-2 forward+backward reaches ~50-60% of the BF16 peak where GEMMs reach ~75%
    # (Dao 2023, FlashAttention-2, Fig. 5-7 on H100/A100)
    "attention_efficiency_ratio": 0.75,
    "tp_overlap_fraction": 0.6,
    # fitted (calibration.fit, this one constant free) to the six Megatron-family MoE rows on
    # H100 of calibration/data/published_runs.csv (Grok-1, DeepSeek-V3, GPT-OSS-120B, Qwen3-30B-A3B,
    # Qwen3-235B-A22B): 3.4 ± 1.2 ms; host-side, so the same on every device
    "moe_layer_overhead_ms": 3.4,
    # no per-step breakdown is published (calibration/data/hardware_facts.md (c)); 5 ms is the
    # order of a PyTorch training loop's host work between steps (optimizer and scheduler
    # launches, logging, the data loader hand-off). Calibrate with short steps.
    "step_overhead_ms": 5.0,
    # ~20% lost across a 3-tier Clos of thousands of GPUs: Meta's RoCE fabric reaches ~80% of
    # its bandwidth under training collectives (Gangidi et al., SIGCOMM 2024); Alibaba HPN
    # gained ~15% of training throughput by removing ECMP hash polarization (Qian et al.,
    # SIGCOMM 2024): 0.05 per doubling gives 0.83 at 16 leaf groups (~4,000 GPUs)
    "fabric_congestion": 0.05,
    # fitted (this one constant) to Megatron-Bridge 25.11 Llama 3 8B on 8 B200: FP8-CS 4.28 s
    # vs FP8-MX 4.44 s per step (calibration/data/published_runs.csv), with each recipe's cast
    # kernels priced apart (perfmodel.step.recipes: current scaling's extra amax pass is why
    # the GEMMs' own ratio is below the end-to-end 0.964); torchtitan's Llama 3 8B on B200,
    # MXFP8 +20.0% vs tensorwise +25.4% over bf16 (an end-to-end 0.957), agrees
    "fp8_block_scaled_gemm_ratio": 0.88,
    # NVFP4 GEMMs reach a smaller share of their doubled peak than FP8's: torchtitan's NVFP4
    # Llama 3 8B runs 30,040 tokens/s/GPU against MXFP8's 28,084 and BF16's 21,919 (B200,
    # nvfp4.md): ~7% over MXFP8 where the peak doubles
    "fp4_matmul_efficiency_ratio": 0.5,
    # half of a fixed tile's idle share: cuBLAS picks among tile shapes and splits K, so a
    # GEMM that idles 11% of its slots with 128x256 tiles (GPT-3's 2048 x 9216 on an A100's
    # 108 SMs: 5.3 waves) idles ~3% with 128x128 ones (10.7 waves) at a lower per-tile rate;
    # an estimate between the guide's fixed-tile model (1) and none (0). Calibrate it
    "wave_quantization_weight": 0.5,
}


def constants_from_dict(doc: dict[str, Any], link_latency_s, where: str) -> Constants:
    """Builds :class:`Constants` from a preset's ``constants`` block (human units, validated)."""
    values: dict[str, Any] = {}
    for key, (field, scale, unit, upper) in _FILE_FIELDS.items():
        v = doc.get(key, _DEFAULTS[key])
        if (
            isinstance(v, bool)
            or not isinstance(v, int | float)
            or not math.isfinite(v)
            or v < 0
            or v > upper
        ):
            raise bad_value(where, f"constants.{key}", v, unit)
        values[field] = f32(float(v) * scale)
    eff = doc.get("link_bandwidth_efficiency", {})
    effs = []
    for tier in TIER_KEYS:
        v = eff.get(tier, 0.8) if isinstance(eff, dict) else None
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 1:
            raise bad_value(
                where, f"constants.link_bandwidth_efficiency.{tier}", v, "a fraction in (0, 1]"
            )
        effs.append(float(v))
    values["link_bandwidth_efficiency"] = f32(effs)
    values["link_latency_s"] = f32(link_latency_s)
    return Constants(**values)


def constants_with_overrides(base: Constants, doc: Any, where: str) -> Constants:
    """``base`` with the entries of a ``constants`` block in the preset file units replaced
    (``{"moe_layer_overhead_ms": 1.2}``): how a software stack sets the constants that are its
    behaviours (the per-MoE-layer host overhead), over the hardware preset's values, while they
    stay leaves that calibration can free.

    Raises:
      AisimError: naming ``where``, an unknown key or a value out of range.
    """
    if not isinstance(doc, dict):
        raise bad_value(where, "constants", doc, "an object of constants in preset units")
    changes = {}
    for key, v in doc.items():
        if key.startswith("_"):
            continue  # a comment or a source
        if key not in _FILE_FIELDS:
            raise bad_value(where, f"constants.{key}", v, "one of " + ", ".join(_FILE_FIELDS))
        field, scale, unit, upper = _FILE_FIELDS[key]
        if (
            isinstance(v, bool)
            or not isinstance(v, int | float)
            or not math.isfinite(v)
            or v < 0
            or v > upper
        ):
            raise bad_value(where, f"constants.{key}", v, unit)
        changes[field] = f32(float(v) * scale)
    return dataclasses.replace(base, **changes) if changes else base


def constants_to_dict(c: Constants) -> dict[str, Any]:
    """Plain-float view of the constants in SI units, for reports and profiles."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(c):
        v = jnp.asarray(getattr(c, f.name))
        out[f.name] = [float(x) for x in v.tolist()] if v.ndim else float(v)
    return out


def constants_from_si_dict(d: dict[str, Any], base: Constants) -> Constants:
    """Inverse of :func:`constants_to_dict`; fields absent from ``d`` keep ``base``'s values."""
    changes = {k: jnp.asarray(v, jnp.float32) for k, v in d.items() if hasattr(base, k)}
    return dataclasses.replace(base, **changes)
