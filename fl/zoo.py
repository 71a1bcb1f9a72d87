"""Models of the field's federated benchmarks, in flax linen, each as its paper defines it.

Contract: every class maps ``[batch *features]`` to ``[batch classes]`` logits (``SeqLSTM``:
``[batch positions vocab]``) and is built by :func:`fl.models.make_model` by name:

- ``simple-cnn`` (:class:`SimpleCNN`): pfl-research's CIFAR-10 benchmark CNN
  (``benchmarks/model/pytorch/cnn.py::simple_cnn``): conv 3×3 32, conv 3×3 64 (valid), 2×2
  max-pool, dense 128, dense; without its dropout (local training here is deterministic).
- ``resnet18-gn`` (:class:`ResNet18GN`): ResNet-18 (He et al. 2016) with each batch norm
  replaced by group norm of 2 groups, Hsieh et al. (2020), "The Non-IID Data Quagmire of
  Decentralized Machine Learning", for CIFAR's 32×32 images (a 3×3 stem, no max-pool).
- ``so-lstm`` (:class:`SeqLSTM`): Reddi et al. (2021), "Adaptive Federated Optimization", Stack
  Overflow next-word model: embedding 96, one LSTM of 670 units, dense 96, dense to the
  vocabulary, at every position.
- ``text-lstm`` (:class:`TextLSTM`): LEAF's Sent140 model shape (Caldas et al. 2018): two LSTM
  layers of 100 units over word embeddings, a dense layer to the classes from the last
  position; its embedding is learned (100-dimensional) instead of LEAF's GloVe vectors.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp


class SimpleCNN(nn.Module):
    """pfl-research's CIFAR-10 CNN (see module)."""

    num_classes: int

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(32, (3, 3), padding="VALID")(x))
        x = nn.relu(nn.Conv(64, (3, 3), padding="VALID")(x))
        x = nn.max_pool(x, (2, 2), (2, 2))
        x = nn.relu(nn.Dense(128)(x.reshape((x.shape[0], -1))))
        return nn.Dense(self.num_classes)(x)


class BasicBlock(nn.Module):
    """ResNet's two 3×3 convolutions with a shortcut; group norm after each convolution."""

    features: int
    stride: int = 1
    groups: int = 2

    @nn.compact
    def __call__(self, x):
        y = nn.Conv(self.features, (3, 3), self.stride, padding=1, use_bias=False)(x)
        y = nn.relu(nn.GroupNorm(num_groups=self.groups)(y))
        y = nn.Conv(self.features, (3, 3), padding=1, use_bias=False)(y)
        y = nn.GroupNorm(num_groups=self.groups)(y)
        if self.stride != 1 or x.shape[-1] != self.features:
            x = nn.Conv(self.features, (1, 1), self.stride, use_bias=False)(x)
            x = nn.GroupNorm(num_groups=self.groups)(x)
        return nn.relu(x + y)


class ResNet18GN(nn.Module):
    """ResNet-18 with group norm for 32×32 images (see module)."""

    num_classes: int
    groups: int = 2

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(64, (3, 3), padding=1, use_bias=False)(x)
        x = nn.relu(nn.GroupNorm(num_groups=self.groups)(x))
        for i, features in enumerate((64, 128, 256, 512)):
            x = BasicBlock(features, 1 if i == 0 else 2, self.groups)(x)
            x = BasicBlock(features, 1, self.groups)(x)
        return nn.Dense(self.num_classes)(jnp.mean(x, axis=(1, 2)))


class SeqLSTM(nn.Module):
    """Reddi et al. (2021)'s Stack Overflow next-word LSTM (see module)."""

    vocab: int
    embed: int = 96
    hidden: int = 670

    @nn.compact
    def __call__(self, x):
        h = nn.Embed(self.vocab, self.embed)(x.astype(jnp.int32))
        h = nn.RNN(nn.OptimizedLSTMCell(self.hidden))(h)
        h = nn.Dense(self.embed)(h)
        return nn.Dense(self.vocab)(h)


class TextLSTM(nn.Module):
    """A two-layer LSTM classifier of word ids (LEAF's Sent140 shape; see module)."""

    num_classes: int
    vocab: int
    embed: int = 100
    hidden: int = 100

    @nn.compact
    def __call__(self, x):
        h = nn.Embed(self.vocab, self.embed)(x.astype(jnp.int32))
        for _ in range(2):
            h = nn.RNN(nn.OptimizedLSTMCell(self.hidden))(h)
        return nn.Dense(self.num_classes)(h[:, -1])


def lstm_forward_flops(seq_len: int, width_in: int, hidden: tuple[int, ...]) -> float:
    """Forward FLOPs of stacked LSTM layers over ``seq_len`` positions: per position and layer,
    the four gates' ``2·4h(in + h)`` multiply-adds and about ``10h`` elementwise operations
    (XLA's cost analysis counts a scan's body once, not once per position)."""
    flops, width = 0.0, width_in
    for h in hidden:
        flops += seq_len * (8.0 * h * (width + h) + 10.0 * h)
        width = h
    return flops
