"""PyTorch's ring attention: the merge and gradient-accumulation traffic (``--cp-comm torch``).

Contract: :func:`torch_ring_ops` gives the HBM traffic and kernel count that PyTorch's context
parallelism (``torch.distributed.tensor.experimental.context_parallel``, what torchtitan runs;
``_templated_ring_attention`` and ``_templated_ring_attention_backward`` in
``torch/distributed/tensor/experimental/_attention.py``) adds to one layer's attention on one
rank, forward and backward, for one microbatch. The step model adds it to the attention's time;
it runs on the compute stream between the attention kernels, so nothing hides it. The step
function calls it only for a stack whose ``cp_comm`` is ``torch``; it is zero where ``cp = 1``.

What that code does on each rank, with ``n = cp - 1`` ring steps after the local block and
load balancing on (its default; the last rank, which merges every step in full, sets the pace):

- **Forward.** Each step's SDPA returns a 16-bit partial output and its log-sum-exp;
  ``_SDPAMerger`` (``convert_to_f32``, the default) upcasts it and merges it into an fp32
  running output with ``out - sigmoid(lse_i - lse) * (out - out_i)``, then casts the result
  back once. Unfused (eager mode) that is the upcast (read ``B``, write 4), two subtractions and
  a product over fp32 tensors (12, 8 and 12 bytes per output element): ``B + 36`` per element
  per step, 38 in bf16, plus the K/V concatenation for the exchange (read and write ``B`` per
  K/V element) every step. Compiled (``torch.compile`` traces the ring into the graph and
  Inductor fuses each step's merge into one kernel): read the running output and the partial
  one, write the running output, ``8 + B`` per element per step. Both add the first block's
  upcast and the final downcast, ``2·(B + 4)`` per element.
- **Backward.** dQ, dK and dV accumulate in fp32 (``accum_dtype``): the buffers are zeroed
  (4 bytes per element), each step's 16-bit dQ is added to dQ (``8 + B``), and the dK/dV
  buffer that arrives from the previous rank (fp32) takes this rank's half-block gradient and
  is sent on. Unfused the half-block add is an in-place add on one chunk (``(8 + B)/2`` per
  K/V element) followed by ``torch.cat`` of the chunks and ``torch.cat`` of dK and dV for the
  send (8 each), and the K/V are concatenated again for the backward's exchange (``2·B``);
  compiled, one pass reads the arriving buffer and the half-block gradient and writes the
  buffer to send (``8 + B/2``). Both end with the casts of dQ and dK/dV to 16 bits
  (``4 + B`` per element) and start with the local block's full adds (``8 + B``).

K and V reach SDPA with the query's heads (torchtitan's ``repeat_kv`` before the call, which
PyTorch's flash backend requires), so they count ``q_dim + v_dim`` elements per token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from perfmodel.specs.model import ModelSpec, attention_shape
from perfmodel.specs.strategy import Batching, Layout
from perfmodel.step.select import where
from perfmodel.step.workload import OpClass

FP32_BYTES = 4.0


def torch_ring_kv_elements(m: ModelSpec, micro_batch, tp, cp):
    """K and V elements one rank holds for PyTorch's ring (``b·s/cp`` tokens, K and V at the
    query's heads, heads split over ``tp``)."""
    att = attention_shape(m)
    return micro_batch * m.seq_len / cp * (att.q_dim + att.v_dim) / tp


def torch_ring_ops(
    m: ModelSpec, lay: Layout, bat: Batching, unfused: bool, act_bytes
) -> tuple[OpClass, OpClass]:
    """The ring's merge and accumulation kernels of one layer on one rank: ``(forward,
    backward)`` vector op classes (module docstring), empty where ``cp = 1``.

    Args:
      m: a transformer's dimensions.
      lay: the layout (``cp``, ``tp``).
      bat: the batching (``micro_batch_size``).
      unfused: each merge step is separate kernels (PyTorch eager mode) rather than one fused
        kernel (``torch.compile``).
      act_bytes: bytes of a 16-bit activation (``B``; FP8 runs keep 16-bit attention).
    """
    B, F = act_bytes, FP32_BYTES
    n = jnp.maximum(lay.cp - 1.0, 0.0)
    att = attention_shape(m)
    T = bat.micro_batch_size * m.seq_len / lay.cp
    q = T * att.q_dim / lay.tp  # queries and dQ
    o = T * att.v_dim / lay.tp  # the attention output
    kv = torch_ring_kv_elements(m, bat.micro_batch_size, lay.tp, lay.cp)
    casts = 2.0 * (B + F)

    def merges(separate: bool):
        """(forward bytes, forward kernels, backward bytes per step, backward kernels) with
        separate merge kernels or fused ones."""
        if separate:
            return (
                n * (B + 9.0 * F) * o + casts * o + n * 2.0 * B * kv,
                11.0 * n + 2.0,
                (2.0 * F + B) * q + ((2.0 * F + B) / 2.0 + 4.0 * F + 2.0 * B) * kv,
                7.0 * n + 10.0,
            )
        return (
            n * (2.0 * F + B) * o + casts * o,
            n + 2.0,
            (2.0 * F + B) * q + (2.0 * F + B / 2.0) * kv,
            2.0 * n + 7.0,
        )

    if isinstance(unfused, jax.Array):  # rows of several stacks (perfmodel.step.select.behaviour)
        costs = [where(unfused, a, b) for a, b in zip(merges(True), merges(False), strict=True)]
    else:
        costs = merges(bool(unfused))
    fwd_bytes, fwd_kernels, step, bwd_kernels = costs
    zeros = F * (q + kv)
    first = (2.0 * F + B) * (q + kv)
    last = (F + B) * (q + kv)
    bwd_bytes = zeros + first + last + n * step
    on = lay.cp > 1

    def op(nbytes, kernels):
        nbytes = where(on, nbytes, 0.0)
        return OpClass(
            flops=nbytes / F,
            bytes=nbytes,
            kernels=where(on, kernels, 0.0),
            tensor=False,
            role="vector",
        )

    return op(fwd_bytes, fwd_kernels), op(bwd_bytes, bwd_kernels)
