"""Preset names as people write them (``perfmodel.specs.names``): model cards, Hugging Face
repository ids, the marketing names of GPUs and the frameworks' own names name the shipped
presets, and no name can mean two presets."""

import json
from pathlib import Path

import pytest

from calibration.logs.rows import check_overrides
from calibration.measurements import load_measurements
from perfmodel.specs.hardware import hardware_preset_name, load_hardware
from perfmodel.specs.model import load_model, model_preset_name
from perfmodel.specs.names import normalise, preset_name
from perfmodel.specs.stack_preset import load_stack, stack_aliases, stack_preset_name
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
    [
        ("H100", "h100-sxm"),
        ("H100 SXM5 80GB", "h100-sxm"),
        ("GB200-NVL72", "gb200"),
        # the names nvidia-smi prints
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("Tesla V100-SXM2-32GB", "v100-32gb"),
    ],
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
    # a brand word alone, or a device aisim has no preset for, names nothing
    assert hardware_preset_name("NVIDIA") is None
    assert hardware_preset_name("NVIDIA H100 PCIe") is None


@pytest.mark.parametrize(
    ("written", "stack"),
    [
        ("megatron-core", "megatron-core"),
        ("NeMo", "megatron-core@nemo"),
        ("Megatron-Bridge", "megatron-core@bridge"),
        ("Megatron-LM", "megatron-core"),
        ("FSDP2", "pytorch-fsdp"),
        ("accelerate+fsdp", "pytorch-fsdp"),
        ("llm-foundry", "pytorch-fsdp@llm-foundry"),
        ("megatron-deepspeed", "deepspeed@megatron-deepspeed"),
        ("hf-trainer+deepspeed", "deepspeed"),
        ("torchtitan@2024-12", "torchtitan@2024-12"),
    ],
)
def test_stacks_answer_to_their_frameworks_names(written, stack):
    assert stack_preset_name(written) == stack
    assert load_stack(written).name == stack


def test_a_framework_name_never_names_another_stacks_preset():
    # each stack file's aliases and covered frameworks name that stack or one of its variants;
    # a bare version ("2024-12") or a front end that runs either stack ("accelerate") names none
    for path in sorted((PROFILES / "stacks").glob("*.json")):
        doc = json.loads(path.read_text())
        written = [*doc.get("aliases", []), *doc["covers"]]
        written += [a for v in doc["variants"].values() for a in v.get("aliases", [])]
        for w in written:
            assert stack_preset_name(w).partition("@")[0] == path.stem, w
    assert stack_preset_name("2024-12") is None and stack_preset_name("accelerate") is None
    assert stack_aliases()["megatron-core@nemo"] == ["nemo", "nemo-2", "nemo-launcher"]


def test_log_import_and_measurement_files_keep_the_presets_own_stack_name(tmp_path):
    assert check_overrides({"stack": "titan"}, ["stack"]) == {"stack": "torchtitan"}
    p = tmp_path / "m.csv"
    p.write_text("model,hardware,stack,num_gpus,tp,pp,global_batch_size,step_time_s\n"
                 "llama3-8b,h100-sxm,NeMo,8,1,1,64,5.0\n")  # fmt: skip
    assert load_measurements(p)["stack"].tolist() == ["megatron-core@nemo"]
