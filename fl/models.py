"""flax models for FL: multinomial logistic regression, McMahan's 2NN MLP, small CNN, LEAF's LSTM.

Contract: :func:`make_model` returns a :class:`~fl.modules.Model` (built by
:func:`~fl.modules.model_from_linen`, as a user's module is) whose ``apply(params, x)`` maps
``[batch *features]`` to ``[batch classes]`` logits, with its parameter count, float32 bytes and
analytical training FLOPs per sample (forward + backward = 3 × forward, the usual 2:1 backward to
forward ratio; for dense layers this is 6 FLOPs per weight per sample, Kaplan et al. 2020).
By default every dense layer multiplies through :func:`dense_dot_general`, which computes a small
batch's kernel gradient as a sum of outer products (same values, a faster vmapped round on
XLA:CPU); ``outer_product_grad=False`` keeps flax's own ``lax.dot_general``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float

from fl import zoo
from fl.choices import unknown_name
from fl.modules import Model, model_from_linen
from fl.tasks import CLASSIFICATION, NEXT_TOKEN, masked_mean, softmax_nll
from simbase.errors import bad_value

MODELS = (
    "logreg",
    "mlp",
    "2nn",
    "cnn",
    "lstm",
    "simple-cnn",
    "resnet18-gn",
    "so-lstm",
    "text-lstm",
)
DEFAULT_MODEL = {
    "synthetic": "logreg",
    "digits": "mlp",
    "mnist": "2nn",
    "shakespeare": "lstm",
    "femnist": "cnn",
    "cifar10": "resnet18-gn",
    "cifar100": "resnet18-gn",
    "stackoverflow": "so-lstm",
    "sent140": "text-lstm",
}


# Up to this many rows (a local batch), a dense layer's kernel gradient is a sum of outer products.
OUTER_PRODUCT_MAX_ROWS = 32


@jax.custom_vjp
def _small_batch_matmul(x: Float[Array, "batch fan_in"], w: Float[Array, "fan_in fan_out"]):
    return x @ w


def _small_batch_matmul_fwd(x, w):
    return x @ w, (x, w)


def _small_batch_matmul_bwd(res, g):
    # x^T g written as one outer product per row: vmapped over clients, XLA:CPU lowers x^T g to
    # one small library matmul per client, while these rows fuse into a single elementwise loop
    # (measured: 3.3 -> 0.4 us per client for FedProx's 60 x 10 logistic regression at B = 10).
    x, w = res
    dw = x[0, :, None] * g[0, None, :]
    for i in range(1, x.shape[0]):
        dw = dw + x[i, :, None] * g[i, None, :]
    return g @ w.T, dw


_small_batch_matmul.defvjp(_small_batch_matmul_fwd, _small_batch_matmul_bwd)


def dense_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    """``lax.dot_general`` for ``nn.Dense``, with a small batch's kernel gradient as outer products.

    A ``[batch fan_in] @ [fan_in fan_out]`` product with at most :data:`OUTER_PRODUCT_MAX_ROWS`
    rows has the same value and gradients as ``lax.dot_general``, but its kernel gradient is
    ``sum_i outer(x_i, g_i)``; anything else (evaluation batches, other contractions) is
    ``lax.dot_general`` itself.
    """
    (l_con, r_con), (l_bat, r_bat) = dimension_numbers
    if (
        lhs.ndim == 2
        and rhs.ndim == 2
        and tuple(l_con) == (1,)
        and tuple(r_con) == (0,)
        and not l_bat
        and not r_bat
        and lhs.shape[0] <= OUTER_PRODUCT_MAX_ROWS
        and precision is None
        and preferred_element_type is None
    ):
        return _small_batch_matmul(lhs, rhs)
    return lax.dot_general(
        lhs,
        rhs,
        dimension_numbers,
        precision=precision,
        preferred_element_type=preferred_element_type,
    )


def _dense(features: int, outer_product_grad: bool) -> nn.Dense:
    return nn.Dense(features, dot_general=dense_dot_general if outer_product_grad else None)


class LogReg(nn.Module):
    """Multinomial logistic regression (FedProx's ``mclr``)."""

    num_classes: int
    outer_product_grad: bool = True

    @nn.compact
    def __call__(self, x):
        return _dense(self.num_classes, self.outer_product_grad)(x.reshape((x.shape[0], -1)))


class MLP(nn.Module):
    """ReLU MLP; ``hidden=(200, 200)`` is McMahan et al. (2017)'s 2NN."""

    num_classes: int
    hidden: Sequence[int] = (200, 200)
    outer_product_grad: bool = True

    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], -1))
        for h in self.hidden:
            x = nn.relu(_dense(h, self.outer_product_grad)(x))
        return _dense(self.num_classes, self.outer_product_grad)(x)


class CNN(nn.Module):
    """McMahan et al. (2017)'s CNN: conv5×5(32)-pool-conv5×5(64)-pool-dense(512)-dense."""

    num_classes: int
    side: int
    outer_product_grad: bool = True
    channels: int = 1

    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], self.side, self.side, self.channels))
        for feat in (32, 64):
            x = nn.relu(nn.Conv(feat, (5, 5), padding="SAME")(x))
            x = nn.max_pool(x, (2, 2), (2, 2), padding="SAME")
        x = nn.relu(_dense(512, self.outer_product_grad)(x.reshape((x.shape[0], -1))))
        return _dense(self.num_classes, self.outer_product_grad)(x)


