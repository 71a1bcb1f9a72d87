"""Full recomputation's peak: the kept layer inputs plus the one layer being recomputed.

During the backward of a fully recomputed layer its forward runs again and all of its
activations are live while its backward consumes them; the loss's logits were freed before the
first layer's backward, so the peak holds the larger of the two, not both.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfmodel import make_strategy
from perfmodel.specs.model import dense_layer_params, embedding_params, load_model, model_from_dict
from perfmodel.step.memory import (
    _memory_stages,
    in_flight_microbatches,
    memory_per_device,
    recompute_working_bytes,
    stage_activation_bytes,
)

TINY = json.loads((Path(__file__).parent / "fixtures" / "tiny_llama.json").read_text())


def _acts(m, **kw):
    s = make_strategy(fused_attention=True, **kw)
    return s, float(memory_per_device(m.spec, s).activations_bytes)


@pytest.mark.parametrize("pp", [2, 4])
def test_full_recompute_adds_one_unrecomputed_layer_on_a_pipeline_stage(pp):
    # no logits on the first stage of a pipeline: the peak is the kept inputs of every layer
    # of every microbatch in flight plus one layer's activations as without recomputation
    m = model_from_dict(TINY)
    kw = dict(pp=pp, num_microbatches=8, micro_batch_size=2)
    s_full, full = _acts(m, recompute="full", **kw)
    s_none, none = _acts(m, recompute="none", **kw)
    layers = TINY["num_layers"] / pp
    flight = float(in_flight_microbatches(s_none.layout, s_none.batching))
    one_layer = none / (layers * flight)
    kept = float(stage_activation_bytes(m.spec, s_full)) * flight
    # by hand: the kept input is 2 bytes of s·b·h per layer
    assert kept == pytest.approx(layers * flight * 2 * 1024 * 2 * 256)
    assert full == pytest.approx(kept + one_layer, rel=1e-6)
    assert float(recompute_working_bytes(m.spec, s_full)) == pytest.approx(one_layer, rel=1e-6)


def test_one_stage_holds_the_larger_of_the_logits_and_the_recomputed_layer():
    m = model_from_dict(TINY)
    s, full = _acts(m, recompute="full", micro_batch_size=2)
    kept = float(stage_activation_bytes(m.spec, s))
    layer = float(recompute_working_bytes(m.spec, s))
    small = 4.0 * 1024 * 2 * 1000  # fused fp32 loss: 4 bytes per logit
    assert small < layer  # a 1000-word vocabulary: the layer is the peak
    assert full == pytest.approx(kept + layer, rel=1e-6)
    _, big = _acts(m, recompute="full", micro_batch_size=2, logit_bytes=64.0)  # the most allowed
    assert 16 * small > layer  # now the logits are
    assert big == pytest.approx(kept + 16 * small, rel=1e-6)


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_nothing_is_added_without_full_recomputation(recompute):
    # every tensor the backward needs is already counted among the kept activations
    m = model_from_dict(TINY)
    s = make_strategy(pp=2, num_microbatches=4, recompute=recompute, fused_attention=True)
    assert float(recompute_working_bytes(m.spec, s)) == 0.0
    acts = float(memory_per_device(m.spec, s).activations_bytes)
    flight = float(in_flight_microbatches(s.layout, s.batching))
    assert acts == pytest.approx(float(stage_activation_bytes(m.spec, s)) * flight, rel=1e-6)


def test_uneven_split_peaks_on_the_second_stage_by_hand():
    # 10 layers on pp 4 split 2, 3, 3, 2 (Megatron-Core's uneven split): under 1F1B the first
    # stage holds 2 layers x 4 microbatches, the second 3 layers x 3, so the device peaks on
    # the second stage, with 3 layers' weights and no embedding
    m = model_from_dict(dict(TINY, num_layers=10)).spec
    kw = dict(fused_attention=True, recompute="none")
    one_layer = float(stage_activation_bytes(m, make_strategy(**kw))) / 10
    s = make_strategy(pp=4, num_microbatches=8, **kw)
    out = memory_per_device(m, s)
    layer_w = float(dense_layer_params(m)) * 2  # bf16 weights, no ZeRO
    assert float(out.activations_bytes) == pytest.approx(3 * 3 * one_layer, rel=1e-6)
    assert float(out.weights_bytes) == pytest.approx(3 * layer_w, rel=1e-6)
    # divisible: 12 layers, 3 a stage: the first stage's 4 in flight and its embedding win
    m12 = model_from_dict(dict(TINY, num_layers=12)).spec
    even = memory_per_device(m12, s)
    assert float(even.activations_bytes) == pytest.approx(3 * 4 * one_layer, rel=1e-6)
    embed = float(embedding_params(m12)) * 2
    assert embed == 1000 * 256 * 2
    assert float(even.weights_bytes) == pytest.approx(3 * layer_w + embed, rel=1e-6)


def test_the_dense_layers_of_a_moe_model_sit_on_the_first_stage():
    dsv3 = load_model("deepseek-v3").spec
    first, second = _memory_stages(dsv3, make_strategy(pp=8).layout)
    # 61 layers on pp 8: 7, 6 x 8, 6; the first stage's 7 are the 3 dense layers and 4 MoE
    assert [float(first.layers), float(first.moe_layers)] == [7.0, 4.0]
    assert [float(second.layers), float(second.moe_layers)] == [8.0, 8.0]
    # the second rank holds one microbatch fewer under 1F1B, two chunks fewer interleaved
    s = make_strategy(pp=8, num_microbatches=16)
    assert float(in_flight_microbatches(s.layout, s.batching, 1)) == 7.0
    s = make_strategy(pp=8, num_microbatches=16, schedule="interleaved", interleave=4)
    assert float(in_flight_microbatches(s.layout, s.batching, 0)) == 8 + 7 / 4
    assert float(in_flight_microbatches(s.layout, s.batching, 1)) == 8 + 5 / 4
