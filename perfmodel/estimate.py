"""One strategy, from what a user names to its result: resolve the model and the hardware
(presets, files, dimensions), validate the knobs into a :class:`~perfmodel.strategy.Strategy`,
and evaluate it under a cost model.

Contract: these are the library's front door for a single estimate (``aisim perf estimate`` is
a thin shell over :func:`estimate`). Errors are :class:`~simbase.errors.AisimError` as data:
``source=None`` and ``field`` = the name of the function's own parameter (``num_layers``,
``widths``, ``num_gpus``, ``cost_model``); a front end maps those to its own names (flags,
columns). Nothing here prints, and nothing imports ``calibration``: a calibrated profile comes
in as ``constants``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax

from perfmodel.breakdown import StepBreakdown
from perfmodel.constants import Constants
from perfmodel.cost_models import COST_MODELS, select_step_fn
from perfmodel.hardware import Hardware, load_hardware, load_hardware_file
from perfmodel.knobs import strategy_from_knobs
from perfmodel.report import results_frame, row_to_result
from perfmodel.step_time import compile_options
from perfmodel.strategy import Strategy
from perfmodel.workload import (
    Model,
    load_model,
    load_model_file,
    mlp_from_params,
    mlp_from_widths,
    model_from_dict,
    total_params,
    with_overrides,
)
from simbase.errors import AisimError, bad_value
from simbase.parse import parse_int_list

DEFAULT_MODEL = "gpt3-175b"
DEFAULT_HARDWARE = "a100-80gb"
# the dimensions a ``custom`` transformer needs, by parameter name (ModelSpec's field names)
CUSTOM_DIMENSIONS = ("num_layers", "hidden_size", "num_heads", "seq_len", "vocab_size")


def _as_argument(e: AisimError, where: str) -> AisimError:
    """An error that a loader raised about ``where`` (the text we passed it as a source), seen
    as an error about this function's arguments (``source=None``); others pass unchanged."""
    if e.source != where or e.message is not None:
        return e
    value = {"value": e.value} if e.has_value else {}
    return AisimError(field=e.field, expected=e.expected, hint=e.hint, usage=e.usage, **value)


def resolve_model(
    model: str | Model | None = None,
    *,
    model_file: str | Path | None = None,
    params: str | float | None = None,
    widths: str | list[int] | None = None,
    num_layers: int | None = None,
    hidden_size: int | None = None,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
    ffn_hidden_size: int | None = None,
    seq_len: int | None = None,
    vocab_size: int | None = None,
) -> Model:
    """A model from one of: a preset name (``"gpt3-175B"``, any case), ``"custom"`` with the
    transformer's dimensions, a model JSON file, a parameter count (the standard square,
    bias-free MLP of :func:`perfmodel.workload.mlp_from_params`) or layer widths.

    Args:
      model: a preset name, ``"custom"``, or a loaded :class:`Model` (default ``gpt3-175b``).
      model_file: a model JSON file (the schema of ``perfmodel/profiles/models``).
      params: a parameter count such as ``"60M"`` (a square MLP).
      widths: MLP layer widths, ``[784, 200, 200, 10]`` or ``"784,200,200,10"``.
      num_layers: transformer layers (overrides the model's; required for ``"custom"``).
      hidden_size: hidden size (overrides; required for ``"custom"``).
      num_heads: attention heads (overrides; required for ``"custom"``).
      num_kv_heads: key/value heads (overrides; required for ``"custom"``).
      ffn_hidden_size: MLP hidden size (overrides; required for ``"custom"``).
      seq_len: sequence length in tokens (overrides the model's).
      vocab_size: vocabulary size (overrides the model's).

    Returns:
      The :class:`Model`.

    Raises:
      AisimError: more than one model source, a dimension below 1, missing ``custom``
        dimensions, an unknown preset or a bad file.
    """
    if isinstance(model, Model):
        chosen = model
        model = None
    else:
        chosen = None
    custom = isinstance(model, str) and model.strip().lower() == "custom"
    sources = [model if not custom else None, model_file, params, widths, chosen]
    if sum(x is not None and x != "" for x in sources) > 1:
        raise AisimError(
            expected="more than one model was given",
            hint="pass only one of {model}, {model_file}, {params} and {widths}",
        )
    dims = dict(
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        ffn_hidden_size=ffn_hidden_size,
        seq_len=seq_len,
        vocab_size=vocab_size,
    )
    for k, v in dims.items():
        if v is not None and v < 1:
            raise bad_value(None, k, v, "a positive integer")
    if custom:
        return _custom_transformer(model, dims)
    if chosen is not None:
        m = chosen
    elif model_file is not None:
        m = load_model_file(model_file)
    elif params is not None:
        m = mlp_from_params(params)
    elif widths is not None:
        ws = parse_int_list(widths, "widths", minimum=1) if isinstance(widths, str) else widths
        m = _from_loader(mlp_from_widths, list(ws), "widths", shown=widths)
    else:
        m = load_model(model or DEFAULT_MODEL)
    given = {k: v for k, v in dims.items() if v is not None}
    return with_overrides(m, **given) if given else m


