"""A caller's own defaults under a stack preset (with_caller_defaults): the recipe's choices win
over the caller's, the user's knobs over both."""

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
