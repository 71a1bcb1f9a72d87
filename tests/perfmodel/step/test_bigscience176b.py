"""A published tp 4 against tp 8 measurement at 176B: BigScience's BLOOM topology search.

Before training BLOOM, BigScience timed 3D topologies of the final 176B shape on 48 nodes of 8
A100-80GB (Jean Zay), Megatron-DeepSpeed with ZeRO-1, bf16, full activation checkpointing, global
batch 2048 and micro-batch 2 (bigscience-workshop/bigscience, train/tr11-176B-ml/
chronicles-prequel.md, section "Rebalancing layers", runs of 2022-02-28: NHIDDEN 14336, NLAYERS 70,
NHEADS 64, 250k vocabulary, ALiBi). Splitting each replica over tp 4 instead of tp 8 made the
iteration 19% faster:

    dp 4, tp 8, pp 12: 121.63 s per iteration, 128.92 TFLOP/s per GPU
    dp 8, tp 4, pp 12: 102.03 s per iteration, 153.68 TFLOP/s per GPU

This is the preference that makes aisim's grid best for issue 3's GPT-3 175B / 1024-GPU row a tp 4
strategy, measured at almost the same model size. The cluster differs from the a100-80gb preset (4
Omni-Path 100 Gbit/s links per node, not 8 × 200 Gbit/s InfiniBand), so only the direction is
asserted, not the size of the gap.
"""

from __future__ import annotations

import numpy as np

from perfmodel import gpt_training_flops, load_hardware, load_model, make_strategy, step_time
from perfmodel.specs.model import with_overrides

A100 = load_hardware("a100-80gb")
BLOOM = with_overrides(
    load_model("gpt3-175b"),
    num_layers=70,
    hidden_size=14336,
    num_heads=64,
    num_kv_heads=64,
    ffn_hidden_size=4 * 14336,
    vocab_size=250880,
    learned_pos_emb=0,
)
GPUS, GBS, MBS = 384, 2048, 2
# (dp, tp, pp) -> (seconds per iteration, TFLOP/s per GPU), as published
MEASURED = {(4, 8, 12): (121.63, 128.92), (8, 4, 12): (102.03, 153.68)}


def _predict(dp: int, tp: int, pp: int):
    s = make_strategy(
        dp=dp,
        tp=tp,
        pp=pp,
        micro_batch_size=MBS,
        num_microbatches=GBS // (dp * MBS),
        zero_stage=1,
        recompute="full",
        dtype="bf16",
    )
    return step_time(BLOOM.spec, A100.spec, A100.constants, s)


def test_the_transcribed_rows_are_consistent():
    # seconds and TFLOP/s are two readings of one run: their product is the same FLOPs per iteration
    work = [t * x for t, x in MEASURED.values()]
    assert np.isclose(work[0], work[1], rtol=0.002)
    # and it is eq. 3 of Narayanan et al. (the `4*2` coefficient the page says it uses) for this shape
    eq3 = float(gpt_training_flops(BLOOM.spec, GBS, 1.0))
    assert np.isclose(eq3 / (GPUS * 1e12), work[0], rtol=0.03)
    assert all(dp * tp * pp == GPUS for dp, tp, pp in MEASURED)


def test_tp4_beats_tp8_as_measured():
    pred = {key: _predict(*key) for key in MEASURED}
    t8, t4 = (float(pred[key].step_time_s) for key in ((4, 8, 12), (8, 4, 12)))
    measured = MEASURED[4, 8, 12][0] / MEASURED[8, 4, 12][0]
    assert measured > 1.15
    assert t8 > t4, (t8, t4)  # the same direction as the measurement
    for key, out in pred.items():
        assert bool(out.fits_memory), key  # both ran; the model must find both feasible
