"""The preset catalogue (``aisim presets --json``) against the presets it lists: every shipped
preset once, in order, in the units people read."""

from __future__ import annotations

import math

from perfmodel import hardware_names, load_hardware, load_model, model_names, stack_names
from perfmodel.specs.catalog import hardware_rows, model_rows, stack_rows
from perfmodel.specs.stack_preset import CARRIED, load_stack
from simbase import units


def test_hardware_rows_convert_each_preset_to_human_units():
    rows = hardware_rows()
    assert [r["name"] for r in rows] == hardware_names()
    for r in rows:
        s = load_hardware(r["name"]).spec
        assert math.isclose(r["memory_gib"] * units.GIB, float(s.memory_capacity_bytes))
        assert r["gpus_per_node"] == int(s.gpus_per_node)
        price = float(s.price_per_device_hour_usd)
        assert r["price_per_device_hour_usd"] == (None if math.isnan(price) else price)
    a100 = next(r for r in rows if r["name"] == "a100-80gb")
    assert math.isclose(a100["peak_bf16_tflops"], 312.0, rel_tol=1e-6)
    assert a100["peak_fp8_tflops"] is None  # an A100 has no FP8 unit


def test_model_rows_give_transformer_dimensions_and_none_for_an_mlp():
    rows = {r["name"]: r for r in model_rows()}
    assert list(rows) == model_names()
    for name, r in rows.items():
        transformer = load_model(name).spec.kind == "transformer"
        assert (r["num_heads"] is not None) == transformer
        assert (r["vocab_size"] is not None) == transformer
    assert rows["gpt3-175b"]["num_layers"] == 96 and rows["gpt3-175b"]["params"] > 1.7e11


def test_stack_rows_list_the_fitted_hardware_and_never_the_carried_over_block():
    rows = stack_rows()
    assert [r["name"] for r in rows] == stack_names()
    for r in rows:
        preset = load_stack(r["name"])
        assert CARRIED not in r["fitted_on"]
        assert set(r["fitted_on"]) == set(preset.fitted_constants())
        for hw, fit in r["fitted_on"].items():
            assert fit["runs"] == preset.constants[hw].get("runs")
