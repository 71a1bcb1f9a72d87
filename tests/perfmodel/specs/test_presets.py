"""The model and hardware presets of issue 15 against their published numbers.

Parameter counts are recomputed here from each JSON file's fields with an independent hand
formula (embedding, per-layer attention: grouped-query or DeepSeek's multi-head latent attention,
dense or mixture-of-experts MLP with router and shared experts, norms, output head), so a wrong
field in a preset shows up as a total or activated count that misses the model card. The only
uses of perfmodel are that every preset loads.
"""

import json
from pathlib import Path

import pytest

from perfmodel.specs.choices import Dtype
from perfmodel.specs.hardware import load_hardware
from perfmodel.specs.model import load_model

PROFILES = Path(__file__).resolve().parents[3] / "perfmodel" / "profiles"
NEW_MODELS = [
    "llama3-405b",
    "mixtral-8x7b",
    "mixtral-8x22b",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
    "deepseek-v3",
    "gpt-oss-120b",
    "gpt-oss-20b",
    "nemotron4-15b",
    "nemotron4-340b",
    "grok-1",
    "mistral-7b",
    "qwen2.5-7b",
    "qwen2.5-14b",
    "qwen2.5-32b",
    "qwen2.5-72b",
    "qwen3-8b",
    "qwen3-14b",
    "qwen3-32b",
    "llama3.2-1b",
    "llama3.2-3b",
    "deepseek-v2",
    "deepseek-v2-lite",
]
NO_DROPOUT_LLAMAS = ["llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b"]
# OpenAI's gpt-oss model card (arXiv:2508.10925, Table 1) counts the unembedding but not the
# embedding table among the 5.13B active parameters, and so does the DeepSeek-V2 paper
# (arXiv:2405.04434): DeepSeek-V2-Lite's 2.4B is 2.45B without the table and 2.66B with it (V2:
# 20.85B and 21.37B against 21B; V3's 37B fits both, 36.6B and 37.6B, and is counted with it
# here). Qwen and Mistral count both.
ACTIVE_WITHOUT_INPUT_EMBEDDING = {"gpt-oss-120b", "gpt-oss-20b", "deepseek-v2", "deepseek-v2-lite"}
REL_TOL = 0.03


def _doc(name: str) -> dict:
    return json.loads((PROFILES / "models" / f"{name}.json").read_text())


MOE_MODELS = [n for n in NEW_MODELS if _doc(n).get("num_experts")]
# xAI gives Grok-1's activated share only as "25% of the weights" (2 of 8 experts), not as a
# count; attention and the embedding are shared, so a token uses 26.5% (83.8B), and the preset
# carries no published_active_params
MOE_WITH_PUBLISHED_ACTIVE = [n for n in MOE_MODELS if n != "grok-1"]


def _attention_params(c: dict) -> int:
    """One layer's attention weights (and biases), without its input norm."""
    h, a = c["hidden_size"], c["num_heads"]
    if c.get("kv_lora_rank", 0):
        qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
        q_lora = c.get("q_lora_rank", 0)
        # q: down-projection, its RMSNorm, up-projection to every head's nope+rope dims
        q = h * q_lora + q_lora + q_lora * a * qk if q_lora else h * a * qk
        # kv: down-projection to the latent plus the shared rope key, the latent's RMSNorm,
        # up-projection to every head's nope key and value
        kv = (
            h * (c["kv_lora_rank"] + c["qk_rope_head_dim"])
            + c["kv_lora_rank"]
            + c["kv_lora_rank"] * a * (c["qk_nope_head_dim"] + c["v_head_dim"])
        )
        return q + kv + a * c["v_head_dim"] * h
    d = c.get("head_dim") or h // a
    q_dim, kv_dim = a * d, c["num_kv_heads"] * d
    weights = h * q_dim + 2 * h * kv_dim + q_dim * h
    biases = q_dim + 2 * kv_dim + h if c["bias"] else 0
    return weights + biases


def _mlp_params(c: dict, ffn: int) -> int:
    """One (gated) MLP or expert of width ``ffn``."""
    h = c["hidden_size"]
    mats = 3 if c["gated_mlp"] else 2
    biases = ((mats - 1) * ffn + h) if c["bias"] else 0
    return mats * h * ffn + biases