def _from_loader(loader, value, field: str, shown: Any) -> Model:
    """Calls a model builder; an error about the argument ``field`` shows ``shown``, the value
    as the caller gave it (the text before it was parsed)."""
    try:
        return loader(value)
    except AisimError as e:
        if e.field == field and e.source is None:
            raise bad_value(None, field, shown, e.expected, hint=e.hint) from None
        raise


def _custom_transformer(model: str, dims: dict[str, int | None]) -> Model:
    """A transformer described only by its dimensions (``model="custom"``)."""
    missing = [k for k in CUSTOM_DIMENSIONS if dims[k] is None]
    if missing:
        raise bad_value(
            None,
            "model",
            model,
            "a custom transformer's dimensions",
            hint="pass " + ", ".join("{" + k + "}" for k in missing),
        )
    doc: dict[str, Any] = {k: v for k, v in dims.items() if v is not None}
    doc.update(kind="transformer", name="custom")
    where = "custom model"
    try:
        return model_from_dict(doc, where)
    except AisimError as e:
        raise _as_argument(e, where) from None


def resolve_hardware(
    hardware: str | Hardware | None = None, hardware_file: str | Path | None = None
) -> Hardware:
    """A hardware preset by name (any case; default ``a100-80gb``), a loaded :class:`Hardware`,
    or a hardware JSON file (which wins over the name).

    Raises:
      AisimError: an unknown preset (with the closest names) or a bad file.
    """
    if hardware_file is not None:
        return load_hardware_file(hardware_file)
    if isinstance(hardware, Hardware):
        return hardware
    return load_hardware(hardware or DEFAULT_HARDWARE)


def check_cost_model(cost_model: str) -> None:
    """Raises an :class:`AisimError` (field ``cost_model``) for an unknown cost model."""
    if cost_model not in COST_MODELS:
        raise bad_value(None, "cost_model", cost_model, "one of " + ", ".join(COST_MODELS))


def gpus_per_node_of(hw: Hardware, gpus_per_node: int | None) -> int:
    """The devices per node: the argument, or the hardware preset's (field ``gpus_per_node``)."""
    gpn = int(hw.spec.gpus_per_node) if gpus_per_node is None else gpus_per_node
    if gpn < 1 or int(gpn) != gpn:
        raise bad_value(None, "gpus_per_node", gpn, "a positive integer")
    return int(gpn)


def attention_heads(model: Model) -> tuple[int, int]:
    """The (heads, KV heads) that tensor parallelism must divide; an MLP splits its hidden
    width, so both are the hidden size."""
    spec = model.spec
    if spec.kind == "transformer":
        return int(spec.num_heads), int(spec.num_kv_heads)
    return int(spec.hidden_size), int(spec.hidden_size)


@dataclasses.dataclass(frozen=True)
class Estimate:
    """One strategy evaluated under one cost model.

    Attributes:
      model, hardware: what was evaluated.
      strategy: the validated strategy (scalar leaves).
      breakdown: the step-time breakdown, throughput, MFU and memory (:class:`StepBreakdown`).
      cost_model: ``aisim`` or ``distir``.
    """

    model: Model
    hardware: Hardware
    strategy: Strategy
    breakdown: StepBreakdown
    cost_model: str

    @property
    def step_time_s(self) -> float:
        """Seconds per optimiser step."""
        return float(self.breakdown.step_time_s)

    def to_dict(self) -> dict:
        """The JSON document of the estimate (``aisim perf estimate --json``): the knobs, every
        result (:func:`perfmodel.report.row_to_result`), and ``model``, ``hardware``,
        ``cost_model`` and ``params``."""
        doc = row_to_result(results_frame(self.strategy, self.breakdown).iloc[0])
        doc.update(
            model=self.model.name,
            hardware=self.hardware.name,
            cost_model=self.cost_model,
            params=float(total_params(self.model.spec)),
        )
        return doc


