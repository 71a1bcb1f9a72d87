"""User knobs -> one validated :class:`~perfmodel.specs.strategy.Strategy` (the boundary check).

Contract: :func:`strategy_from_knobs` takes the knobs a person types (a command line, a CSV row,
a notebook cell) under any spelling of the registry (:mod:`perfmodel.specs.knobs`), parses and
range-checks each there, checks the layout against the model and the GPU count, applies each
knob's ``requires`` rule, derives what was left out (``dp``, ``num_microbatches``, the
schedule) and builds the pytree. A bad knob raises one :class:`~simbase.errors.AisimError` with
``source=None`` and ``field`` set to the knob's registry name (``num_gpus``, ``tp``,
``micro_batch_size``, ...); the caller relabels it (a CLI flag, a CSV column) and names the
source. Nothing here knows who called it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from perfmodel.specs.choices import Recompute, Schedule, ZeroStage
from perfmodel.specs.knobs import BY_NAME, KNOBS, canonical
from perfmodel.specs.stack import Stack, stack_from_values
from perfmodel.specs.stack_preset import AUTO, StackPreset
from perfmodel.specs.strategy import Strategy, make_strategy
from simbase.errors import AisimError, bad_value

TP_RULES = ("divides", "distir")


def _check_positive(**values: int | None) -> None:
    """Each value is a positive integer, or raise naming its field."""
    for field, val in values.items():
        if val is None or val < 1 or int(val) != val:
            raise bad_value(None, field, val, "a positive integer")


def _check_tp(tp: int, num_heads: int, num_kv_heads: int, tp_rule: str) -> None:
    """tp splits attention: it divides the heads and KV heads (Megatron's split, Shoeybi et al.
    2019 §3), or, under DistIR's rule, is at most the number of heads."""
    if tp_rule == "distir":
        if tp > num_heads:
            raise bad_value(
                None,
                "tp",
                tp,
                f"at most the number of attention heads ({num_heads}; DistIR's rule)",
            )
    elif num_heads % tp or num_kv_heads % tp:
        raise bad_value(
            None,
            "tp",
            tp,
            f"a divisor of the number of attention heads ({num_heads}"
            + (f") and KV heads ({num_kv_heads})" if num_kv_heads != num_heads else ")"),
        )


def _derive_dp(num_gpus: int, tp: int, pp: int, dp: int | None, cp: int = 1) -> int:
    """dp = num_gpus / (tp·cp·pp), after checking that tp·cp·pp divides the GPU count
    (Megatron-Core's rank order tp-cp-dp-pp)."""
    model_parallel = tp * cp * pp
    names = "tp·pp" if cp == 1 else "tp·cp·pp"
    if num_gpus % model_parallel:
        if num_gpus % tp:
            field, value = "tp", tp
        elif num_gpus % (tp * cp):
            field, value = "cp", cp
        else:
            field, value = "pp", pp
        degrees = f"{tp}·{pp}" if cp == 1 else f"{tp}·{cp}·{pp}"
        raise bad_value(
            None,
            field,
            value,
            f"{names} dividing the number of GPUs",
            hint=f"{names} = {degrees} = {model_parallel} is not a divisor of "
            f"{{num_gpus}}={num_gpus}",
        )
    if dp is None:
        return num_gpus // model_parallel
    if dp * model_parallel != num_gpus:
        raise bad_value(
            None, "dp", dp, f"the number of GPUs / ({names}) = {num_gpus // model_parallel}"
        )
    return dp


def _check_cp(cp: int, seq_len: int | None) -> None:
    """Load-balanced causal context parallelism cuts the sequence into 2·cp chunks, two per
    rank (Megatron-Core's ``get_batch_on_this_cp_rank``), so 2·cp divides the sequence."""
    if cp > 1 and seq_len is not None and seq_len % (2 * cp):
        raise bad_value(
            None,
            "cp",
            cp,
            f"a degree with 2·cp dividing the sequence length ({seq_len} tokens): each rank "
            "takes two of 2·cp load-balanced chunks",
        )


