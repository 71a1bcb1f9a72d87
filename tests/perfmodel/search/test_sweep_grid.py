"""A grid's restrictions as people type them (perfmodel.search.sweep_grid.grid_lists): integer
series, on/off/both switches, words as typed, and errors naming the knob."""

from __future__ import annotations

import pytest

from perfmodel.search.sweep_grid import grid_lists
from simbase.errors import AisimError


def test_integers_continue_a_series_and_repeated_options_join():
    got = grid_lists({"num_gpus": "64,128,...,1024", "tp": ["1,2", "8"]})
    assert got == {"num_gpus": [64, 128, 256, 512, 1024], "tp": [1, 2, 8]}


def test_switches_take_on_off_or_both_and_words_stay_as_typed():
    got = grid_lists({"sequence_parallel": "both", "dp_overlap": "off", "recompute": "full,none"})
    assert got == {
        "sequence_parallel": [False, True],
        "dp_overlap": [False],
        "recompute": ["full", "none"],
    }
    assert grid_lists({"tp": ","}) == {}  # nothing listed: not restricted


@pytest.mark.parametrize(("knobs", "field"), [({"tp": "0"}, "tp"), ({"eager": "maybe"}, "eager")])
def test_a_value_that_does_not_parse_names_its_knob(knobs, field):
    with pytest.raises(AisimError) as e:
        grid_lists(knobs)
    assert e.value.field == field
