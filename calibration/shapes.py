"""The model a measurement trains: a preset's shape, with the dimensions a user overrides.

Contract: :func:`measured_shape` turns a model preset's spec (an MLP or a transformer) into the
:class:`~calibration.measure.Shape` that :func:`~calibration.measure.measure_many` builds: the
preset's dimensions where no override is given, a transformer's FFN width scaled with its hidden
size. A bad override raises :class:`~simbase.errors.AisimError` naming the spec's field.
"""

from __future__ import annotations

from calibration.measure import Shape
from perfmodel.specs.model import ModelSpec
from simbase.errors import bad_value

# the dimensions a transformer has and an MLP does not
TRANSFORMER_ONLY = ("num_heads", "seq_len", "vocab_size", "ffn_hidden_size")


def measured_shape(
    spec: ModelSpec,
    *,
    num_layers: int | None = None,
    hidden_size: int | None = None,
    num_heads: int | None = None,
    seq_len: int | None = None,
    vocab_size: int | None = None,
    ffn_hidden_size: int | None = None,
) -> Shape:
    """The shape to measure of a model preset, some dimensions overridden.

    Args:
      spec: the preset's spec (``kind`` ``mlp`` or ``transformer``).
      num_layers: layers (None: the preset's).
      hidden_size: the width (None: the preset's).
      num_heads: attention heads; given, the key/value heads are as many (no grouping).
      seq_len: tokens per sample (None: the preset's).
      vocab_size: the vocabulary (None: the preset's).
      ffn_hidden_size: the MLP block's width (None: the preset's ratio to the hidden size).

    Returns:
      A bias-free square :class:`~calibration.measure.Shape` of kind ``mlp``, or a
      ``transformer`` with the preset's gating, biases, tied embeddings and position
      embeddings.

    Raises:
      AisimError: a dimension that is not a positive integer, or a transformer dimension given
        for an MLP (field: that dimension).
    """
    given = dict(num_heads=num_heads, seq_len=seq_len, vocab_size=vocab_size,
                 ffn_hidden_size=ffn_hidden_size)  # fmt: skip

    def dim(value, field: str) -> int:
        if value is None:
            return int(round(float(getattr(spec, field))))
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**31:
            raise bad_value(None, field, value, "a positive integer")  # no zero-size arrays
        return value

    layers, hidden = dim(num_layers, "num_layers"), dim(hidden_size, "hidden_size")
    if spec.kind == "mlp":
        for field in TRANSFORMER_ONLY:
            if given[field] is not None:
                raise bad_value(None, field, given[field], "no value: an MLP has no such dimension")
        return Shape(kind="mlp", num_layers=layers, hidden_size=hidden, bias=False)
    heads = dim(num_heads, "num_heads")
    ratio = float(spec.ffn_hidden_size) / float(spec.hidden_size)
    ffn = (
        dim(ffn_hidden_size, "ffn_hidden_size")
        if ffn_hidden_size is not None
        else int(round(ratio * hidden))
    )
    return Shape(
        kind="transformer", num_layers=layers, hidden_size=hidden, num_heads=heads,
        num_kv_heads=dim(None, "num_kv_heads") if num_heads is None else heads,
        ffn_hidden_size=ffn,
        seq_len=dim(seq_len, "seq_len"), vocab_size=dim(vocab_size, "vocab_size"),
        gated_mlp=bool(float(spec.gated_mlp)), bias=bool(float(spec.bias)),
        tied_embeddings=bool(float(spec.tied_embeddings)),
        learned_pos_emb=bool(float(spec.learned_pos_emb)),
    )  # fmt: skip
