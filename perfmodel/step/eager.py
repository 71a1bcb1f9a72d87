"""PyTorch eager mode's elementwise kernels of one transformer layer (the ``eager`` knob).

Contract: :func:`eager_elementwise_bytes` gives the HBM traffic and kernel count of the norms,
rotary embedding, gated activation and residual adds of one layer's forward when each PyTorch
op runs as its own kernel, as in torchtitan's Llama model without ``torch.compile``
(``torchtitan/models/llama/model.py`` and ``models/norms.py`` at commit 9dec370, the code of
its 2024-12 H100 benchmarks). The step model's default elementwise class is the fused one
(Megatron-Core's fused kernels, or what ``torch.compile`` generates: one pass per norm,
residual and activation, :func:`perfmodel.specs.model.layer_forward_ops`); with ``eager`` it takes
these bytes and kernels instead, and the backward and any recomputation scale them as they
scale the fused ones. Read and write counts per element of each op's tensor (``B`` the
activation's bytes, 4 for the fp32 upcasts, which are free when the activations are fp32):

- ``RMSNorm._norm(x.float()).type_as(x) * weight``: ``x.float()`` (read B, write 4),
  ``pow(2)`` (4, 4), ``mean(-1)`` (4), ``x * rsqrt(...)`` (4, 4), ``type_as`` (4, B),
  ``* weight`` (B, B): 36 bytes per element in bf16, 8 kernels; two per layer.
- ``apply_rotary_emb`` on Q and K: ``.float()`` (B, 4), the complex multiply (4, 4),
  ``type_as`` (4, B): 20 bytes per element in bf16, 3 kernels each.
- ``silu(w1(x)) * w3(x)``: ``silu`` (B, B) and the product (2·B, B); a plain activation
  reads and writes once.
- the residual adds ``x + attention(...)`` and ``h + feed_forward(...)``: (2·B, B) each.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float

from perfmodel.specs.model import ModelSpec, attention_shape
from perfmodel.step.select import where

FP32_BYTES = 4.0


def eager_elementwise_bytes(
    m: ModelSpec, micro_batch, tp, sequence_parallel, act_bytes, cp=1.0
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """HBM bytes and kernels of one layer's eager elementwise ops, forward, on one device.

    Args:
      m: a transformer's dimensions.
      micro_batch: sequences per microbatch (b).
      tp: tensor-parallel degree: Q, K and the MLP's hidden units are split over it.
      sequence_parallel: 1 when the norms and residual adds are split over tp too.
      act_bytes: bytes per activation element (2 for bf16; FP8 runs keep bf16 activations).
      cp: context-parallel degree: this rank holds ``b·s/cp`` tokens.

    Returns:
      ``(bytes, kernels)`` of the forward (module docstring).
    """
    B, F = act_bytes, FP32_BYTES
    T = micro_batch * m.seq_len / cp
    rep = where(sequence_parallel > 0, tp, 1.0)
    cast = where(B < F, 1.0, 0.0)  # .float() and .type_as() copy only below fp32
    norm = cast * 2.0 * (B + F) + 5.0 * F + 2.0 * B
    rope = cast * 2.0 * (B + F) + 2.0 * F
    g = 1.0 + m.gated_mlp
    act = (3.0 * g - 1.0) * B  # silu and the product (gated), or one activation
    att = attention_shape(m)
    key_dim = att.kv_exchanged / 2.0
    h = m.hidden_size
    nbytes = (
        2.0 * T * h / rep * norm
        + 2.0 * T * h / rep * 3.0 * B
        + T * (att.q_dim + key_dim) / tp * rope
        + T * m.ffn_hidden_size / tp * act
    )
    kernels = 2.0 * 8.0 + 2.0 + 2.0 * 3.0 + g
    return nbytes, jnp.asarray(kernels, jnp.float32)
