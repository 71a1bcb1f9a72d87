"""One strategy, from what a user names to its result: resolve the model and the hardware
(presets, files, dimensions), validate the knobs into a :class:`~perfmodel.specs.strategy.Strategy`,
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
import functools
import operator
from pathlib import Path
from typing import Any

import jax
import numpy as np

from perfmodel.plan.stack_constants import stack_constants
from perfmodel.search.evaluate import fast_jit, padded_to_power_of_two, stack_rows
from perfmodel.search.report import results_frame, row_to_result
from perfmodel.specs.choices import Dtype
from perfmodel.specs.constants import Constants
from perfmodel.specs.hardware import Hardware, load_hardware, load_hardware_file
from perfmodel.specs.knobs import BY_NAME, canonical, model_defaults
from perfmodel.specs.model import (
    Model,
    load_model,
    load_model_file,
    mlp_from_params,
    mlp_from_widths,
    model_from_dict,
    total_params,
    with_overrides,
)
from perfmodel.specs.stack_preset import load_stack
from perfmodel.specs.strategy import Strategy
from perfmodel.specs.validate import strategy_candidates
from perfmodel.step.breakdown import StepBreakdown
from perfmodel.step.cost_models import COST_MODELS, select_step_fn
from perfmodel.step.step_time import fits_device
from simbase import units
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
    bias-free MLP of :func:`perfmodel.specs.model.mlp_from_params`) or layer widths.

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


def gpus_per_node_of(hw: Hardware, gpus_per_node: Any) -> int:
    """The devices per node: the argument (a number, its text, or a list of one), or the
    hardware preset's (field ``gpus_per_node``)."""
    if isinstance(gpus_per_node, list | tuple):
        if len(gpus_per_node) != 1:
            raise bad_value(None, "gpus_per_node", gpus_per_node,
                            "one value (the hardware's scale-up domain)")  # fmt: skip
        gpus_per_node = gpus_per_node[0]
    if gpus_per_node is not None:
        gpus_per_node = BY_NAME["gpus_per_node"].parse(gpus_per_node)
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
      auto: the knobs that were ``auto`` and the value chosen for them (the least that fits).
    """

    model: Model
    hardware: Hardware
    strategy: Strategy
    breakdown: StepBreakdown
    cost_model: str
    auto: dict = dataclasses.field(default_factory=dict)

    @property
    def step_time_s(self) -> float:
        """Seconds per optimiser step."""
        return float(self.breakdown.step_time_s)

    def to_dict(self) -> dict:
        """The JSON document of the estimate (``aisim perf estimate --json``): the knobs, every
        result (:func:`perfmodel.search.report.row_to_result`), and ``model``, ``hardware``,
        ``cost_model`` and ``params``."""
        doc = row_to_result(results_frame(self.strategy, self.breakdown).iloc[0])
        doc.update(
            model=self.model.name,
            hardware=self.hardware.name,
            cost_model=self.cost_model,
            params=float(total_params(self.model.spec)),
            infeasible_because=self.infeasible_because(),
            auto=dict(self.auto),
        )
        return doc

    def infeasible_because(self) -> list[str]:
        """Why the strategy is not feasible, one reason each (empty when it is): a dtype the
        hardware has no peak for, the cost model's divisibility rules, or the memory it needs
        against the device's (with the runtime reserve)."""
        out = []
        b, spec = self.breakdown, self.hardware.spec
        if not bool(b.valid):
            dtype = Dtype(int(self.strategy.memory.dtype))
            if float(spec.peak_flops_per_s[int(dtype)]) <= 0:
                out.append(
                    f"{self.hardware.name} has no {dtype.label} peak (its data sheet lists none)"
                )
            else:
                out.append(f"the {self.cost_model} cost model's divisibility rules")
        if not bool(b.fits_memory):
            need = float(b.memory_per_device_bytes) / units.GIB
            reserve = float(spec.memory_reserve_bytes) / units.GIB
            cap = float(spec.memory_capacity_bytes) / units.GIB
            out.append(
                f"needs {need:.1f} GiB per device and a {reserve:.1f} GiB runtime reserve; "
                f"{self.hardware.name} has {cap:.1f} GiB"
            )
        return out