def _check_experts(ep: int, etp: int, num_experts: int, tp: int, cp: int, dp: int) -> None:
    """Expert parallelism folds into a stage's tp·cp·dp ranks (Megatron-Core's MoE parallel
    folding): ep divides the routed experts and ep·etp divides tp·cp·dp; a dense model has
    ep = etp = 1."""
    if num_experts < 1:
        for field, val in (("ep", ep), ("etp", etp)):
            if val != 1:
                raise bad_value(None, field, val, "1: the model has no experts (num_experts = 0)")
        return
    if num_experts % ep:
        raise bad_value(None, "ep", ep, f"a divisor of the {num_experts} routed experts")
    ranks = tp * cp * dp
    if ranks % (ep * etp):
        field, value = ("ep", ep) if ranks % ep else ("etp", etp)
        raise bad_value(
            None,
            field,
            value,
            f"ep·etp dividing the tp·cp·dp = {tp}·{cp}·{dp} = {ranks} ranks of a stage",
            hint=f"ep·etp = {ep}·{etp} = {ep * etp}",
        )


def _check_shard(shard_size: int, zero: ZeroStage, dp: int, cp: int) -> None:
    """An HSDP shard group (0 = every dp·cp rank) needs ZeRO-3 and divides dp·cp."""
    if shard_size < 0 or int(shard_size) != shard_size:
        raise bad_value(None, "shard_size", shard_size, "0 (all dp·cp ranks) or a positive integer")
    if shard_size == 0:
        return
    if zero != ZeroStage.PARAMETERS:
        raise bad_value(
            None,
            "shard_size",
            shard_size,
            "0 unless the ZeRO stage is 3: only ZeRO-3/FSDP shards parameters within groups",
        )
    if (dp * cp) % shard_size:
        raise bad_value(
            None, "shard_size", shard_size, f"a divisor of dp·cp = {dp}·{cp} = {dp * cp}"
        )