def estimate(
    model: str | Model | None = None,
    hardware: str | Hardware | None = None,
    strategy: Strategy | None = None,
    *,
    constants: Constants | None = None,
    cost_model: str = "aisim",
    gpus_per_node: int | None = None,
    **knobs: Any,
) -> Estimate:
    """The step time, throughput, MFU and memory of one strategy.

    Either pass a built ``strategy`` (:func:`perfmodel.strategy.make_strategy`), or the knobs of
    :func:`~perfmodel.knobs.strategy_from_knobs`, which are validated (``num_gpus``, ``tp``,
    ``pp``, ``dp``, ``global_batch``, ``micro_batch_size``, ``num_microbatches``, ``schedule``,
    ``interleave``, ``zero_stage``, ``recompute``, ``sequence_parallel``, ``dtype``,
    ``dp_overlap``, ``fused_attention``, and today's ``cp``, ``ep``, ``etp``, ``shard_size``,
    ``recompute_layers``, ``tp_overlap``, ``grad_reduce_fp32``, ``moe_imbalance``,
    ``moe_dispatch``, ``moe_overlap``, ``cp_comm``, ``fsdp_reshard``; dp = num_gpus /
    (tp·cp·pp) when omitted; ``num_gpus`` defaults to 8; the model's experts and sequence length
    are checked against ep and cp; ``fused_attention`` defaults to the model's
    ``fused_attention_default``). Under ``cost_model="distir"`` tp need only be at most the
    number of heads, as DistIR checks it.

    Args:
      model: a preset name or a :class:`Model` (see :func:`resolve_model` for the other ways).
      hardware: a preset name or a :class:`Hardware` (default ``a100-80gb``).
      strategy: a built strategy (then no knobs may be given).
      constants: the model's constants (default: the hardware preset's; pass a calibrated
        profile's here).
      cost_model: ``aisim`` (:func:`perfmodel.step_time.step_time`) or ``distir``.
      gpus_per_node: devices per node (default: the hardware preset's).
      **knobs: the strategy's knobs, by :func:`strategy_from_knobs`'s parameter names.

    Returns:
      An :class:`Estimate` (``.breakdown`` is the :class:`StepBreakdown`; ``.to_dict()`` the
      JSON document).

    Raises:
      AisimError: with ``field`` = the parameter at fault.
    """
    check_cost_model(cost_model)
    m = model if isinstance(model, Model) else resolve_model(model)
    hw = resolve_hardware(hardware)
    if strategy is None:
        strategy = _strategy(m, hw, gpus_per_node, cost_model, knobs)
    elif knobs or gpus_per_node is not None:
        raise AisimError(
            expected="both a strategy and knobs were given",
            hint="pass {strategy} or the knobs (" + ", ".join(sorted(knobs)) + "), not both",
        )
    consts = hw.constants if constants is None else constants
    step_fn = jax.jit(select_step_fn(cost_model), compiler_options=compile_options(1))
    out = step_fn(m.spec, hw.spec, consts, strategy)
    return Estimate(m, hw, strategy, out, cost_model)


def _strategy(
    m: Model, hw: Hardware, gpus_per_node: int | None, cost_model: str, knobs: dict
) -> Strategy:
    """Validates the knobs of one strategy for this model and hardware (the model's experts
    and sequence length check ep and cp)."""
    heads, kv_heads = attention_heads(m)
    return strategy_from_knobs(
        num_layers=int(m.spec.num_layers),
        num_heads=heads,
        num_kv_heads=kv_heads,
        gpus_per_node=gpus_per_node_of(hw, gpus_per_node),
        tp_rule="distir" if cost_model == "distir" else "divides",
        **({"num_gpus": 8, "fused_attention": m.fused_attention_default} | knobs | model_limits(m)),
    )


def model_limits(m: Model) -> dict[str, int | None]:
    """What the strategy checks need to know of a model: its routed experts (``num_experts``)
    and, for a transformer, its sequence length (``seq_len``; ``None`` for an MLP)."""
    spec = m.spec
    return dict(
        num_experts=int(spec.num_experts),
        seq_len=int(spec.seq_len) if spec.kind == "transformer" else None,
    )
