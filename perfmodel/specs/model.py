"""Model descriptions (transformer, MLP) and their parameter, FLOP and byte counts.

:class:`ModelSpec` holds the dimensions as array leaves (so rows of different models can be
vmapped together) and one static choice, ``kind``. Counting follows Megatron-LM's GPT layer
(Narayanan et al. SC21, §5 and eq. 3): per layer and microbatch of ``b`` sequences of length
``s``, the forward pass costs ``24·b·s·h² + 4·b·s²·h`` FLOPs with ``ffn = 4h``, generalised here
to grouped-query attention (``num_kv_heads``) and gated (SwiGLU) MLPs. Backward costs twice the
forward. Bytes are the HBM traffic of each kernel (inputs read, outputs written) for the
roofline. Presets are the JSON files in ``profiles/models``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from perfmodel.specs.arrays import f32
from perfmodel.specs.names import aliases, preset_name
from simbase import units
from simbase.errors import AisimError, bad_value, suggest
from simbase.io import read_json

KINDS = ("transformer", "mlp")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Dimensions of one model (array leaves) and its structure (static).

    For ``kind="mlp"``, ``num_layers`` linear layers map ``input_size -> hidden_size -> ... ->
    output_size``; the transformer-only fields are unused. Boolean properties are 0/1 floats.
    The static ``kind``, ``moe`` (routed experts) and ``mla`` (latent attention) decide which
    terms the step function compiles (a dense model compiles no MoE terms); build specs with
    :func:`model_from_dict` or :func:`with_overrides`, which keep them in step with the leaves.
    """

    num_layers: Float[Array, ""]
    hidden_size: Float[Array, ""]
    num_heads: Float[Array, ""]
    num_kv_heads: Float[Array, ""]
    ffn_hidden_size: Float[Array, ""]
    seq_len: Float[Array, ""]
    vocab_size: Float[Array, ""]
    gated_mlp: Float[Array, ""]
    tied_embeddings: Float[Array, ""]
    learned_pos_emb: Float[Array, ""]
    bias: Float[Array, ""]
    input_size: Float[Array, ""]
    output_size: Float[Array, ""]
    # mixture of experts (0 experts: dense); the first ``dense_layers`` layers are dense
    num_experts: Float[Array, ""] = 0.0
    experts_per_token: Float[Array, ""] = 0.0
    moe_ffn_hidden_size: Float[Array, ""] = 0.0
    shared_experts: Float[Array, ""] = 0.0
    dense_layers: Float[Array, ""] = 0.0
    head_dim: Float[Array, ""] = 0.0  # 0: hidden_size / num_heads
    # multi-head latent attention (DeepSeek-V2/V3); kv_lora_rank 0 = not MLA
    q_lora_rank: Float[Array, ""] = 0.0
    kv_lora_rank: Float[Array, ""] = 0.0
    qk_rope_head_dim: Float[Array, ""] = 0.0
    qk_nope_head_dim: Float[Array, ""] = 0.0
    v_head_dim: Float[Array, ""] = 0.0
    causal: Float[Array, ""] = 1.0
    dropout: Float[Array, ""] = 1.0
    kind: str = jax.tree.static(default="transformer")
    moe: bool = jax.tree.static(default=False)
    mla: bool = jax.tree.static(default=False)


def with_structure(spec: ModelSpec) -> ModelSpec:
    """The spec with its static ``moe`` and ``mla`` read from its (concrete) leaves."""
    moe = spec.kind == "transformer" and float(spec.num_experts) > 0
    mla = spec.kind == "transformer" and float(spec.kv_lora_rank) > 0
    return dataclasses.replace(spec, moe=moe, mla=mla)


@dataclasses.dataclass(frozen=True)
class Model:
    """A named model: its spec, the published parameter count and the citation.

    ``fused_attention_default`` is the attention kernel a strategy gets when none is asked for:
    True for the presets whose published training runs all use a fused kernel (FlashAttention,
    cuDNN; the Llama, Mistral, Mixtral, Qwen, DeepSeek, Nemotron-4, Grok-1, GPT-OSS and MPT
    presets), False for the GPT-2/3, BLOOM and Megatron presets, whose reference measurements
    (Megatron-LM 2021-22, BLOOM's Megatron-DeepSpeed 2022) predate it.
    """

    name: str
    spec: ModelSpec
    published_params: float | None = None
    source: str = ""
    fused_attention_default: bool = False