def _hand_counts(c: dict) -> tuple[int, int]:
    """(total, activated) parameters of a preset, from its JSON fields."""
    h, layers = c["hidden_size"], c["num_layers"]
    embedding = c["vocab_size"] * h
    head = 0 if c["tied_embeddings"] else c["vocab_size"] * h
    norms = 2 * h
    attention = _attention_params(c)
    dense_layer = attention + norms + _mlp_params(c, c["ffn_hidden_size"])
    experts = c.get("num_experts", 0)
    if not experts:
        total = embedding + layers * dense_layer + h + head
        return total, total
    n_dense = c.get("dense_layers", 0)
    expert = _mlp_params(c, c.get("moe_ffn_hidden_size") or c["ffn_hidden_size"])
    router = experts * h + (experts if c["bias"] else 0)
    shared = c.get("shared_experts", 0) * expert
    moe_common = attention + norms + router + shared
    n_moe = layers - n_dense
    total = embedding + n_dense * dense_layer + n_moe * (moe_common + experts * expert) + h + head
    active = (
        embedding
        + n_dense * dense_layer
        + n_moe * (moe_common + c["experts_per_token"] * expert)
        + h
        + head
    )
    if c["name"] in ACTIVE_WITHOUT_INPUT_EMBEDDING:
        active -= embedding
    return total, active


def test_hand_formula_on_a_tiny_moe():
    """The hand formula itself, on a model small enough to count on paper."""
    c = dict(
        name="tiny",
        hidden_size=4,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        ffn_hidden_size=8,
        vocab_size=10,
        gated_mlp=True,
        tied_embeddings=False,
        bias=False,
        num_experts=4,
        experts_per_token=2,
        moe_ffn_hidden_size=3,
        shared_experts=1,
        dense_layers=1,
    )
    attention = 4 * 4 + 2 * 4 * 2 + 4 * 4  # q, k and v (one kv head of 2), out
    dense = attention + 8 + 3 * 4 * 8
    moe_common = attention + 8 + 4 * 4 + 3 * 4 * 3  # norms, router, one shared expert
    total, active = _hand_counts(c)
    assert total == 40 + dense + moe_common + 4 * 36 + 4 + 40
    assert active == 40 + dense + moe_common + 2 * 36 + 4 + 40


def test_hand_formula_mla_matches_deepseek_v3_attention_size():
    """MLA projections of DeepSeek-V3, counted term by term (arXiv:2412.19437, section 2.1.1)."""
    c = _doc("deepseek-v3")
    q = 7168 * 1536 + 1536 + 1536 * 128 * (128 + 64)
    kv = 7168 * (512 + 64) + 512 + 512 * 128 * (128 + 128)
    out = 128 * 128 * 7168
    assert _attention_params(c) == q + kv + out == 187_107_328


@pytest.mark.parametrize("name", NEW_MODELS)
def test_total_params_match_published(name):
    c = _doc(name)
    total, _ = _hand_counts(c)
    assert total == pytest.approx(c["published_params"], rel=REL_TOL)


@pytest.mark.parametrize("name", MOE_WITH_PUBLISHED_ACTIVE)
def test_activated_params_match_published(name):
    c = _doc(name)
    total, active = _hand_counts(c)
    assert active == pytest.approx(c["published_active_params"], rel=REL_TOL)
    assert active < total


def test_only_grok_1_has_no_published_activated_count():
    assert [n for n in MOE_MODELS if "published_active_params" not in _doc(n)] == ["grok-1"]


@pytest.mark.parametrize("name", MOE_MODELS)
def test_moe_fields_are_consistent(name):
    c = _doc(name)
    assert 1 <= c["experts_per_token"] <= c["num_experts"]
    assert 0 <= c["dense_layers"] < c["num_layers"]
    assert c["moe_ffn_hidden_size"] > 0
    if not c["dense_layers"]:
        # an all-MoE model's ffn_hidden_size is its expert size (no dense layer uses it)
        assert c["ffn_hidden_size"] == c["moe_ffn_hidden_size"]


@pytest.mark.parametrize(
    "name", ["qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b", "gpt-oss-20b", "qwen3-32b"]
)
def test_head_dim_differs_from_hidden_over_heads(name):
    """Where head_dim is given it must matter, or it should not be in the file."""
    c = _doc(name)
    assert c["head_dim"] * c["num_heads"] != c["hidden_size"]


@pytest.mark.parametrize(
    "name, field",
    [
        ("nemotron4-15b", "gated_mlp"),  # squared ReLU: two matrices
        ("nemotron4-340b", "gated_mlp"),
        ("llama3.2-1b", "tied_embeddings"),
        ("llama3.2-3b", "tied_embeddings"),
    ],
)
def test_the_published_count_pins_the_flag(name, field):
    """The other value of the flag misses the published count: the count checks the flag."""
    c = _doc(name)
    flipped, _ = _hand_counts(dict(c, **{field: not c[field]}))
    assert flipped != pytest.approx(c["published_params"], rel=REL_TOL)