class CharLSTM(nn.Module):
    """LEAF's Shakespeare model (Caldas et al. 2018, ``models/shakespeare/stacked_lstm.py``): an
    8-dimensional character embedding, two LSTM layers of 256 units, and a dense layer from the
    last position's output to the next character's logits. Inputs are character ids."""

    num_classes: int
    vocab: int
    hidden: Sequence[int] = (256, 256)
    embed: int = 8
    outer_product_grad: bool = True

    @nn.compact
    def __call__(self, x):
        h = nn.Embed(self.vocab, self.embed)(x.astype(jnp.int32))
        for width in self.hidden:
            h = nn.RNN(nn.OptimizedLSTMCell(width))(h)
        return _dense(self.num_classes, self.outer_product_grad)(h[:, -1])


def _image_side(name: str, input_shape) -> tuple[int, int]:
    """The side and channels of a square image given as ``[h, w, c]`` or flattened pixels."""
    if len(input_shape) == 3 and input_shape[0] == input_shape[1]:
        return input_shape[0], input_shape[2]
    in_dim = math.prod(input_shape)
    side = math.isqrt(in_dim)
    if side * side != in_dim:
        raise bad_value(
            None, "model", name, f"a model for {in_dim} input features (not a square image)"
        )
    return side, 1


ZOO = ("simple-cnn", "resnet18-gn", "so-lstm", "text-lstm")


def _zoo_model(name: str, input_shape, num_classes: int, vocab: int | None) -> Model:
    """The field's benchmark models (:mod:`fl.zoo`); the LSTMs' FLOPs by formula."""
    seq = math.prod(input_shape)
    if name in ("simple-cnn", "resnet18-gn"):
        if len(input_shape) != 3:
            raise bad_value(None, "model", name, f"a model for images [h, w, c], not {input_shape}")
        module = zoo.SimpleCNN(num_classes) if name == "simple-cnn" else zoo.ResNet18GN(num_classes)
        return model_from_linen(module, input_shape, name=name)
    if name == "so-lstm":
        m = zoo.SeqLSTM(num_classes)
        per_pos = 2.0 * m.hidden * m.embed + 2.0 * m.embed * num_classes
        flops = zoo.lstm_forward_flops(seq, m.embed, (m.hidden,)) + seq * per_pos
        acts = seq * (m.embed + 6 * m.hidden + m.embed + num_classes)
        task = NEXT_TOKEN
    else:
        m = zoo.TextLSTM(num_classes, vocab or num_classes)
        flops = zoo.lstm_forward_flops(seq, m.embed, (m.hidden, m.hidden))
        flops += 2.0 * m.hidden * num_classes
        acts = seq * (m.embed + 12 * m.hidden) + num_classes
        task = CLASSIFICATION
    return model_from_linen(
        m,
        input_shape,
        name=name,
        task=task,
        input_dtype=jnp.int32,
        flops_per_sample=3.0 * flops,
        activation_floats_per_sample=float(acts),
    )


def make_model(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    hidden: Sequence[int] | None = None,
    outer_product_grad: bool = True,
    vocab: int | None = None,
) -> Model:
    """Builds a model by name (one of :data:`MODELS`; ``2nn`` is the MLP with 200-200).

    Args:
      name: ``logreg``, ``mlp``, ``2nn``, ``cnn`` or ``lstm`` (character ids in, LEAF's
        :class:`CharLSTM`; ``hidden`` sets its layer widths, default 256-256).
      input_shape: shape of one sample (``cnn`` needs a square image, flattened or not).
      num_classes: number of output logits.
      hidden: hidden widths for ``mlp`` (default 200-200).
      outer_product_grad: dense layers take :func:`dense_dot_general` (for vmapped cohorts);
        ``False`` gives flax's default ``lax.dot_general``, the faster one for a single client's
        unbatched step (the same parameters and values).
      vocab: the number of token ids of ``text-lstm``'s input (default ``num_classes``).

    The field's models (``simple-cnn``, ``resnet18-gn``, ``so-lstm``, ``text-lstm``) are those
    of :mod:`fl.zoo`.
    """
    in_dim = math.prod(input_shape)
    if name == "logreg":
        module: nn.Module = LogReg(num_classes, outer_product_grad)
        acts = in_dim + num_classes
    elif name in ("mlp", "2nn"):
        hid = tuple(hidden) if (hidden and name == "mlp") else (200, 200)
        module = MLP(num_classes, hid, outer_product_grad)
        acts = in_dim + 2 * sum(hid) + num_classes
    elif name == "cnn":
        side, channels = _image_side(name, input_shape)
        module = CNN(num_classes, side, outer_product_grad, channels)
        acts = in_dim + 2 * side * side * 32 + side * side * 64 + 512 + num_classes
    elif name == "lstm":
        hid = tuple(hidden) if hidden else (256, 256)
        module = CharLSTM(num_classes, vocab=num_classes, hidden=hid)
        # per position: the embedding, and each layer's 4 gates, cell and output
        acts = in_dim * (module.embed + 6 * sum(hid)) + num_classes
    elif name in ZOO:
        return _zoo_model(name, input_shape, num_classes, vocab)
    else:
        raise unknown_name("model", name, MODELS, "model")
    flops = None
    if name == "lstm":  # XLA's cost analysis counts a scan's body once, not once per position
        forward = zoo.lstm_forward_flops(in_dim, module.embed, hid) + 2.0 * hid[-1] * num_classes
        flops = 3.0 * forward
    return model_from_linen(
        module, input_shape, name=name, flops_per_sample=flops, activation_floats_per_sample=acts
    )


def cross_entropy(
    logits: Float[Array, "batch classes"], labels, mask: Float[Array, " batch"]
) -> Float[Array, ""]:
    """Mean softmax cross-entropy over the ``mask``-ed samples (0 when none)."""
    return masked_mean(softmax_nll(logits, labels), mask)
