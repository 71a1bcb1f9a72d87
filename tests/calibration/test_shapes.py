"""A preset's shape to measure (calibration.measured_shape): the preset's dimensions by hand,
overrides, the FFN width scaled with the hidden size, and dimensions an MLP has not."""

from __future__ import annotations

import pytest

from calibration import measured_shape
from perfmodel import load_model, mlp_from_params
from simbase.errors import AisimError


def test_a_transformer_keeps_its_preset_dimensions_and_scales_its_ffn():
    spec = load_model("gpt2").spec
    s = measured_shape(spec)
    assert (s.kind, s.num_layers, s.hidden_size, s.num_heads) == ("transformer", 12, 768, 12)
    assert s.ffn_hidden_size == 3072 and s.seq_len == 1024 and s.vocab_size == int(spec.vocab_size)
    small = measured_shape(spec, num_layers=2, hidden_size=64, num_heads=4, seq_len=32)
    assert (small.num_layers, small.hidden_size, small.num_heads, small.num_kv_heads) == (
        2,
        64,
        4,
        4,
    )
    assert small.ffn_hidden_size == 256 and small.seq_len == 32  # 4x the hidden size, as gpt2
    assert measured_shape(spec, ffn_hidden_size=100).ffn_hidden_size == 100


def test_an_mlp_is_bias_free_and_refuses_transformer_dimensions():
    spec = mlp_from_params("20K").spec
    s = measured_shape(spec, num_layers=3)
    assert (s.kind, s.num_layers, s.bias) == ("mlp", 3, False)
    assert s.hidden_size == int(round(float(spec.hidden_size)))
    for field in ("num_heads", "seq_len", "vocab_size", "ffn_hidden_size"):
        with pytest.raises(AisimError) as e:
            measured_shape(spec, **{field: 8})
        assert e.value.field == field and e.value.value == 8
