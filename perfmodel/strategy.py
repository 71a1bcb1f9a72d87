"""One parallel strategy as a pytree of scalar leaves (:class:`Strategy`), and its builders.

Knobs that a grid sweeps are array leaves (the :mod:`perfmodel.choices` codes for schedule, ZeRO
stage, recompute and dtype), so a batch of strategies is the same dataclass with a leading axis
(a struct of arrays): that is what :func:`perfmodel.step_time.evaluate_grid` vmaps over. User
knobs are validated in :mod:`perfmodel.knobs`; grids are enumerated in :mod:`perfmodel.grid`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from perfmodel.choices import RECOMPUTE_ALIASES, Dtype, Recompute, Schedule

SCHEDULES = Schedule.labels()
RECOMPUTE = Recompute.labels()
DTYPES = Dtype.labels()
# bytes per element of activations and of communicated tensors, indexed by Dtype code; fp8
# training keeps activations and gradients in 16-bit (Micikevicius et al. 2022, FP8 formats).
_ACT_BYTES = {Dtype.FP32: 4.0, Dtype.TF32: 4.0, Dtype.BF16: 2.0, Dtype.FP16: 2.0, Dtype.FP8: 2.0}
ACT_BYTES = tuple(_ACT_BYTES[d] for d in Dtype)
KNOBS = (
    "dp",
    "tp",
    "pp",
    "micro_batch_size",
    "num_microbatches",
    "interleave",
    "schedule",
    "zero_stage",
    "recompute",
    "sequence_parallel",
    "dtype",
    "dp_overlap",
    "fused_attention",
    "gpus_per_node",
)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Strategy:
    """Parallel degrees and choices of one strategy (scalar leaves; a grid adds an axis).

    Attributes:
      dp, tp, pp: data-, tensor- and pipeline-parallel degrees (dp·tp·pp devices).
      micro_batch_size: samples per microbatch per data-parallel replica.
      num_microbatches: microbatches per replica per optimiser step (gradient accumulation).
      interleave: model chunks per device (v); 1 unless ``schedule`` is interleaved.
      schedule: a :class:`~perfmodel.choices.Schedule` code.
      zero_stage: a :class:`~perfmodel.choices.ZeroStage` code, 0-3 (Rajbhandari et al. 2020).
      recompute: a :class:`~perfmodel.choices.Recompute` code.
      sequence_parallel: 1 to shard norms/dropouts over tp (Korthikanti et al. 2022).
      dtype: a :class:`~perfmodel.choices.Dtype` code (compute precision).
      dp_overlap: 1 to overlap the DP gradient reduction with the backward pass.
      fused_attention: 1 for a fused attention kernel (FlashAttention, Dao et al. 2022): the
        s × s scores stay on chip, so they are neither stored nor written to memory, and the
        backward pass recomputes them.
      gpus_per_node: devices that share the intra-node tier.
    """

    dp: Float[Array, "*n"]
    tp: Float[Array, "*n"]
    pp: Float[Array, "*n"]
    micro_batch_size: Float[Array, "*n"]
    num_microbatches: Float[Array, "*n"]
    interleave: Float[Array, "*n"]
    schedule: Float[Array, "*n"]
    zero_stage: Float[Array, "*n"]
    recompute: Float[Array, "*n"]
    sequence_parallel: Float[Array, "*n"]
    dtype: Float[Array, "*n"]
    dp_overlap: Float[Array, "*n"]
    fused_attention: Float[Array, "*n"]
    gpus_per_node: Float[Array, "*n"]

    @property
    def global_batch(self):
        """Samples per optimiser step: dp · micro_batch_size · num_microbatches."""
        return self.dp * self.micro_batch_size * self.num_microbatches

    @property
    def num_gpus(self):
        """Devices used: dp · tp · pp."""
        return self.dp * self.tp * self.pp


def make_strategy(
    *,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    micro_batch_size: int = 1,
    num_microbatches: int = 1,
    interleave: int = 1,
    schedule: str | int = "1f1b",
    zero_stage: int = 0,
    recompute: str | int = "none",
    sequence_parallel: bool = False,
    dtype: str | int = "bf16",
    dp_overlap: bool = True,
    fused_attention: bool = False,
    gpus_per_node: int = 8,
) -> Strategy:
    """Builds one :class:`Strategy` from Python values, without validation (see
    :func:`perfmodel.knobs.strategy_from_knobs` for user input).

    Args:
      dp, tp, pp, micro_batch_size, num_microbatches, interleave, zero_stage, gpus_per_node:
        the counts of :class:`Strategy`.
      schedule, recompute, dtype: labels (``"1f1b"``, ``"selective"``, ``"bf16"``) or codes of
        :class:`~perfmodel.choices.Schedule`, :class:`~perfmodel.choices.Recompute` (``yes``/``no``
        mean full/none) and :class:`~perfmodel.choices.Dtype`.
      sequence_parallel, dp_overlap, fused_attention: switches, stored as 0/1.

    Returns:
      A :class:`Strategy` with scalar float32 leaves.

    Raises:
      AisimError: an unknown schedule, recompute mode or dtype (``field`` names it).
    """
    vals = dict(
        dp=dp,
        tp=tp,
        pp=pp,
        micro_batch_size=micro_batch_size,
        num_microbatches=num_microbatches,
        interleave=interleave,
        schedule=Schedule.parse(schedule, "schedule"),
        zero_stage=zero_stage,
        recompute=Recompute.parse(recompute, "recompute", aliases=RECOMPUTE_ALIASES),
        sequence_parallel=float(bool(sequence_parallel)),
        dtype=Dtype.parse(dtype, "dtype"),
        dp_overlap=float(bool(dp_overlap)),
        fused_attention=float(bool(fused_attention)),
        gpus_per_node=gpus_per_node,
    )
    return Strategy(**{k: jnp.asarray(float(v), jnp.float32) for k, v in vals.items()})


def stack_strategies(columns: dict[str, np.ndarray]) -> Strategy:
    """A struct-of-arrays :class:`Strategy` from equal-length numpy columns (one per knob)."""
    n = len(next(iter(columns.values())))
    return Strategy(
        **{k: jnp.asarray(np.broadcast_to(np.asarray(columns[k], np.float32), (n,))) for k in KNOBS}
    )


def strategy_to_dict(s: Strategy) -> dict[str, object]:
    """Knobs of one (unbatched) strategy with names instead of codes, for reports."""
    v = {k: float(getattr(s, k)) for k in KNOBS}
    return {
        "dp": int(v["dp"]),
        "tp": int(v["tp"]),
        "pp": int(v["pp"]),
        "micro_batch_size": int(v["micro_batch_size"]),
        "num_microbatches": int(v["num_microbatches"]),
        "interleave": int(v["interleave"]),
        "schedule": Schedule(int(v["schedule"])).label,
        "zero_stage": int(v["zero_stage"]),
        "recompute": Recompute(int(v["recompute"])).label,
        "sequence_parallel": bool(v["sequence_parallel"]),
        "dtype": Dtype(int(v["dtype"])).label,
        "dp_overlap": bool(v["dp_overlap"]),
        "fused_attention": bool(v["fused_attention"]),
    }
