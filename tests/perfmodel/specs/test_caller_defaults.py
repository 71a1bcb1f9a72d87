"""A caller's own defaults under a stack preset (with_caller_defaults): the recipe's choices win
over the caller's, the user's knobs over both, and a layout given replaces the caller's."""

from __future__ import annotations

from perfmodel.specs.stack_preset import load_stack, with_caller_defaults


def test_a_stack_recipe_s_default_wins_over_a_caller_s_and_the_user_over_both():
    caller = {"num_gpus": 1024, "recompute": "full"}
    preset = load_stack("megatron-core")
    recipe = {d.knob for d in preset.defaults}
    assert "recompute" in recipe and "num_gpus" not in recipe
    assert with_caller_defaults({"tp": 2}, caller, preset) == {"num_gpus": 1024, "tp": 2}
    assert with_caller_defaults({"recompute": "none"}, caller, None) == {
        "num_gpus": 1024,
        "recompute": "none",
    }


def test_a_degree_given_makes_the_callers_other_degrees_one():
    # Megatron-LM, torchtitan and DeepSpeed take a parallel degree left out as 1: a user who
    # gives pp and ep (DeepSeek-V3's layout) gets tp 1, not the caller's tp 8
    caller = {"num_gpus": 1024, "tp": 8, "pp": 8, "recompute": "full"}
    assert with_caller_defaults({"pp": 16, "ep": 64}, caller, None) == {
        "num_gpus": 1024,
        "recompute": "full",
        "pp": 16,
        "ep": 64,
    }
    # no degree given: the caller's whole layout stays
    assert with_caller_defaults({"num_gpus": 64}, caller, None) == caller | {"num_gpus": 64}
