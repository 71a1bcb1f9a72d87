"""What a low-precision recipe costs beside its GEMMs: cast kernels, scales, amax reductions.

Contract: :func:`stack_recipe` maps a stack's static :class:`~perfmodel.specs.choices.
Fp8Recipe` (and whether the dtype is FP4) to a :class:`RecipeCost` of plain numbers, so the
step function branches on the recipe in Python and compiles only its terms (STYLE rule 18);
the step terms read the recipe only through it.
The bytes are per element of a quantized GEMM input, counted from each recipe's kernels:

- ``delayed`` (Transformer Engine ``DelayedScaling``): one fused cast-transpose reads the
  16-bit tensor once and writes the FP8 copy and its transpose (2 + 1 + 1 bytes); the scale
  comes from the amax history, and the amaxes of every tensor are all-reduced over the amax
  group once per forward and once per backward (TE ``reduce_and_update_fp8_tensors`` at the
  ``fp8_autocast`` exit);
- ``tensorwise`` (TE ``Float8CurrentScaling``, torchao tensorwise): an amax pass before the
  cast (2 more bytes read, a second kernel); with sequence parallelism the amax of each
  all-gathered input is all-reduced over the TP group before quantizing (TE's
  ``amax_reduction_group``);
- ``rowwise`` (torchao ``Float8Linear`` rowwise, torchtitan's default): the input is scaled
  per row for the forward GEMM and per column for the weight gradient, each an amax pass and a
  cast (2 × (2 + 2 + 1) bytes, 4 kernels), the weights are cast the same way on every
  microbatch (no cached FP8 weights), and every collective stays 16-bit (torchtitan
  ``float8.md``: "all distributed communication is done in high precision");
- ``blockwise`` (TE ``Float8BlockScaling``, DeepSeek-V3 §3.3: 1×128 activation and 128×128
  weight tiles): one kernel writes the row- and column-wise copies with an fp32 scale per 128
  elements (2 + 2 + 2·4/128 bytes), no amax reduction;
- ``mxfp8`` (TE ``MXFP8BlockScaling``, OCP Microscaling v1.0): the same with an 8-bit
  exponent scale per 32 elements (2 + 2 + 2·1/32 bytes);
- FP4, NVFP4 (TE ``NVFP4BlockScaling``): 16-element blocks of 4-bit values with an E4M3
  scale, under a per-tensor fp32 scale from the current amax (an amax pass, reduced over TP
  with sequence parallelism like ``tensorwise``), row- and column-wise copies (2 + 2 +
  2·(0.5 + 1/16) bytes; the random Hadamard transform of the weight-gradient inputs is fused
  into the cast); MXFP4 (FP4 under the ``mxfp8`` recipe): 32-element blocks, E8M0 scales,
  no amax (2 + 2·(0.5 + 1/32) bytes).

TP all-gathers carry the quantized bytes (the value and its block scales) where the framework
quantizes before gathering (TE's ``gather_along_first_dim`` for FP8, block and MX tensors;
torchao's float8 tensor parallelism for tensorwise), 16-bit ones for ``rowwise`` and for FP4
(neither framework gathers FP4 activations).
"""

from __future__ import annotations

from typing import NamedTuple

from perfmodel.specs.choices import Fp8Recipe


class RecipeCost(NamedTuple):
    """Costs of one recipe beside its GEMMs (plain numbers; ``None``: none)."""

    cast_bytes: float  # HBM bytes per quantized element (reads, writes, scales)
    cast_kernels: float  # kernels per quantized tensor
    gather_bytes: float | None  # bytes per element of a TP all-gather; None: 16-bit
    weight_bytes: float | None  # bytes per parameter of the low-precision weight copy
    dynamic_weights: bool  # weights re-quantized on every microbatch
    amax_per_pass: bool  # amax buffers all-reduced over the amax group, forward and backward
    amax_per_gather: bool  # each all-gathered input's amax all-reduced over TP first
    block_scaled: bool = False  # per-row or per-block scales: the GEMMs' own efficiency ratio


_FP8 = {
    Fp8Recipe.DELAYED: RecipeCost(4.0, 1.0, 1.0, 1.0, False, True, False),
    Fp8Recipe.TENSORWISE: RecipeCost(6.0, 2.0, 1.0, 1.0, False, False, True),
    Fp8Recipe.ROWWISE: RecipeCost(10.0, 4.0, None, None, True, False, False, True),
    Fp8Recipe.BLOCKWISE: RecipeCost(4.0 + 8.0 / 128.0, 1.0, 1.0 + 4.0 / 128.0, 1.0 + 4.0 / 128.0,
                                    False, False, False, True),
    Fp8Recipe.MXFP8: RecipeCost(4.0 + 2.0 / 32.0, 1.0, 1.0 + 1.0 / 32.0, 1.0 + 1.0 / 32.0,
                                False, False, False, True),
}  # fmt: skip
_NVFP4 = RecipeCost(2.0 + 2.0 + 2.0 * (0.5 + 1.0 / 16.0), 2.0, None, 0.5 + 1.0 / 16.0,
                    False, False, True)  # fmt: skip
_MXFP4 = RecipeCost(2.0 + 2.0 * (0.5 + 1.0 / 32.0), 1.0, None, 0.5 + 1.0 / 32.0,
                    False, False, False)  # fmt: skip


def recipe_costs(recipe: Fp8Recipe, fp4: bool = False) -> RecipeCost:
    """The :class:`RecipeCost` of an FP8 recipe, or of FP4 under it (NVFP4; MXFP4 under
    ``mxfp8``; ``rowwise`` FP4 casts like ``rowwise`` FP8 with half the bytes written)."""
    recipe = Fp8Recipe(recipe)
    if not fp4:
        return _FP8[recipe]
    if recipe == Fp8Recipe.MXFP8:
        return _MXFP4
    if recipe == Fp8Recipe.ROWWISE:
        return _FP8[recipe]._replace(cast_bytes=9.0)
    return _NVFP4


def stack_recipe(stack, fp4: bool = False) -> RecipeCost:
    """:func:`recipe_costs` of a :class:`~perfmodel.specs.stack.Stack`'s FP8 recipe."""
    return recipe_costs(stack.fp8_recipe, fp4)