def _check_recompute_layers(
    recompute_layers: int, recompute: Recompute, num_layers: int, pp: int
) -> None:
    """Partial full recomputation (Megatron's ``--recompute-num-layers``) recomputes at most the
    layers of the busiest stage (ceil(L/pp) with uneven stages); 0 means all of them."""
    if recompute_layers < 0 or int(recompute_layers) != recompute_layers:
        raise bad_value(
            None, "recompute_layers", recompute_layers, "0 (every layer) or a positive integer"
        )
    if recompute_layers == 0:
        return
    if recompute != Recompute.FULL:
        raise bad_value(None, "recompute_layers", recompute_layers, "0 unless recompute is full")
    per_stage = -(-num_layers // pp)
    if recompute_layers > per_stage:
        raise bad_value(
            None,
            "recompute_layers",
            recompute_layers,
            f"at most the {per_stage} layers of a stage ({num_layers} layers, pp={pp})",
        )


def _derive_microbatches(
    dp: int, micro_batch_size: int, global_batch: int | None, num_microbatches: int | None
) -> int:
    """num_microbatches = global_batch / (dp·micro_batch_size) (gradient accumulation steps)."""
    if num_microbatches is None:
        if global_batch is None:
            global_batch = dp * micro_batch_size
        if global_batch % (dp * micro_batch_size):
            raise bad_value(
                None,
                "global_batch_size",
                global_batch,
                f"a multiple of dp·micro_batch_size = {dp}·{micro_batch_size} = "
                f"{dp * micro_batch_size}",
            )
        return global_batch // (dp * micro_batch_size)
    if global_batch is not None and global_batch != dp * micro_batch_size * num_microbatches:
        raise bad_value(
            None,
            "global_batch_size",
            global_batch,
            f"dp·micro_batch_size·num_microbatches = {dp * micro_batch_size * num_microbatches}",
        )
    return num_microbatches


# Megatron-Bridge's performance recipes split each pipeline stage into virtual stages of one to
# four layers, two in the middle (docs/performance-summary-archive.md, 26.02 and 25.11 tables:
# Llama 3 70B pp 4 vp 5, Llama 3.1 405B pp 8 vp 8 and pp 16 vp 4-8, Qwen3-235B pp 4 vp 12 and
# pp 8 vp 3-4, DeepSeek-V3 pp 4 vp 4, Qwen3-30B pp 2 vp 24)
LAYERS_PER_VIRTUAL_STAGE = 2
RULED = ("interleave",)  # knobs whose ``auto`` is a rule, chosen without a memory estimate


def recipe_interleave(pp: int, num_layers: int, num_microbatches: int) -> int:
    """``interleave`` = ``auto``: the most virtual stages per device that leave each at least
    :data:`LAYERS_PER_VIRTUAL_STAGE` layers, as the recipes split a pipeline stage; 1 (plain
    1F1B) without pipeline parallelism, when no such split has two stages, or when the
    microbatches are not a multiple of pp (the interleaved schedule needs it)."""
    if pp < 2 or num_microbatches % pp:
        return 1
    v = num_layers // (pp * LAYERS_PER_VIRTUAL_STAGE)
    return v if v >= 2 else 1


def _check_schedule(
    schedule: Schedule, interleave: int, pp: int, num_layers: int, num_microbatches: int
) -> None:
    """The interleaved 1F1B schedule (Narayanan et al. SC21 §2.2.2) needs pp > 1, v >= 2 chunks,
    no more pp·v chunks than the layers plus the embedding and the loss (an uneven split is a
    custom Megatron-Core ``--pipeline-model-parallel-layout``), and a multiple of pp
    microbatches; other schedules have v = 1."""
    if schedule == Schedule.INTERLEAVED:
        if interleave < 2:
            raise bad_value(
                None, "interleave", interleave, "at least 2 chunks for the interleaved schedule"
            )
        # every chunk holds a layer, the embedding or the loss, as the step model's validity
        chunks = pp * interleave
        if pp < 2 or chunks > num_layers + 2:
            raise bad_value(
                None,
                "interleave",
                interleave,
                f"at most {num_layers + 2} chunks in all (pp·interleave, pp={pp}): the "
                f"{num_layers} layers, the embedding and the loss",
            )
        if num_microbatches % pp:
            raise bad_value(
                None,
                "num_microbatches",
                num_microbatches,
                f"a multiple of pp={pp} for the interleaved schedule",
            )
    elif interleave != 1:
        raise bad_value(None, "interleave", interleave, "1 unless the schedule is interleaved")


def check_requirements(values: Mapping[str, Any], where: str | None = None) -> None:
    """Each knob that differs from its registry default meets its ``requires`` rule.

    Args:
      values: every knob's parsed value (choices as members, switches as booleans).
      where: the error's source.

    Raises:
      AisimError: naming the first knob whose rule fails and what it needs.
    """
    for knob in KNOBS:
        if knob.requires is None or knob.name not in values:
            continue
        value = values[knob.name]
        if value == knob.default or (knob.default is False and not value):
            continue
        rule, expected = knob.requires
        if not bool(rule(values)):
            raise bad_value(where, knob.name, knob.text(value), expected)


def strategy_from_knobs(
    *,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    stack=None,
    tp_rule: str = "divides",
    num_experts: int = 0,
    seq_len: int | None = None,
    **knobs: Any,
) -> Strategy:
    """Validates user knobs and builds one :class:`~perfmodel.specs.strategy.Strategy`.

    Args:
      num_layers: the model's layers.
      num_heads: the model's attention heads (an MLP: its hidden size, since its
        tensor-parallel split is over the hidden units).
      num_kv_heads: the model's key/value heads (an MLP: its hidden size).
      stack: a :class:`~perfmodel.specs.stack.Stack`, or a
        :class:`~perfmodel.specs.stack_preset.StackPreset` whose recipe defaults fill the knobs
        not given and whose behaviours resolve for this strategy; stack knobs among ``knobs``
        override it (default: the registry's behaviours).
      tp_rule: ``"divides"`` (tp divides the heads and KV heads: Megatron's attention split,
        aisim's model) or ``"distir"`` (at most the number of heads, as DistIR's GPT-2
        transform checks it).
      num_experts: the model's routed experts (0: dense), for the ep checks.
      seq_len: the model's sequence length in tokens, for the cp check (``None``: unchecked).
      **knobs: any registry knob (:data:`perfmodel.specs.knobs.KNOBS`) by name or alias:
        ``num_gpus`` (default 8; dp·tp·pp·cp must equal it), ``global_batch_size`` (default
        ``dp·micro_batch_size`` or ``dp·micro_batch_size·num_microbatches``), ``dp`` (default
        ``num_gpus / (tp·cp·pp)``), ``num_microbatches`` (from the global batch), ``schedule``
        (default interleaved when ``interleave > 1``, else 1F1B), and the others at the stack's
        recipe default, else the registry's. ``None`` means "not given".

    Returns:
      A :class:`~perfmodel.specs.strategy.Strategy` with scalar float32 leaves.

    Raises:
      AisimError: with ``source=None``, ``field`` = the knob's registry name, the bad value and
        what is expected (a ``hint`` may name other fields as ``{field}`` placeholders); also
        when a knob is ``auto`` (the least that fits needs a memory estimate:
        :func:`strategy_candidates` and :func:`perfmodel.estimate`).
    """
    cands = strategy_candidates(
        num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads, stack=stack,
        tp_rule=tp_rule, num_experts=num_experts, seq_len=seq_len, **knobs,
    )  # fmt: skip
    estimated = [k for k in cands[0][0] if k not in RULED]
    if len(cands) > 1 or estimated:
        name = estimated[0]
        raise bad_value(None, name, "auto", "a value: 'auto' is chosen by a memory estimate",
                        hint="use perfmodel.estimate, which picks the least that fits")  # fmt: skip
    return cands[0][1]


def strategy_candidates(
    *,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    stack=None,
    tp_rule: str = "divides",
    num_experts: int = 0,
    seq_len: int | None = None,
    **knobs: Any,
) -> list[tuple[dict[str, Any], Strategy]]:
    """The strategies a user's knobs can mean: one, or, where a knob is ``auto`` (given, or
    the stack's recipe default), one per value it tries (:attr:`~perfmodel.specs.knobs.Knob.
    auto`), the least memory-hungry last, each with the values chosen (``{"recompute":
    Recompute.SELECTIVE}``). Arguments as :func:`strategy_from_knobs`; a candidate that breaks a
    rule its auto values bring (``recompute_layers`` needs full recomputation) is left out.
    """
    if tp_rule not in TP_RULES:
        raise bad_value(None, "tp_rule", tp_rule, "one of " + ", ".join(TP_RULES))
    given = {k: BY_NAME[k].parse(v) for k, v in canonical(knobs).items() if v is not None}
    preset = stack if isinstance(stack, StackPreset) else None
    values = _with_defaults(given, preset)
    autos = [k for k in ("zero_stage", "recompute") if values.get(k) == AUTO]
    partial = values.get("recompute_layers") == AUTO
    if partial:  # auto only when the recomputation is; a chosen "full" recomputes every layer
        values["recompute_layers"] = 0
        partial = "recompute" in autos
    if not autos:
        s = _build(values, given, preset, stack, num_layers, num_heads, num_kv_heads, tp_rule,
                   num_experts, seq_len)  # fmt: skip
        return [(_ruled(values, s), s)]
    out, last_error = [], None
    for chosen in _auto_combos(values, autos, num_layers, partial):
        try:
            s = _build(values | chosen, given, preset, stack, num_layers, num_heads,
                       num_kv_heads, tp_rule, num_experts, seq_len)  # fmt: skip
        except AisimError as e:
            last_error = e
            continue
        out.append((chosen | _ruled(values, s), s))
    if not out:
        raise last_error
    return out


def _auto_combos(values: dict[str, Any], autos: list[str], num_layers: int, partial: bool):
    """The auto knobs' values to try, least recomputation first: with ``partial`` (the stack's
    ``recompute_layers`` is auto: Megatron-Core's block method, ``--recompute-num-layers``), full
    recomputation of 1, 2, ... layers per stage before all of them."""
    per_stage = -(-num_layers // int(values["pp"]))
    for combo in itertools.product(*(BY_NAME[k].auto for k in autos)):
        chosen = dict(zip(autos, combo, strict=True))
        if partial and chosen.get("recompute") == Recompute.FULL:
            yield from (chosen | {"recompute_layers": k} for k in range(1, per_stage))
        yield chosen


def _codes(known: dict[str, Any]) -> dict[str, Any]:
    """The strategy codes of the knobs with a value (not ``auto``) among ``known``."""
    return {k: BY_NAME[k].code(v) for k, v in known.items() if v is not None and v != AUTO}


def _ruled(values: dict[str, Any], s: Strategy) -> dict[str, Any]:
    """The values a rule chose for the knobs that were ``auto`` by rule (:func:`recipe_interleave`),
    to be reported with the ones the memory estimate chose."""
    return {"interleave": int(s.batching.interleave)} if values.get("interleave") == AUTO else {}


def _with_defaults(given: dict[str, Any], preset) -> dict[str, Any]:
    """The given knobs, then the preset's recipe defaults (their conditions read the knobs
    known so far), then the registry's."""
    values = dict(given)
    if preset is not None:
        # twice: a default's condition reads the preset's own defaults (the 1F1B schedule is
        # the default only where the interleave is 1, not where the preset leaves it to auto)
        first = preset.default_values(_codes({k.name: given.get(k.name, k.default) for k in KNOBS}))
        known = {k.name: given.get(k.name, first.get(k.name, k.default)) for k in KNOBS}
        for k, v in preset.default_values(_codes(known)).items():
            values.setdefault(k, v)
    for knob in KNOBS:
        if knob.name not in values and knob.default is not None:
            values[knob.name] = knob.default
    return values


def _build(v, given, preset, stack, num_layers, num_heads, num_kv_heads, tp_rule, experts, seq):
    """One validated strategy from complete knob values (the checks of the module)."""
    v = dict(v)
    tp, pp, cp = v["tp"], v["pp"], v["cp"]
    _check_tp(tp, num_heads, num_kv_heads, tp_rule)
    _check_cp(cp, seq)
    v["dp"] = _derive_dp(v["num_gpus"], tp, pp, v.get("dp"), cp)
    if pp > num_layers:
        raise bad_value(None, "pp", pp, f"at most the number of layers ({num_layers})")
    _check_experts(v["ep"], v["etp"], experts, tp, cp, v["dp"])
    _check_shard(v["shard_size"], ZeroStage(v["zero_stage"]), v["dp"], cp)
    _check_recompute_layers(v["recompute_layers"], Recompute(v["recompute"]), num_layers, pp)
    if "micro_batch_size" not in given and v.get("global_batch_size"):
        per_replica = int(v["global_batch_size"]) // int(v["dp"]) or 1
        if v.get("num_microbatches"):  # the recipe's microbatch count sets the micro-batch
            v["micro_batch_size"] = max(per_replica // int(v["num_microbatches"]), 1)
        else:  # a recipe's micro-batch that does not divide this replica's batch: the largest
            v["micro_batch_size"] = max(
                d for d in range(1, int(v["micro_batch_size"]) + 1) if per_replica % d == 0
            )
    v["num_microbatches"] = _derive_microbatches(
        v["dp"], v["micro_batch_size"], v.get("global_batch_size"), v.get("num_microbatches")
    )
    if v["interleave"] == AUTO:
        v["interleave"] = recipe_interleave(pp, num_layers, v["num_microbatches"])
    if v.get("schedule") is None:
        v["schedule"] = Schedule.INTERLEAVED if v["interleave"] > 1 else Schedule.ONE_F_ONE_B
    _check_schedule(v["schedule"], v["interleave"], pp, num_layers, v["num_microbatches"])
    leaves = {k.name: v[k.name] for k in KNOBS if k.home in ("layout", "batching", "memory")}
    base = stack if isinstance(stack, Stack) else None
    if preset is not None:
        base = preset.stack_for({k: BY_NAME[k].code(x) for k, x in leaves.items()})
    explicit = {k: x for k, x in given.items() if BY_NAME[k].home == "stack"}
    if preset is not None:  # a recipe default for a behaviour (fused attention) is one too
        explicit = {k: x for k, x in v.items() if BY_NAME[k].home == "stack" and k in given}
    final = stack_from_values(explicit, base)
    check_requirements(v | {k.name: getattr(final, k.name) for k in KNOBS if k.home == "stack"})
    return make_strategy(stack=final, **leaves)
