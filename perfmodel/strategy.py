"""One parallel strategy as a pytree of scalar leaves, and the codes of its discrete choices.

Knobs that a grid sweeps are array leaves (codes for schedule, recompute and dtype), so a
batch of strategies is the same dataclass with a leading axis (a struct of arrays): that is
what :func:`perfmodel.step_time.evaluate_grid` vmaps over.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from perfmodel.errors import bad_value

SCHEDULES = ("gpipe", "1f1b", "interleaved")
RECOMPUTE = ("none", "selective", "full")
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
# bytes per element of activations and of communicated tensors, by dtype code; fp8 training
# keeps activations and gradients in 16-bit (Micikevicius et al. 2022, FP8 formats).
ACT_BYTES = (4.0, 4.0, 2.0, 2.0, 2.0)
KNOBS = ("dp", "tp", "pp", "micro_batch_size", "num_microbatches", "interleave", "schedule",
         "zero_stage", "recompute", "sequence_parallel", "dtype", "dp_overlap", "gpus_per_node")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Strategy:
    """Parallel degrees and choices of one strategy (scalar leaves; a grid adds an axis).

    Attributes:
      dp, tp, pp: data-, tensor- and pipeline-parallel degrees (dp·tp·pp devices).
      micro_batch_size: samples per microbatch per data-parallel replica.
      num_microbatches: microbatches per replica per optimiser step (gradient accumulation).
      interleave: model chunks per device (v); 1 unless ``schedule`` is interleaved.
      schedule: index into :data:`SCHEDULES`.
      zero_stage: 0-3 (Rajbhandari et al. 2020).
      recompute: index into :data:`RECOMPUTE`.
      sequence_parallel: 1 to shard norms/dropouts over tp (Korthikanti et al. 2022).
      dtype: index into :data:`DTYPES` (compute precision).
      dp_overlap: 1 to overlap the DP gradient reduction with the backward pass.
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
    gpus_per_node: Float[Array, "*n"]

    @property
    def global_batch(self):
        """Samples per optimiser step: dp · micro_batch_size · num_microbatches."""
        return self.dp * self.micro_batch_size * self.num_microbatches

    @property
    def num_gpus(self):
        """Devices used: dp · tp · pp."""
        return self.dp * self.tp * self.pp


def code_of(choices: tuple[str, ...], value: str | int | float, field: str, where: str = "strategy") -> int:
    """Index of a named choice (``"1f1b"`` -> 1); integers pass through after a range check."""
    if isinstance(value, str):
        key = value.strip().lower()
        aliases = {"true": "full", "false": "none", "yes": "full", "no": "none"} if choices is RECOMPUTE else {}
        key = aliases.get(key, key)
        if key in choices:
            return choices.index(key)
        raise bad_value(where, field, value, "one of " + ", ".join(choices))
    idx = int(value)
    if not 0 <= idx < len(choices):
        raise bad_value(where, field, value, "one of " + ", ".join(choices))
    return idx


def make_strategy(
    *, dp: int = 1, tp: int = 1, pp: int = 1, micro_batch_size: int = 1,
    num_microbatches: int = 1, interleave: int = 1, schedule: str | int = "1f1b",
    zero_stage: int = 0, recompute: str | int = "none", sequence_parallel: bool = False,
    dtype: str | int = "bf16", dp_overlap: bool = True, gpus_per_node: int = 8,
) -> Strategy:
    """Builds one :class:`Strategy` from Python values (names are converted to codes)."""
    vals = dict(
        dp=dp, tp=tp, pp=pp, micro_batch_size=micro_batch_size, num_microbatches=num_microbatches,
        interleave=interleave, schedule=code_of(SCHEDULES, schedule, "schedule"),
        zero_stage=zero_stage, recompute=code_of(RECOMPUTE, recompute, "recompute"),
        sequence_parallel=float(bool(sequence_parallel)), dtype=code_of(DTYPES, dtype, "dtype"),
        dp_overlap=float(bool(dp_overlap)), gpus_per_node=gpus_per_node,
    )
    return Strategy(**{k: jnp.asarray(float(v), jnp.float32) for k, v in vals.items()})


def stack_strategies(columns: dict[str, np.ndarray]) -> Strategy:
    """A struct-of-arrays :class:`Strategy` from equal-length numpy columns (one per knob)."""
    n = len(next(iter(columns.values())))
    return Strategy(**{k: jnp.asarray(np.broadcast_to(np.asarray(columns[k], np.float32), (n,)))
                       for k in KNOBS})


