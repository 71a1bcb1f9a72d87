"""Bytes per device: weights, gradients, optimiser state and activations, for one strategy.

Model states with mixed-precision Adam take 16 bytes per parameter (2 weights, 2 gradients,
12 for the fp32 master copy, momentum and variance; Rajbhandari et al. 2020, §3.1); fp32
training takes 4 + 4 + 8. ZeRO-1/2/3 shard the optimiser state, then the gradients, then the
weights over the dp ranks. Activations follow Korthikanti et al. 2022 §4: per layer and
microbatch ``s·b·h·(10 + 24/t + 5·a·s/(h·t))`` bytes with tensor parallelism, ``s·b·h·(34 +
5·a·s/h)/t`` with sequence parallelism too, selective recomputation dropping the ``5·a·s/h``
term and full recomputation keeping ``2·s·b·h`` (``/t`` with sequence parallelism). The first
pipeline stage holds ``pp`` microbatches in flight under 1F1B (``(1 + (p-1)/(p·v))`` times that
when interleaved, §4.2.3) and all ``m`` under GPipe.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from perfmodel.choices import Dtype, Recompute, Schedule, ZeroStage
from perfmodel.strategy import ACT_BYTES, Strategy
from perfmodel.workload import ModelSpec, embedding_params, head_params, layer_params


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per device on the most loaded (first) pipeline stage."""

    weights_bytes: Float[Array, ""]
    gradients_bytes: Float[Array, ""]
    optimizer_bytes: Float[Array, ""]
    activations_bytes: Float[Array, ""]
    total_bytes: Float[Array, ""]


def layers_per_stage(m: ModelSpec, s: Strategy) -> Float[Array, ""]:
    """Layers on the most loaded stage: ``ceil(L / pp)`` (uneven stages allowed)."""
    return jnp.ceil(m.num_layers / s.pp)


def stage_params(m: ModelSpec, s: Strategy) -> Float[Array, ""]:
    """Parameters held by one device of the first stage (layers and embeddings split over tp)."""
    first = layers_per_stage(m, s) * layer_params(m) + embedding_params(m)
    # with a single stage the output head (if untied) and final norm live here too
    first = first + jnp.where(s.pp <= 1, head_params(m), 0.0)
    return first / s.tp


def model_state_bytes_per_param(
    dtype_code,
) -> tuple[Float[Array, ""], Float[Array, ""], Float[Array, ""]]:
    """(weights, gradients, optimiser) bytes per parameter: 2/2/12 mixed, 4/4/8 in fp32/tf32."""
    full = (dtype_code == Dtype.FP32) | (dtype_code == Dtype.TF32)
    return (jnp.where(full, 4.0, 2.0), jnp.where(full, 4.0, 2.0), jnp.where(full, 8.0, 12.0))


def activation_bytes_per_layer(m: ModelSpec, s: Strategy) -> Float[Array, ""]:
    """Korthikanti et al. 2022 §4 activation bytes of one layer for one microbatch."""
    act_b = jnp.asarray(ACT_BYTES, jnp.float32)[s.dtype.astype(jnp.int32)]
    scale = act_b / 2.0  # the paper counts 16-bit activations
    b, t = s.micro_batch_size, s.tp
    if m.kind == "mlp":
        # each linear layer keeps its input (act_b bytes) and a 1-byte ReLU mask
        width = (m.input_size + (m.num_layers - 1.0) * m.hidden_size) / m.num_layers
        return b * width * (act_b + 1.0) / t
    sbh = m.seq_len * b * m.hidden_size
    # the softmax output, its dropout mask and the dropout output (5·a·s/h per s·b·h); a fused
    # attention kernel keeps none of them (only a row statistic of a·s·b floats, left out here)
    attn = jnp.where(s.fused_attention > 0, 0.0, 5.0 * m.num_heads * m.seq_len / m.hidden_size)
    sp = s.sequence_parallel > 0
    none_ = jnp.where(sp, sbh * (34.0 + attn) / t, sbh * (10.0 + 24.0 / t + attn / t))
    selective = jnp.where(sp, sbh * 34.0 / t, sbh * (10.0 + 24.0 / t))
    full = jnp.where(sp, 2.0 * sbh / t, 2.0 * sbh)
    per_layer = jnp.where(
        s.recompute == Recompute.FULL,
        full,
        jnp.where(s.recompute == Recompute.SELECTIVE, selective, none_),
    )
    return per_layer * scale


def in_flight_microbatches(s: Strategy) -> Float[Array, ""]:
    """Microbatches whose activations the first stage holds at its peak, by schedule."""
    pp, m, v = s.pp, s.num_microbatches, s.interleave
    one_f_one_b = jnp.minimum(pp, m)
    interleaved = one_f_one_b * (1.0 + (pp - 1.0) / (pp * v))
    gpipe = m
    return jnp.where(
        pp <= 1,
        1.0,
        jnp.where(
            s.schedule == Schedule.GPIPE,
            gpipe,
            jnp.where(s.schedule == Schedule.INTERLEAVED, interleaved, one_f_one_b),
        ),
    )


def memory_per_device(m: ModelSpec, s: Strategy) -> MemoryBreakdown:
    """Bytes per device of the first pipeline stage (the peak), by part.

    Model states per parameter from :func:`model_state_bytes_per_param`, each divided by dp
    once ZeRO partitions it (Rajbhandari et al. 2020); activations from
    :func:`activation_bytes_per_layer` (Korthikanti et al. 2022 §4) times the stage's layers
    times the microbatches in flight, plus the fp32 logits when one stage holds the whole model.

    Args:
      m: model dimensions.
      s: one strategy (scalar leaves; vmap for many).

    Returns:
      A :class:`MemoryBreakdown` in bytes.
    """
    p = stage_params(m, s)
    w_b, g_b, o_b = model_state_bytes_per_param(s.dtype)
    z = s.zero_stage
    # ZeRO stage k partitions the first k of (optimiser, gradients, weights) over dp
    weights = p * w_b / jnp.where(z >= ZeroStage.PARAMETERS, s.dp, 1.0)
    grads = p * g_b / jnp.where(z >= ZeroStage.GRADIENTS, s.dp, 1.0)
    opt = p * o_b / jnp.where(z >= ZeroStage.OPTIMIZER, s.dp, 1.0)
    acts = activation_bytes_per_layer(m, s) * layers_per_stage(m, s) * in_flight_microbatches(s)
    if m.kind == "transformer":
        # logits and their fp32 softmax (4·s·b·V/t, Korthikanti §4.3) when the first stage is also last
        logits = 4.0 * m.seq_len * s.micro_batch_size * m.vocab_size / s.tp
        acts = acts + jnp.where(s.pp <= 1, logits, 0.0)
    total = weights + grads + opt + acts
    return MemoryBreakdown(
        weights_bytes=weights,
        gradients_bytes=grads,
        optimizer_bytes=opt,
        activations_bytes=acts,
        total_bytes=total,
    )
