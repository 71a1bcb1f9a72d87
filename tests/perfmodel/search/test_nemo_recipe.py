"""Published practice for issue 3's row: NVIDIA's own GPT-3 175B recipe for 128 nodes of 8 GPUs.

NVIDIA's NeMo launcher ships a GPT-3 175B training configuration for 128 nodes × 8 GPUs
(NVIDIA/NeMo-Megatron-Launcher, launcher_scripts/conf/training/gpt3/175b.yaml). Its parallel
layout moved over the years from the SC21 paper's strategy to the one aisim's grid ranks first:

    2022-06  tp 8, pp 16, mbs 1, batch 1536, full recomputation          (the paper's)
    2022-08  tp 8, pp 8,  mbs 2, batch 2048, selective, sequence parallel, distributed Adam
    2022-12  tp 8, pp 16, v 6,  mbs 1, batch 2048, selective, SP
    2023-06  tp 4, pp 8,  v 12, mbs 1, batch 2048, selective, SP, distributed Adam (commit
             d1d5454f, "Performance feature updates"); since 2024-05 without recomputation

Distributed Adam shards the optimizer states over the data-parallel group: ZeRO-1. The file is
not specific to one GPU (the 2023 change came with H100 features), so both presets are checked.
The 2024 recipe runs without recomputation. That relies on a fused attention kernel (Transformer
Engine / FlashAttention), which stores no s × s scores: with ``fused_attention`` it fits; with the
unfused kernels aisim finds it over 80 GiB, as it would be.
"""

from __future__ import annotations

import pytest

from perfmodel import load_hardware, load_model, make_strategy, step_time
from perfmodel.search import reduce as srch
from perfmodel.search.grid import enumerate_strategies
from perfmodel.specs.stack import Stack

GPT3 = load_model("gpt3-175b")
GPUS, GBS = 1024, 2048
# the 2023-06 recipe: dp = 1024 / (4·8) = 32, 2048 / 32 = 64 microbatches of 1
RECIPE = dict(
    dp=32,
    tp=4,
    pp=8,
    micro_batch_size=1,
    num_microbatches=64,
    schedule="interleaved",
    interleave=12,
    zero_stage=1,
    recompute="selective",
    sequence_parallel=True,
    gpus_per_node=8,
)


# NVIDIA's H100 runs overlap the tensor-parallel collectives with the GEMMs (Transformer
# Engine's userbuffers, NeMo's ``ub_tp_comm_overlap``); without it tp 2 beats tp 4 on H100
OVERLAP = {"a100-80gb": False, "h100-sxm": True}


def _stack(hardware):
    return Stack(tp_overlap=OVERLAP[hardware])


# How far the recipe may trail the grid's best. On the A100 the best row has the recipe's
# layout but micro-batch 2 (74.3 GiB and the 3 GiB reserve, of 80): GEMM tile and wave quantization
# (one 128x256 tile per SM, 108 SMs, half the idle slots paid) favours 4,096 token rows over
# 2,048, e.g. the forward QKV GEMM of tp 4: 16x36 = 576 tiles = 5.3 waves, run as 6 (11% idle),
# against 32x36 = 1,152 = 10.7 waves, run as 11 (3% idle), about 2.5% of the compute. Real
# cuBLAS picks among several tiles, so this likely overstates the loss of micro-batch 1; NVIDIA's
# choice also leaves memory headroom the model does not price. 3% covers that, not more.
@pytest.mark.parametrize("hardware, slack", [("a100-80gb", 0.03), ("h100-sxm", 0.04)])
def test_the_grid_finds_nvidias_recipe(hardware, slack):
    hw = load_hardware(hardware)
    recipe = {**RECIPE, "tp_overlap": OVERLAP[hardware]}
    s = GPT3.spec
    grid = enumerate_strategies(
        num_layers=int(s.num_layers),
        num_heads=int(s.num_heads),
        num_kv_heads=int(s.num_kv_heads),
        num_gpus=GPUS,
        global_batch_size=GBS,
        gpus_per_node=8,
        recompute=["selective"],
        stack=_stack(hardware),
    )
    best = srch.search(s, hw.spec, hw.constants, grid, k=1).top.iloc[0]
    # the recipe's layout: tp 4 within a node, pp 8, interleaved, SP, sharded optimizer states
    assert (best["dp"], best["tp"], best["pp"]) == (32, 4, 8)
    assert best["schedule"] == "interleaved" and bool(best["sequence_parallel"])
    assert best["zero_stage"] == 1
    # the recipe itself (v 12, micro-batch 1) fits and is within a few % of the best
    out = step_time(s, hw.spec, hw.constants, make_strategy(**recipe))
    assert bool(out.fits_memory)
    assert float(out.step_time_s) <= float(best["step_time_s"]) * (
        1 + slack
    )  # measured: 2.6%, 3.0%
    # and the paper's tp 8, pp 16 layout, with the same features, is slower than the recipe
    paper = make_strategy(
        **{**recipe, "dp": 8, "tp": 8, "pp": 16, "num_microbatches": 256, "interleave": 6}
    )
    assert float(step_time(s, hw.spec, hw.constants, paper).step_time_s) > float(out.step_time_s)


@pytest.mark.parametrize("hardware, slack", [("a100-80gb", 0.03), ("h100-sxm", 0.05)])
def test_the_2024_recipe_needs_fused_attention(hardware, slack):
    hw = load_hardware(hardware)
    s = GPT3.spec
    now = {**RECIPE, "recompute": "none", "tp_overlap": OVERLAP[hardware]}
    fused = step_time(s, hw.spec, hw.constants, make_strategy(**now, fused_attention=True))
    unfused = step_time(s, hw.spec, hw.constants, make_strategy(**now))
    assert bool(fused.fits_memory) and not bool(unfused.fits_memory)
    grid = enumerate_strategies(
        num_layers=int(s.num_layers),
        num_heads=int(s.num_heads),
        num_kv_heads=int(s.num_kv_heads),
        num_gpus=GPUS,
        global_batch_size=GBS,
        gpus_per_node=8,
        recompute=["none"],
        fused_attention=[True],
        stack=_stack(hardware),
    )
    best = srch.search(s, hw.spec, hw.constants, grid, k=1).top.iloc[0]
    assert (best["tp"], best["pp"], best["schedule"]) == (4, 8, "interleaved")
    assert float(fused.step_time_s) <= float(best["step_time_s"]) * (
        1 + slack
    )  # measured: 2.8% (the best at micro-batch 2, as above), 3.5%