def strategy_to_dict(s: Strategy) -> dict[str, object]:
    """Knobs of one (unbatched) strategy with names instead of codes, for reports."""
    v = {k: float(getattr(s, k)) for k in KNOBS}
    return {
        "dp": int(v["dp"]), "tp": int(v["tp"]), "pp": int(v["pp"]),
        "micro_batch_size": int(v["micro_batch_size"]), "num_microbatches": int(v["num_microbatches"]),
        "interleave": int(v["interleave"]), "schedule": SCHEDULES[int(v["schedule"])],
        "zero_stage": int(v["zero_stage"]), "recompute": RECOMPUTE[int(v["recompute"])],
        "sequence_parallel": bool(v["sequence_parallel"]), "dtype": DTYPES[int(v["dtype"])],
        "dp_overlap": bool(v["dp_overlap"]),
    }


def strategy_from_knobs(
    *, num_layers: int, num_heads: int, num_kv_heads: int, num_gpus: int, tp: int = 1, pp: int = 1,
    dp: int | None = None, global_batch: int | None = None, micro_batch_size: int = 1,
    num_microbatches: int | None = None, schedule: str | None = None, interleave: int = 1,
    zero_stage: int = 0, recompute: str = "none", sequence_parallel: bool = False,
    dtype: str = "bf16", dp_overlap: bool = True, gpus_per_node: int = 8, where: str = "command line",
    names: dict[str, str] | None = None,
) -> Strategy:
    """Validates user knobs and builds a :class:`Strategy` (dp = gpus / (tp·pp) when omitted).

    ``names`` maps knob names to the option or column names shown in messages.

    Raises:
      AisimError: naming the knob, the bad value and what is expected.
    """
    n = {"tp": "tp", "pp": "pp", "num_gpus": "gpus", "global_batch": "global_batch",
         "micro_batch_size": "micro_batch", "interleave": "interleave", "dp": "dp",
         "num_microbatches": "num_microbatches", "zero_stage": "zero"} | (names or {})
    for key, val in (("num_gpus", num_gpus), ("tp", tp), ("pp", pp), ("micro_batch_size", micro_batch_size),
                     ("interleave", interleave)):
        if val is None or val < 1 or int(val) != val:
            raise bad_value(where, n[key], val, "a positive integer")
    if not 0 <= zero_stage <= 3:
        raise bad_value(where, n["zero_stage"], zero_stage, "a ZeRO stage 0, 1, 2 or 3")
    if num_heads % tp or num_kv_heads % tp:
        raise bad_value(where, n["tp"], tp, f"a divisor of the number of attention heads ({num_heads}"
                        + (f") and KV heads ({num_kv_heads})" if num_kv_heads != num_heads else ")"))
    if num_gpus % (tp * pp):
        raise bad_value(where, n["tp"] + "·" + n["pp"], tp * pp, f"a divisor of {n['num_gpus']}={num_gpus}")
    if dp is None:
        dp = num_gpus // (tp * pp)
    elif dp * tp * pp != num_gpus:
        raise bad_value(where, n["dp"], dp, f"{n['num_gpus']} / (tp·pp) = {num_gpus // (tp * pp)}")
    if pp > num_layers:
        raise bad_value(where, n["pp"], pp, f"at most the number of layers ({num_layers})")
    if num_microbatches is None:
        if global_batch is None:
            global_batch = dp * micro_batch_size
        if global_batch % (dp * micro_batch_size):
            raise bad_value(where, n["global_batch"], global_batch,
                            f"a multiple of dp·micro_batch = {dp}·{micro_batch_size} = {dp * micro_batch_size}")
        num_microbatches = global_batch // (dp * micro_batch_size)
    elif global_batch is not None and global_batch != dp * micro_batch_size * num_microbatches:
        raise bad_value(where, n["global_batch"], global_batch,
                        f"dp·micro_batch·num_microbatches = {dp * micro_batch_size * num_microbatches}")
    if schedule is None:
        schedule = "interleaved" if interleave > 1 else "1f1b"
    code = code_of(SCHEDULES, schedule, "schedule", where)
    if code == 2:
        if interleave < 2:
            raise bad_value(where, n["interleave"], interleave, "at least 2 chunks for the interleaved schedule")
        if pp < 2 or num_layers % (pp * interleave):
            raise bad_value(where, n["interleave"], interleave,
                            f"a number of chunks with pp·interleave dividing the {num_layers} layers (pp={pp})")
        if num_microbatches % pp:
            raise bad_value(where, n["num_microbatches"], num_microbatches,
                            f"a multiple of pp={pp} for the interleaved schedule")
    elif interleave != 1:
        raise bad_value(where, n["interleave"], interleave, "1 unless --schedule interleaved")
    return make_strategy(dp=dp, tp=tp, pp=pp, micro_batch_size=micro_batch_size,
                         num_microbatches=num_microbatches, interleave=interleave, schedule=code,
                         zero_stage=zero_stage, recompute=code_of(RECOMPUTE, recompute, "recompute", where),
                         sequence_parallel=sequence_parallel, dtype=code_of(DTYPES, dtype, "dtype", where),
                         dp_overlap=dp_overlap, gpus_per_node=gpus_per_node)