def estimate(
    model: str | Model | None = None,
    hardware: str | Hardware | None = None,
    strategy: Strategy | None = None,
    *,
    constants: Constants | None = None,
    cost_model: str = "aisim",
    gpus_per_node: int | None = None,
    stack=None,
    **knobs: Any,
) -> Estimate:
    """The step time, throughput, MFU and memory of one strategy.

    Either pass a built ``strategy`` (:func:`perfmodel.specs.strategy.make_strategy`), or the
    knobs of the registry (:data:`perfmodel.specs.knobs.KNOBS`, any spelling), which
    :func:`~perfmodel.specs.validate.strategy_from_knobs` validates: dp = num_gpus /
    (tp·cp·pp) when omitted; ``num_gpus`` defaults to 8; the model's experts and sequence length
    are checked against ep and cp; without a ``stack``, the knobs a model preset sets
    (:func:`~perfmodel.specs.knobs.model_defaults`: its attention kernel) default to the
    model's. Under ``cost_model="distir"`` tp need only be at most the number of heads, as
    DistIR checks it.

    Args:
      model: a preset name or a :class:`Model` (see :func:`resolve_model` for the other ways).
      hardware: a preset name or a :class:`Hardware` (default ``a100-80gb``).
      strategy: a built strategy (then no knobs may be given).
      constants: the model's constants (default: the stack preset's for this hardware, else
        the hardware preset's; pass a calibrated profile's here).
      cost_model: ``aisim`` (:func:`perfmodel.step.step_time.step_time`) or ``distir``.
      gpus_per_node: devices per node (default: the hardware preset's).
      stack: the software stack: a preset's name (``"torchtitan"``), a stack file, a
        :class:`~perfmodel.specs.stack_preset.StackPreset` (its behaviours, recipe defaults and
        constants) or a :class:`~perfmodel.specs.stack.Stack` (default: the registry's
        behaviours); stack knobs among ``knobs`` override it.
      **knobs: the strategy's knobs, by registry name or alias.

    Returns:
      An :class:`Estimate` (``.breakdown`` is the :class:`StepBreakdown`; ``.to_dict()`` the
      JSON document).

    Raises:
      AisimError: with ``field`` = the parameter at fault.
    """
    check_cost_model(cost_model)
    m = model if isinstance(model, Model) else resolve_model(model)
    hw = resolve_hardware(hardware)
    stack = load_stack(stack)
    consts = stack_constants(stack, hw).constants if constants is None else constants
    step_fn = select_step_fn(cost_model)
    if strategy is not None:
        if knobs or gpus_per_node is not None or stack is not None:
            raise AisimError(
                expected="both a strategy and knobs were given",
                hint="pass {strategy} or the knobs (" + ", ".join(sorted(knobs)) + "), not both",
            )
        out = fast_jit(step_fn)(m.spec, hw.spec, consts, strategy)
        return Estimate(m, hw, strategy, out, cost_model)
    cands = _candidates(m, hw, gpus_per_node, cost_model, knobs, stack)
    chosen, s = cands[least_that_fits(m, hw, [c[1] for c in cands])]
    out = fast_jit(step_fn)(m.spec, hw.spec, consts, s)
    auto = {k: BY_NAME[k].label(BY_NAME[k].code(v)) for k, v in chosen.items()}
    return Estimate(m, hw, s, out, cost_model, auto=auto)


# memory only, every argument per row: candidates of several jobs (models, hardware) share a
# program where their structure and stack agree
_fits = fast_jit(jax.vmap(fits_device))


def least_that_fits(m: Model, hw: Hardware, strategies: list[Strategy]) -> int:
    """The index of the first strategy that is valid and fits the device (candidates are in
    order of preference: the least recomputation, the lowest ZeRO stage first), else of the
    last (the one that needs the least memory)."""
    return least_that_fits_many([(m, hw, strategies)])[0]


def least_that_fits_many(jobs: list[tuple[Model, Hardware, list[Strategy]]]) -> list[int]:
    """:func:`least_that_fits` of each ``(model, hardware, candidates)`` job. The candidates of
    every job that share a model structure and a stack (what shapes the program) are checked
    together in one small program (memory only, no step time) with the union of their scopes,
    padded to a power of two: a few hundred jobs compile a program per structure and stack, not
    one per job, scope and size."""
    rows = [
        (j, i, m.spec, hw.spec, s)
        for j, (m, hw, strategies) in enumerate(jobs)
        if len(strategies) > 1
        for i, s in enumerate(strategies)
    ]
    groups: dict = {}
    for r in rows:
        spec, s = r[2], r[4]
        groups.setdefault((jax.tree.structure(spec), s.stack), []).append(r)
    fits = [np.zeros(len(strategies), bool) for _, _, strategies in jobs]
    for members in groups.values():
        padded = padded_to_power_of_two(members)  # one compiled program per size class
        scope = functools.reduce(operator.or_, (r[4].scope for r in members))
        batch = [dataclasses.replace(r[4], scope=scope) for r in padded]
        ok = _fits(stack_rows([r[2] for r in padded]), stack_rows([r[3] for r in padded]),
                   stack_rows(batch))  # fmt: skip
        for (j, i, *_), f in zip(members, np.asarray(ok), strict=False):
            fits[j][i] = f
    return [int(np.argmax(f)) if f.any() else len(f) - 1 for f in fits]


def _candidates(m: Model, hw: Hardware, gpus_per_node, cost_model: str, knobs: dict, stack=None):
    """The strategies the knobs mean (several where one is ``auto``), validated for this model
    and hardware (the model's experts and sequence length check ep and cp)."""
    heads, kv_heads = attention_heads(m)
    base = {"num_gpus": 8} | ({} if stack is not None else model_defaults(m))
    return strategy_candidates(
        num_layers=int(m.spec.num_layers),
        num_heads=heads,
        num_kv_heads=kv_heads,
        gpus_per_node=gpus_per_node_of(hw, gpus_per_node),
        tp_rule="distir" if cost_model == "distir" else "divides",
        stack=stack,
        **(base | {k: v for k, v in canonical(knobs).items() if v is not None} | model_limits(m)),
    )


def model_limits(m: Model) -> dict[str, int | None]:
    """What the strategy checks need to know of a model: its routed experts (``num_experts``)
    and, for a transformer, its sequence length (``seq_len``; ``None`` for an MLP)."""
    spec = m.spec
    return dict(
        num_experts=int(spec.num_experts),
        seq_len=int(spec.seq_len) if spec.kind == "transformer" else None,
    )
