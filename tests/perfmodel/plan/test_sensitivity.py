"""What limits a run: elasticities against finite differences, and the capacity answer against
the grid itself (`aisim perf sensitivity` through the CLI: tests/aisim/test_perf_sensitivity.py)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from perfmodel import estimate, load_hardware, step_time, sweep
from perfmodel.plan.sensitivity import (
    HBM_TIERS_GIB,
    capacity_answer,
    elasticities,
    neighbour_tiers,
    smallest_capacity_bytes,
)
from simbase import units

KNOBS = dict(num_gpus=64, tp=4, pp=4, global_batch=256, recompute="selective", zero_stage=1)
# The finite differences step ln x by ±H. The step time is a roofline, a max of compute and
# memory time per op class, so it has kinks, where jax.grad gives the slope of one side and a
# central difference across the kink averages both. Here the unfused attention core (Q·Kᵀ and
# A·V, selective recompute) is memory-bound by about 3% (compute/memory 0.97 with its batched
# GEMMs' wave quantization, q 0.85): 3% less peak FLOP/s or matmul efficiency makes it
# compute-bound. A step of ±5% crossed that kink (slopes -0.66 and -0.59 on either side); ±1%
# stays on one side, and float32's rounding of ln t (about 1e-7) over 2H = 0.02 is 1e-5.
H = 0.01


@pytest.fixture(scope="module")
def est():
    return estimate("gpt3-13b", "a100-80gb", **KNOBS)


def _log_t(est, hw=None, c=None):
    hw = est.hardware.spec if hw is None else hw
    c = est.hardware.constants if c is None else c
    out = step_time(est.model.spec, hw, c, est.strategy)
    return float(np.log(np.float64(out.step_time_s)))


def _fd_hw(est, field, index=None, h=H):
    """Central difference of ln t in ln x for one HardwareSpec leaf (entry ``index``)."""
    spec = est.hardware.spec
    v = jnp.asarray(getattr(spec, field))

    def at(f):
        nv = v * f if index is None else v.at[index].multiply(f)
        return _log_t(est, hw=dataclasses.replace(spec, **{field: nv}))

    return (at(np.exp(h)) - at(np.exp(-h))) / (2 * h)


def _fd_const(est, field, index=None, h=H):
    c = est.hardware.constants
    v = jnp.asarray(getattr(c, field))

    def at(f):
        nv = v * f if index is None else v.at[index].multiply(f)
        return _log_t(est, c=dataclasses.replace(c, **{field: nv}))

    return (at(np.exp(h)) - at(np.exp(-h))) / (2 * h)


@pytest.mark.slow  # compiles a Jacobian and finite differences
def test_hardware_elasticities_match_finite_differences(est):
    s = elasticities(est.model, est.hardware, est.hardware.constants, est.strategy)
    e = s.hardware
    assert e["peak_tflops.bf16"] == pytest.approx(_fd_hw(est, "peak_flops_per_s", 2), abs=0.01)
    assert e["memory_bandwidth_gb_per_s"] == pytest.approx(
        _fd_hw(est, "memory_bandwidth_bytes_per_s"), abs=0.01
    )
    for i, tier in enumerate(("intra_node", "inter_node")):
        assert e[f"links.{tier}.bandwidth_gb_per_s"] == pytest.approx(
            _fd_hw(est, "link_bandwidth_bytes_per_s", i), abs=0.01
        )
        assert e[f"links.{tier}.latency_us"] == pytest.approx(
            _fd_const(est, "link_latency_s", i), abs=0.01
        )
    assert e["memory_capacity_gib"] == 0.0
    # a faster anything never makes a step slower
    assert all(v <= 1e-9 for k, v in e.items() if "bandwidth" in k or "peak" in k)
    assert s.bound_by == max(e, key=lambda k: abs(e[k]))
    assert s.bound_by_text.startswith("this run is bound by")


@pytest.mark.slow  # a several-second compile (pyproject's markers)
def test_constant_elasticities_match_finite_differences(est):
    s = elasticities(est.model, est.hardware, est.hardware.constants, est.strategy)
    c = s.constants
    for name in ("matmul_efficiency_max", "memory_efficiency_max", "kernel_overhead_s"):
        assert c[name] == pytest.approx(_fd_const(est, name), abs=0.01), name
    assert c["link_bandwidth_efficiency.inter_node"] == pytest.approx(
        _fd_const(est, "link_bandwidth_efficiency", 1), abs=0.01
    )


def test_smallest_capacity_is_the_memory_the_grid_reports(est):
    need = smallest_capacity_bytes(est.model, est.hardware, est.hardware.constants, est.strategy)
    # a strategy fits when its memory plus the device's runtime reserve (CUDA context, NCCL
    # buffers, fragmentation: 3 GiB on the a100-80gb preset) is within the capacity
    reserve = float(est.hardware.spec.memory_reserve_bytes)
    assert reserve == pytest.approx(3.0 * units.GIB)
    assert need == pytest.approx(float(est.breakdown.memory_per_device_bytes) + reserve, rel=1e-5)
    # the grid agrees: the same strategy is feasible just above and infeasible just below
    for factor, fits in ((1.001, True), (0.999, False)):
        hw = est.hardware.replace_spec(memory_capacity_bytes=need * factor)
        assert bool(estimate(est.model, hw, **KNOBS).breakdown.feasible) is fits


def test_capacity_tiers_are_the_grid_at_those_capacities(est):
    answer = capacity_answer(est, est.hardware.constants, num_gpus=[64], global_batch=[256])
    assert neighbour_tiers(80.0) == (40.0, 96.0)
    assert answer.tiers["lower"]["capacity_gib"] == 40.0
    for name in ("lower", "higher"):
        tier = answer.tiers[name]
        hw = est.hardware.replace_spec(memory_capacity_bytes=tier["capacity_gib"] * units.GIB)
        direct = sweep("gpt3-13b", hw, num_gpus=[64], global_batch=[256], top=1).best
        assert tier["best"]["tokens_per_s"] == pytest.approx(direct["tokens_per_s"])
        reserve = float(hw.spec.memory_reserve_bytes)
        assert tier["best"]["memory"]["total_bytes"] + reserve <= tier["capacity_gib"] * units.GIB
    # the smallest capacity holds the strategy's memory and the device's runtime reserve
    reserve_gib = float(est.hardware.spec.memory_reserve_bytes) / units.GIB
    assert answer.smallest_feasible_gib == pytest.approx(
        answer.memory_per_device_gib + reserve_gib, rel=1e-5
    )


def test_tiers_are_data():
    assert list(HBM_TIERS_GIB) == sorted(HBM_TIERS_GIB)
    assert neighbour_tiers(HBM_TIERS_GIB[0])[0] is None
    assert neighbour_tiers(HBM_TIERS_GIB[-1])[1] is None
    assert load_hardware("h200").spec.memory_capacity_bytes / units.GIB == pytest.approx(131.3)


def test_distir_reads_no_hardware_number():
    est = estimate("gpt2", "a100-80gb", cost_model="distir", num_gpus=8, tp=8, pp=1,
                   global_batch=128)  # fmt: skip
    s = elasticities(est.model, est.hardware, est.hardware.constants, est.strategy, "distir")
    assert s.bound_by is None and all(v == 0.0 for v in s.hardware.values())
    assert s.bound_by_text.startswith("no hardware quantity")
