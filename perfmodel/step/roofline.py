"""Compute time of one class of kernels: a roofline with smooth, size-dependent efficiencies.

An op takes ``max(FLOPs / (peak · η_c · q), bytes / (bandwidth · η_m))`` plus a launch overhead
per kernel (Williams, Waterman & Patterson 2009, the roofline model). The efficiencies rise
smoothly with the work per kernel, ``η(x) = η_max · x / (x + x_half)``, so small kernels are
slower per FLOP than large ones; calibration fits ``η_max`` and ``x_half``. ``q`` is the GEMMs'
tile and wave quantization on the device (:func:`wave_efficiency`, NVIDIA's "Matrix
Multiplication Background User's Guide"): piecewise constant in the shapes (a ``ceil`` of tile
and wave counts, whose derivative is zero), so the step stays differentiable in every
calibrated constant, and equal to 1 where the device's SM count is not given.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jaxtyping import Array, Float

from perfmodel.specs.constants import Constants
from perfmodel.specs.hardware import HardwareSpec
from perfmodel.step.select import where
from perfmodel.step.workload import Gemm, OpClass

_TINY = 1e-30


def tile_wave_efficiency(m, n, batch, sm_count, tile_m, tile_n) -> Float[Array, ""]:
    """Useful share of the tile-slots a GEMM's output grid occupies (NVIDIA, "Matrix
    Multiplication Background User's Guide", tile and wave quantization).

    The ``m×n`` output (``batch`` times) is cut into ``tile_m×tile_n`` tiles, rounded up along
    each side (tile quantization), and the ``T`` tiles run ``sm_count`` at a time: a GEMM of more
    than one wave takes ``ceil(T/S)`` full waves (wave quantization). One of a single partial
    wave is left to the size-dependent efficiency (:func:`saturating_efficiency`), as cuBLAS
    splits small problems along ``k`` to fill the SMs.

    Args:
      m, n: output rows and columns.
      batch: independent problems of that shape in one launch.
      sm_count: streaming multiprocessors (one tile each at a time).
      tile_m, tile_n: the output tile.

    Returns:
      ``m·n·batch / (waves · S · tile_m · tile_n)`` in (0, 1], with ``waves = ceil(T/S)`` when
      ``T > S`` and ``T/S`` otherwise.
    """
    tiles = GemmTiles(sm_count, tile_m, tile_n)
    return 1.0 / tiles.inverse(m, n, batch, tiles.rows(m), tiles.cols(n))


class GemmTiles:
    """Tile counts of a step's GEMM dimensions on one device, each counted once: the tokens,
    the hidden size and the projections recur in many GEMMs and passes (dimensions are
    positive: an op class without work has no GEMM shapes)."""

    def __init__(self, sm_count, tile_m, tile_n, weight=1.0):
        self.weight = weight  # the share of idle slots paid (``wave_quantization_weight``)
        self.modelled = sm_count > 0
        self.sm = jnp.maximum(sm_count, 1.0)
        self.tile_m, self.tile_n = tile_m, tile_n
        self.wave = tile_m * tile_n * self.sm  # output elements of one full wave
        self._memo: dict = {}

    def _count(self, x, tile, side):
        key = (id(x), side)
        if key not in self._memo:  # x is kept with its count, so its id stays its own
            self._memo[key] = (x, jnp.ceil(x / tile))
        return self._memo[key][1]

    def rows(self, x):
        return self._count(x, self.tile_m, "m")

    def cols(self, x):
        return self._count(x, self.tile_n, "n")

    def inverse(self, m, n, batch, rows, cols):
        """``1 / q`` of an ``m×n`` output (``batch`` times) of ``rows × cols`` tiles."""
        tiles = rows * cols if batch is None else batch * rows * cols
        waves = tiles / self.sm
        run = where(waves > 1.0, jnp.ceil(waves), waves)
        useful = m * n
        return self.wave * run / (useful if batch is None else useful * batch)

    def gemm_inverse(self, g: Gemm):
        """``share / q`` of a :class:`~perfmodel.step.workload.Gemm` over a step: a weight GEMM's
        forward (``m×n``), input-gradient (``m×k``) and weight-gradient (``k×n``) outputs each
        take a third of the FLOPs, so their ``1/q`` average; a batched kernel (``n = 0``: one
        tile wide) has one grid."""
        share = g.share
        if not g.training:
            return share * self.inverse(g.m, self.tile_n, g.batch, self.rows(g.m), 1.0)
        fwd = self.inverse(g.m, g.n, g.batch, self.rows(g.m), self.cols(g.n))
        dgrad = self.inverse(g.m, g.k, g.batch, self.rows(g.m), self.cols(g.k))
        wgrad = self.inverse(g.k, g.n, g.batch, self.rows(g.k), self.cols(g.n))
        return (share / 3.0) * (fwd + dgrad + wgrad)


def gemm_tiles(hw: HardwareSpec, weight=1.0) -> GemmTiles:
    """The :class:`GemmTiles` of a device (one per step, shared by its op classes), paying
    ``weight`` of the idle slots (the calibrated ``wave_quantization_weight``)."""
    return GemmTiles(hw.sm_count, hw.gemm_tile_m, hw.gemm_tile_n, weight)


def quantize_ops(ops, hw: HardwareSpec, tiles: GemmTiles | None = None) -> list[OpClass]:
    """The op classes with their GEMMs' tile and wave quantization found on ``hw``: each
    class's efficiency ``q`` is the FLOP-weighted harmonic mean of its GEMMs'
    (:func:`tile_wave_efficiency` over a step's passes), of whose idle share the class pays
    ``λ`` (the tiles' ``weight``): ``1 / (1 + λ·(1/q - 1))``; 1 where the device has no SM
    count. A class without GEMM shapes is returned as it is; the shapes are dropped once used."""
    tiles = gemm_tiles(hw) if tiles is None else tiles
    out = []
    for op in ops:
        if not op.tensor or not op.gemms:
            out.append(op)
            continue
        inv = sum(tiles.gemm_inverse(g) for g in op.gemms)
        q = where(tiles.modelled, 1.0 / (1.0 + tiles.weight * (inv - 1.0)), 1.0)
        out.append(dataclasses.replace(op, gemms=(), shape_efficiency=q))
    return out


def quantized(op: OpClass, hw: HardwareSpec, tiles: GemmTiles | None = None) -> OpClass:
    """One op class through :func:`quantize_ops`."""
    return quantize_ops([op], hw, tiles)[0]


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
        eta_c = op.shape_efficiency * saturating_efficiency(
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
    t_compute = where(has_flops, op.flops / where(has_flops, peak * eta_c, 1.0), 0.0)
    t_memory = where(
        has_bytes, op.bytes / where(has_bytes, memory_bandwidth_bytes_per_s * eta_m, 1.0), 0.0
    )
    return jnp.maximum(t_compute, t_memory) + op.kernels * consts.kernel_overhead_s