_F = jnp.float32
_SPEC_FIELDS = [
    f.name for f in dataclasses.fields(ModelSpec) if f.name not in ("kind", "moe", "mla")
]


def _models_dir() -> Path:
    return Path(str(resources.files("perfmodel") / "profiles" / "models"))


def model_names() -> list[str]:
    """Names of the shipped model presets."""
    return sorted(p.stem for p in _models_dir().glob("*.json"))


def _get(where: str, doc: dict, key: str, *, minimum: float = 1.0, default: Any = None) -> float:
    v = doc.get(key, default)
    if v is None:
        raise AisimError(f"{where}: missing field '{key}': expected a positive integer")
    if not _integer(v) or v < minimum:
        raise bad_value(where, key, v, f"an integer >= {minimum:g} (below 2^31)")
    return float(v)


def _integer(v: Any) -> bool:
    """A whole number of a JSON document that fits the step model's float32 counts."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return False
    return v == int(v) and abs(v) < 2**31


def model_from_dict(doc: dict[str, Any], where: str = "<dict>") -> Model:
    """Validates a model description (schema of the presets) and builds a :class:`Model`.

    Args:
      doc: the parsed JSON (``kind`` transformer or mlp, and its dimensions).
      where: the source named in errors (a file path).

    Returns:
      A :class:`Model` whose :class:`ModelSpec` holds float32 dimensions.

    Raises:
      AisimError: naming ``where``, the field, the bad value and what is expected.
    """
    if not isinstance(doc, dict):
        raise AisimError(f"{where}: expected a JSON object with model fields")
    kind = str(doc.get("kind", "transformer")).lower()
    if kind not in KINDS:
        raise bad_value(where, "kind", doc.get("kind"), "'transformer' or 'mlp'")
    layers = _get(where, doc, "num_layers")
    hidden = _get(where, doc, "hidden_size")
    extra = _moe_and_attention_fields(where, {})  # an MLP's: all zero (dense, no attention)
    if kind == "transformer":
        extra = _moe_and_attention_fields(where, doc)
        heads = _get(where, doc, "num_heads")
        kv = _get(where, doc, "num_kv_heads", default=heads)
        if heads % kv:
            raise bad_value(where, "num_kv_heads", kv, f"a divisor of num_heads={heads:g}")
        if hidden % heads and not extra["head_dim"]:
            raise bad_value(where, "hidden_size", hidden, f"a multiple of num_heads={heads:g}")
        vals = dict(
            num_heads=heads,
            num_kv_heads=kv,
            ffn_hidden_size=_get(where, doc, "ffn_hidden_size", default=4 * hidden),
            seq_len=_get(where, doc, "seq_len"),
            vocab_size=_get(where, doc, "vocab_size"),
            gated_mlp=float(bool(doc.get("gated_mlp", False))),
            tied_embeddings=float(bool(doc.get("tied_embeddings", True))),
            learned_pos_emb=float(bool(doc.get("learned_pos_emb", True))),
            bias=float(bool(doc.get("bias", True))),
            input_size=0.0,
            output_size=0.0,
        )
    else:
        vals = dict(
            num_heads=1.0,
            num_kv_heads=1.0,
            ffn_hidden_size=hidden,
            seq_len=1.0,
            vocab_size=0.0,
            gated_mlp=0.0,
            tied_embeddings=0.0,
            learned_pos_emb=0.0,
            bias=float(bool(doc.get("bias", False))),
            input_size=_get(where, doc, "input_size", default=hidden),
            output_size=_get(where, doc, "output_size", default=hidden),
        )
    spec = with_structure(
        ModelSpec(
            num_layers=f32(layers),
            hidden_size=f32(hidden),
            kind=kind,
            **{k: f32(v) for k, v in (vals | extra).items()},
        )
    )
    _check_size(where, spec)
    pub = doc.get("published_params")
    fused = doc.get("fused_attention_default", False)
    if not isinstance(fused, bool):
        raise bad_value(where, "fused_attention_default", fused, "true or false")
    return Model(
        name=str(doc.get("name", Path(where).stem)).lower(),
        spec=spec,
        published_params=None if pub is None else float(pub),
        source=str(doc.get("source", "")),
        fused_attention_default=fused,
    )


# the largest model a plan can be about: 10^15 parameters (the largest published by 2025 are about 10^12)
MAX_PARAMS = 1e15


def _check_size(where: str, spec: ModelSpec) -> None:
    """Refuses a model of more than :data:`MAX_PARAMS` parameters (its counts, in float32,
    would overflow long before a step time means anything), with its estimated size."""
    h, L = float(spec.hidden_size), float(spec.num_layers)
    if spec.kind == "mlp":
        size = float(spec.input_size) * h + (L - 1.0) * h * h + h * float(spec.output_size)
    else:
        width = max(
            float(spec.ffn_hidden_size),
            float(spec.moe_ffn_hidden_size) * max(float(spec.num_experts), 1.0),
        )
        size = L * (4.0 * h * h + 3.0 * h * width) + float(spec.vocab_size) * h
    if size > MAX_PARAMS:
        raise AisimError(
            f"{where}: a model of about {size:.3g} parameters: expected at most {MAX_PARAMS:.0e}",
            source=where,
            field="num_layers",
            value=L,
            expected=f"a model of at most {MAX_PARAMS:.0e} parameters",
        )


def _count(where: str, doc: dict, key: str, default: float = 0.0) -> float:
    """An optional non-negative integer field."""
    v = doc.get(key, default)
    if v is None:
        return float(default)
    if not _integer(v) or v < 0:
        raise bad_value(where, key, v, "a non-negative integer (below 2^31)")
    return float(v)


def _moe_and_attention_fields(where: str, doc: dict) -> dict[str, float]:
    """The optional MoE, head-size, MLA and masking fields of a transformer, checked."""
    out = {
        k: _count(where, doc, k)
        for k in (
            "num_experts",
            "experts_per_token",
            "moe_ffn_hidden_size",
            "shared_experts",
            "dense_layers",
            "head_dim",
            "q_lora_rank",
            "kv_lora_rank",
            "qk_rope_head_dim",
            "qk_nope_head_dim",
            "v_head_dim",
        )
    }
    if out["num_experts"]:
        if not 1 <= out["experts_per_token"] <= out["num_experts"]:
            raise bad_value(
                where,
                "experts_per_token",
                doc.get("experts_per_token"),
                f"an integer in [1, num_experts={out['num_experts']:g}]",
            )
        if not out["moe_ffn_hidden_size"]:
            out["moe_ffn_hidden_size"] = _get(where, doc, "ffn_hidden_size")
        if out["dense_layers"] >= _get(where, doc, "num_layers"):
            raise bad_value(where, "dense_layers", out["dense_layers"], "fewer than num_layers")
    if out["kv_lora_rank"] and not (out["qk_nope_head_dim"] and out["v_head_dim"]):
        raise bad_value(
            where,
            "qk_nope_head_dim" if not out["qk_nope_head_dim"] else "v_head_dim",
            0,
            "a positive head size for multi-head latent attention (kv_lora_rank > 0)",
        )
    out["causal"] = float(bool(doc.get("causal", True)))
    out["dropout"] = float(bool(doc.get("dropout", True)))
    return out


def load_model(name: str) -> Model:
    """Loads a shipped model preset by name or alias (:mod:`perfmodel.specs.names`:
    ``gpt3-175B``, ``llama3.1-70b`` and ``meta-llama/Llama-3.1-70B-Instruct`` work).

    Args:
      name: a name in :func:`model_names`, or one of a preset's ``aliases``.

    Returns:
      The validated :class:`Model`.

    Raises:
      AisimError: unknown name, with the closest names suggested.
    """
    key = preset_name(name, _models_dir())
    if key is None:
        raise AisimError(f"unknown model preset {name!r}{suggest(name.strip(), model_names())}")
    path = _models_dir() / f"{key}.json"
    return model_from_dict(json.loads(path.read_text()), str(path))


def model_preset_name(name: str) -> str | None:
    """The preset that ``name`` names (its file name or an alias), or None."""
    return preset_name(name, _models_dir())


def model_aliases() -> dict[str, list[str]]:
    """Preset name -> the other names it answers to (its file's ``aliases``)."""
    return aliases(_models_dir())


def load_model_file(path: str | Path) -> Model:
    """Loads and validates a user model JSON file (same schema as the presets).

    Raises:
      AisimError: a missing or unreadable file, invalid JSON, or a bad field (naming the file,
        the field, the value and what is expected).
    """
    return model_from_dict(read_json(path, "file"), str(path))


def mlp_from_widths(widths: list[int], *, bias: bool = False, name: str = "mlp") -> Model:
    """A generic MLP from its layer widths, e.g. ``[784, 200, 200, 10]``.

    The hidden widths must be equal (``in -> h -> ... -> h -> out``), the shape the model uses.

    Args:
      widths: input, hidden and output widths (at least two).
      bias: whether the layers have biases.
      name: the model's name in reports.

    Returns:
      A :class:`Model` of kind ``"mlp"``.

    Raises:
      AisimError: ``field="widths"`` for fewer than two or unequal hidden widths.
    """
    if len(widths) < 2 or any(int(w) != w or w < 1 for w in widths):
        raise bad_value(None, "widths", widths, "at least two positive integer widths")
    hidden = widths[1:-1] or [widths[-1]]
    if len(set(hidden)) != 1:
        raise bad_value(None, "widths", widths, "equal hidden widths (in-h-...-h-out)")
    doc = dict(
        kind="mlp",
        num_layers=len(widths) - 1,
        hidden_size=hidden[0],
        input_size=widths[0],
        output_size=widths[-1],
        bias=bias,
        name=name,
    )
    return model_from_dict(doc, "widths")


MLP_STANDARD_LAYERS = 8  # layers of the standard square MLP picked by a parameter count


def mlp_from_params(params: float | str, *, layers: int = MLP_STANDARD_LAYERS) -> Model:
    """The standard square, bias-free MLP (DistIR's shape) with about ``params`` parameters.

    ``layers`` square ``h × h`` layers with ``h = round(sqrt(params / layers))``.

    Args:
      params: a parameter count, as a number or text such as ``"60M"`` or ``"1.5B"``.
      layers: square layers.

    Returns:
      A :class:`Model` of kind ``"mlp"`` named ``mlp-<count>``.

    Raises:
      AisimError: ``field="params"`` for an unreadable or too small count.
    """
    try:
        n = units.parse_count(params)
    except ValueError:
        raise bad_value(None, "params", params, "a parameter count like 60M or 1.5B") from None
    if n < layers or n > MAX_PARAMS:
        raise bad_value(None, "params", params, f"between {layers} and {MAX_PARAMS:.0e} parameters")
    h = max(1, round(math.sqrt(n / layers)))
    return model_from_dict(
        dict(
            kind="mlp",
            num_layers=layers,
            hidden_size=h,
            bias=False,
            name=f"mlp-{units.format_count(n)}".lower(),
        ),
        "params",
    )


def with_overrides(model: Model, **dims: float | None) -> Model:
    """Returns the model with some dimensions replaced (``None`` values are ignored)."""
    changes = {k: f32(float(v)) for k, v in dims.items() if v is not None}
    unknown = set(changes) - set(_SPEC_FIELDS)
    if unknown:
        raise AisimError(f"unknown model dimension {sorted(unknown)[0]!r}")
    return dataclasses.replace(
        model, spec=with_structure(dataclasses.replace(model.spec, **changes))
    )


# ---------------------------------------------------------------------------- counts (pure)


def _head_dim(m: ModelSpec):
    return jnp.where(m.head_dim > 0, m.head_dim, m.hidden_size / m.num_heads)


class AttentionShape(NamedTuple):
    """Per-token widths of one attention block (all heads, before the tensor-parallel split)."""

    q_dim: Float[Array, ""]  # query (and key, for the scores) width: heads · qk head size
    v_dim: Float[Array, ""]  # value and attention-output width: heads · v head size
    kv_exchanged: Float[Array, ""]  # K and V elements per token a context-parallel ring moves
    proj_params: Float[Array, ""]  # Q, K, V projection weights (MLA: the low-rank ones too)
    out_params: Float[Array, ""]  # output projection weights


def attention_shape(m: ModelSpec) -> AttentionShape:
    """Widths and projection sizes of grouped-query attention (``num_kv_heads``, ``head_dim``)
    or, when ``kv_lora_rank > 0``, DeepSeek's multi-head latent attention (DeepSeek-AI 2024,
    arXiv:2405.04434 §2.1: Q through a ``q_lora_rank`` bottleneck, K/V up-projected from a
    ``kv_lora_rank`` latent plus a shared rope key)."""
    h, a = m.hidden_size, m.num_heads
    if m.mla:
        qk_hd = m.qk_nope_head_dim + m.qk_rope_head_dim
        mla_q = jnp.where(
            m.q_lora_rank > 0, h * m.q_lora_rank + m.q_lora_rank * a * qk_hd, h * a * qk_hd
        )
        mla_kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * a * (
            m.qk_nope_head_dim + m.v_head_dim
        )
        return AttentionShape(
            q_dim=a * qk_hd,
            v_dim=a * m.v_head_dim,
            kv_exchanged=a * (qk_hd + m.v_head_dim),
            proj_params=mla_q + mla_kv,
            out_params=a * m.v_head_dim * h,
        )
    hd = _head_dim(m)
    gqa_q = a * hd
    gqa_kv = 2.0 * m.num_kv_heads * hd
    return AttentionShape(
        q_dim=gqa_q,
        v_dim=gqa_q,
        kv_exchanged=gqa_kv,
        proj_params=h * (gqa_q + gqa_kv),
        out_params=gqa_q * h,
    )


def moe_layer_count(m: ModelSpec) -> Float[Array, ""]:
    """Layers with routed experts: all but the first ``dense_layers`` of an MoE model."""
    if not m.moe:
        return jnp.zeros((), _F)
    return m.num_layers - m.dense_layers


def _attention_params(m: ModelSpec):
    att = attention_shape(m)
    biases = m.bias * (att.q_dim + att.kv_exchanged + m.hidden_size)
    lora_norms = m.q_lora_rank + m.kv_lora_rank if m.mla else 0.0
    return att.proj_params + att.out_params + biases + lora_norms


def _mlp_params(m: ModelSpec, ffn):
    h, g = m.hidden_size, 1.0 + m.gated_mlp
    return h * ffn * g + ffn * h + m.bias * (ffn * g + h)


def expert_params(m: ModelSpec) -> Float[Array, ""]:
    """Weights of one routed expert (a gated or plain MLP of ``moe_ffn_hidden_size``)."""
    return _mlp_params(m, m.moe_ffn_hidden_size)


def dense_layer_params(m: ModelSpec) -> Float[Array, ""]:
    """Parameters of one dense transformer layer: attention, MLP of ``ffn_hidden_size``, norms."""
    norms = 2.0 * m.hidden_size * (1.0 + m.bias)
    return _attention_params(m) + _mlp_params(m, m.ffn_hidden_size) + norms


def moe_layer_params(m: ModelSpec, *, routed=None) -> Float[Array, ""]:
    """Parameters of one MoE layer: attention, norms, router, shared experts and ``routed``
    experts (default: all ``num_experts``; pass ``experts_per_token`` for the active ones)."""
    n_routed = m.num_experts if routed is None else routed
    norms = 2.0 * m.hidden_size * (1.0 + m.bias)
    router = m.hidden_size * m.num_experts
    experts = (n_routed + m.shared_experts) * expert_params(m)
    return _attention_params(m) + norms + router + experts


def layer_params(m: ModelSpec) -> Float[Array, ""]:
    """Parameters of the average transformer layer (dense and MoE layers mixed), or the average
    layer of an MLP."""
    if m.kind == "mlp":
        return mlp_params(m) / m.num_layers
    n_moe = moe_layer_count(m)
    return (
        (m.num_layers - n_moe) * dense_layer_params(m) + n_moe * moe_layer_params(m)
    ) / m.num_layers


def mlp_params(m: ModelSpec) -> Float[Array, ""]:
    """Parameters of an MLP ``in -> h ... h -> out`` (with one layer: ``in -> out``)."""
    L, h, i, o = m.num_layers, m.hidden_size, m.input_size, m.output_size
    weights = jnp.where(L > 1, i * h + (L - 2.0) * h * h + h * o, i * o)
    biases = jnp.where(L > 1, (L - 1.0) * h + o, o)
    return weights + m.bias * biases


def embedding_params(m: ModelSpec) -> Float[Array, ""]:
    """Input embedding (and learned positions) of a transformer; 0 for an MLP."""
    if m.kind == "mlp":
        return jnp.zeros((), _F)
    return m.vocab_size * m.hidden_size + m.learned_pos_emb * m.seq_len * m.hidden_size


def head_params(m: ModelSpec) -> Float[Array, ""]:
    """Final norm plus an untied output head of a transformer; 0 for an MLP."""
    if m.kind == "mlp":
        return jnp.zeros((), _F)
    return m.hidden_size * (1.0 + m.bias) + (1.0 - m.tied_embeddings) * m.vocab_size * m.hidden_size


def total_params(m: ModelSpec) -> Float[Array, ""]:
    """All parameters of the model, every expert included."""
    if m.kind == "mlp":
        return mlp_params(m)
    return m.num_layers * layer_params(m) + embedding_params(m) + head_params(m)


# one compiled program for a host-side count, instead of one compilation per jnp operation
host_total_params = jax.jit(total_params)


def active_params(m: ModelSpec) -> Float[Array, ""]:
    """Parameters one token passes through (N in the 6·N·tokens convention): a mixture of
    experts counts only its ``experts_per_token`` routed experts (and the shared ones); a dense
    model, all of them."""
    if m.kind == "mlp":
        return mlp_params(m)
    n_moe = moe_layer_count(m)
    layers = (m.num_layers - n_moe) * dense_layer_params(m) + n_moe * moe_layer_params(
        m, routed=m.experts_per_token
    )
    return layers + embedding_params(m) + head_params(m)


def gpt_training_flops(m: ModelSpec, global_batch, recompute_full) -> Float[Array, ""]:
    """Narayanan et al. SC21 eq. 3: FLOPs of one training step of a GPT model.

    ``72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))`` without recomputation and
    ``96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))`` with full recomputation.

    Args:
      m: a transformer's dimensions (s, l, h, V).
      global_batch: samples per step (B).
      recompute_full: > 0 for full activation recomputation (an extra forward pass).

    Returns:
      FLOPs per step.
    """
    B, s, l, h, V = global_batch, m.seq_len, m.num_layers, m.hidden_size, m.vocab_size
    plain = 72.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * l * h))
    full = 96.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * l * h))
    return jnp.where(recompute_full > 0, full, plain)


def model_flops_per_step(m: ModelSpec, global_batch) -> Float[Array, ""]:
    """Model FLOPs of one step in the 6·N·tokens convention (for MFU), N the active parameters
    (:func:`active_params`: a mixture of experts counts only the experts a token visits)."""
    tokens = global_batch * (m.seq_len if m.kind == "transformer" else 1.0)
    return 6.0 * active_params(m) * tokens


def tokens_per_sample(m: ModelSpec) -> Float[Array, ""]:
    """Sequence length of a transformer; 1 for an MLP (one sample = one token)."""
    return m.seq_len if m.kind == "transformer" else jnp.ones((), _F)