@pytest.mark.parametrize("name", NEW_MODELS + NO_DROPOUT_LLAMAS)
def test_llama_style_presets_train_causal_without_dropout(name):
    c = _doc(name)
    assert c["dropout"] is False
    assert c["causal"] is True


@pytest.mark.parametrize("name", NEW_MODELS)
def test_presets_cite_their_config(name):
    assert "config" in _doc(name)["source"]


@pytest.mark.parametrize("name", NEW_MODELS + NO_DROPOUT_LLAMAS)
def test_presets_load(name):
    m = load_model(name)
    assert m.name == name
    assert m.published_params == _doc(name)["published_params"]


@pytest.mark.parametrize("name", ["h800", "gb200"])
def test_hardware_presets_load_with_ordered_peaks(name):
    peak = load_hardware(name).spec.peak_flops_per_s
    assert float(peak[Dtype.FP8]) > float(peak[Dtype.BF16]) > float(peak[Dtype.FP32])


def _hw(name: str) -> dict:
    return json.loads((PROFILES / "hardware" / f"{name}.json").read_text())


@pytest.mark.parametrize("name", ["h800", "h200", "gb200"])
def test_hardware_presets_cite_every_field(name):
    sources = _hw(name)["sources"]
    for key in ("power", "compute", "memory", "intra_node", "inter_node", "memory_reserve"):
        assert sources.get(key), key
    assert _hw(name)["constants"]["_source"]


def test_h800_is_an_h100_with_narrower_nvlink():
    """Same GH100 compute and HBM; NVLink 400 GB/s bidirectional against the H100's 900."""
    h800, h100 = _hw("h800"), _hw("h100-sxm")
    assert h800["peak_tflops"] == h100["peak_tflops"]
    assert h800["memory_bandwidth_gb_per_s"] == h100["memory_bandwidth_gb_per_s"]
    assert h800["links"]["intra_node"]["bandwidth_gb_per_s"] == 400 / 2
    # DeepSeek-V3 (arXiv:2412.19437, section 3.2.2): IB 50 GB/s per GPU
    assert h800["links"]["inter_node"]["bandwidth_gb_per_s"] == 50


@pytest.mark.parametrize("name", ["h800", "h200"])
def test_gh100_presets_share_the_fitted_h100_constants(name):
    """The H800 and H200 are the GH100 die at the H100's clocks and 700 W, so the efficiencies
    fitted on H100 runs describe them; HBM and NVLink differ in the data, not the constants."""
    other, h100 = _hw(name), _hw("h100-sxm")
    assert other["peak_tflops"] == h100["peak_tflops"]
    assert other["board_power_w"] == h100["board_power_w"]
    drop = {"_source"}
    assert {k: v for k, v in other["constants"].items() if k not in drop} == {
        k: v for k, v in h100["constants"].items() if k not in drop
    }
    assert other["memory_reserve_gib"] == h100["memory_reserve_gib"]
    assert other["fa2_attention_ratio"] == h100["fa2_attention_ratio"]


def test_gb200_per_gpu_figures_from_the_rack_sheet():
    """GB200 NVL72 sheet, per rack of 72 GPUs, tensor figures with 2:4 sparsity."""
    g = _hw("gb200")
    gpus, sparsity = 72, 2
    assert g["peak_tflops"]["fp8"] == pytest.approx(720e3 / gpus / sparsity)
    assert g["peak_tflops"]["bf16"] == pytest.approx(360e3 / gpus / sparsity)
    assert g["peak_tflops"]["tf32"] == pytest.approx(180e3 / gpus / sparsity)
    assert g["peak_tflops"]["fp32"] == pytest.approx(5760 / gpus)
    assert g["memory_bandwidth_gb_per_s"] == pytest.approx(576e3 / gpus)
    assert g["memory_capacity_gib"] == pytest.approx(13.4e12 / gpus / 2**30, rel=0.01)
    # 130 TB/s of NVLink per rack, bidirectional: 900 GB/s per direction per GPU
    assert g["links"]["intra_node"]["bandwidth_gb_per_s"] == pytest.approx(130e3 / gpus / 2, 0.01)
    assert g["nvlink_domain_size"] == gpus
    assert gpus % g["gpus_per_node"] == 0
