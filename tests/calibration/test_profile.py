"""A run's constants from a calibrated profile or its stack (calibration.run_constants), and the
fitted-constants table of a fit: the pieces they are made of, and errors as data."""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import pytest

from calibration import MeasurementFit, run_constants
from perfmodel import load_hardware, load_stack, stack_constants
from simbase.errors import AisimError


def _profile(tmp_path, hardware="a100-80gb", efficiency=0.5):
    path = tmp_path / "p.json"
    doc = {"schema": "aisim.profile/1", "hardware": hardware,
           "constants": {"matmul_efficiency_max": efficiency}}  # fmt: skip
    path.write_text(json.dumps(doc))
    return path


def test_without_a_profile_a_run_takes_its_stack_s_constants():
    hw = load_hardware("h100-sxm")
    for stack in (None, load_stack("megatron-core", hw)):
        got, want = run_constants(hw, None, stack), stack_constants(stack, hw)
        assert got.status == want.status and got.constants == want.constants


def test_a_profile_s_constants_go_over_the_preset_s(tmp_path):
    hw = load_hardware("a100-80gb")
    got = run_constants(hw, _profile(tmp_path), load_stack("megatron-core", hw))
    assert got.status == "profile" and got.covariance is None  # this profile stores none
    assert float(got.constants.matmul_efficiency_max) == pytest.approx(0.5)
    assert float(got.constants.memory_efficiency_max) == float(hw.constants.memory_efficiency_max)


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [("matmul_efficiency_max", 7.0, "a fraction in (0, 1]"),
     ("kernel_overhead_s", 1e30, "seconds from 0 to 60"),
     ("matmul_half_flops", math.inf, "a number from 0 to 1e+15")],
)  # fmt: skip
def test_a_constant_no_device_can_have_is_refused_in_a_profile_and_a_stack_file(
    tmp_path, name, value, expected
):
    # an efficiency of 7 or a kernel overhead of 1e30 s gave a step time of 1e35 s (issue 29)
    hw = load_hardware("h100-sxm")
    doc = {"schema": "aisim.profile/1", "hardware": "h100-sxm", "constants": {name: value}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(AisimError) as e:
        run_constants(hw, path)
    assert f"'constants.{name}'" in str(e.value) and expected in str(e.value)
    stack = json.loads(Path(load_stack("torchtitan").where).read_text())
    stack["constants"]["h100-sxm"]["values"][name] = value
    (tmp_path / "s.json").write_text(json.dumps(stack))
    with pytest.raises(AisimError) as e:
        stack_constants(load_stack(str(tmp_path / "s.json"), hw), hw)
    assert f"'constants.h100-sxm.values.{name}'" in str(e.value) and expected in str(e.value)


def test_a_profile_of_other_hardware_is_refused_with_the_field_to_change(tmp_path):
    with pytest.raises(AisimError) as e:
        run_constants(load_hardware("h100-sxm"), _profile(tmp_path))
    assert e.value.field == "hardware" and e.value.hint == "pass {hardware} a100-80gb"


def test_constants_table_has_one_row_per_free_constant_and_nan_for_no_stddev():
    result = types.SimpleNamespace(free=("a", "b"), values={"a": 1.0, "b": 2.0},
                                   stddev={"a": 0.1, "b": None})  # fmt: skip
    fit = MeasurementFit(result, None, (), "a100-80gb", "", 0)
    t = fit.constants_table()
    assert t["constant"].tolist() == ["a", "b"] and t["value"].tolist() == [1.0, 2.0]
    assert t["stddev"][0] == 0.1 and math.isnan(t["stddev"][1])
