"""Preset names as people write them (``perfmodel.specs.names``): model cards, Hugging Face
repository ids and the marketing names of GPUs name the shipped presets, and no name can mean
two presets."""

import json
from pathlib import Path

import pytest

from perfmodel.specs.hardware import hardware_preset_name, load_hardware
from perfmodel.specs.model import load_model, model_preset_name
from perfmodel.specs.names import normalise, preset_name
from simbase.errors import AisimError

PROFILES = Path(__file__).resolve().parents[3] / "perfmodel" / "profiles"


@pytest.mark.parametrize(
    ("written", "preset"),
    [
        ("llama3-70b", "llama3-70b"),
        ("Llama-3.1-70B", "llama3-70b"),
        ("meta-llama/Llama-3.3-70B-Instruct", "llama3-70b"),
        ("meta-llama/Meta-Llama-3-8B", "llama3-8b"),
        ("meta-llama/Llama-2-7b-hf", "llama2-7b"),
        ("GPT3-175B", "gpt3-175b"),
        ("GPT-3", "gpt3-175b"),
        ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"),
        ("deepseek-ai/DeepSeek-V3-Base", "deepseek-v3"),
        ("Qwen/Qwen3-235B-A22B", "qwen3-235b-a22b"),
    ],
)
def test_models_answer_to_the_names_people_write(written, preset):
    assert model_preset_name(written) == preset
    assert load_model(written).name == preset


@pytest.mark.parametrize(
    ("written", "preset"),
    [("H100", "h100-sxm"), ("H100 SXM5 80GB", "h100-sxm"), ("GB200-NVL72", "gb200")],
)
def test_hardware_answers_to_the_names_people_write(written, preset):
    assert hardware_preset_name(written) == preset
    assert load_hardware(written).name == preset


def test_normalise_keeps_the_dots_that_tell_models_apart():
    # Qwen2-57B-A14B is not Qwen2.5-7B; Llama 3.1 8B is not a "Llama 3 18B"
    assert normalise("qwen2.5-7b") != normalise("Qwen2-57B")
    assert normalise("Llama-3.1-8B") == "llama3.18b" != normalise("llama3-18b")
    # a variant word is dropped only at the end, and never the whole name
    assert normalise("Llama-2-7b-chat-hf") == "llama27b"
    assert normalise("base") == "base"


@pytest.mark.parametrize("kind", ["models", "hardware"])
def test_no_name_or_alias_means_two_presets(kind):
    folder = PROFILES / kind
    seen: dict[str, str] = {}
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text())
        assert doc["name"] == path.stem
        for written in [path.stem, *doc.get("aliases", [])]:
            key = normalise(written)
            assert seen.setdefault(key, path.stem) == path.stem, (written, seen[key])
            assert preset_name(written, folder) == path.stem


def test_an_unknown_name_still_lists_the_closest_presets():
    with pytest.raises(AisimError, match=r"unknown model preset 'llama3\.2-70b'; did you mean"):
        load_model("llama3.2-70b")
    assert model_preset_name("A100") is None and hardware_preset_name("A100") is None
