"""One parallel strategy as a nested pytree (:class:`Strategy`), and its builders.

Contract: a strategy is its :class:`Layout` (parallel degrees), its :class:`Batching`
(micro-batches and the pipeline schedule) and its :class:`MemoryPlan` (ZeRO, recomputation,
sequence parallelism, dtype), whose fields are the registry's knobs
(:mod:`perfmodel.specs.knobs`) as float32 array leaves, so that a grid is the same dataclass
with a leading axis (a struct of arrays) for :func:`perfmodel.search.evaluate.evaluate_grid`
to vmap; and of two static parts that shape the compiled program: the software
:class:`~perfmodel.specs.stack.Stack` and the :class:`Scope`, what the strategies of one
program may use (context parallelism, FP8), so that a program for none compiles none of their
terms. Categorical leaves hold :mod:`perfmodel.specs.choices` codes. User input is validated
in :mod:`perfmodel.specs.validate`; grids are enumerated in :mod:`perfmodel.search.grid`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from perfmodel.specs.arrays import f32
from perfmodel.specs.choices import Dtype, Recompute, Schedule
from perfmodel.specs.knobs import BY_NAME, LEAF_KNOBS, STACK_KNOBS, canonical, knobs_of
from perfmodel.specs.stack import Stack, stack_from_values

SCHEDULES = Schedule.labels()
RECOMPUTE = Recompute.labels()
DTYPES = Dtype.labels()
# what a leaf left out of a table means when its registry default is derived (one replica, one
# microbatch, 1F1B)
_DERIVED_DEFAULTS = {"dp": 1.0, "num_microbatches": 1.0, "schedule": float(Schedule.ONE_F_ONE_B)}


def _leaf_class(name: str, home: str, summary: str, namespace: dict | None = None):
    """A frozen pytree dataclass whose fields are the registry's knobs of one ``home``."""
    knobs = knobs_of(home)
    doc = "\n".join([summary, "", "Attributes:"] + [f"  {k.name}: {k.help}" for k in knobs])
    cls = dataclasses.make_dataclass(
        name,
        [(k.name, Float[Array, "*n"]) for k in knobs],
        frozen=True,
        namespace={"__doc__": doc, **(namespace or {})},
    )
    cls.__module__ = __name__
    return jax.tree_util.register_dataclass(
        cls, data_fields=[k.name for k in knobs], meta_fields=[]
    )


Layout = _leaf_class(
    "Layout",
    "layout",
    "Parallel degrees of one strategy (ranks ordered tp-cp-dp-pp, as Megatron-Core).",
    {"num_gpus": property(lambda self: self.dp * self.tp * self.pp * self.cp)},
)
Batching = _leaf_class(
    "Batching",
    "batching",
    "How a step's samples are split into microbatches and scheduled through the pipeline.",
    {
        "chunks": property(
            lambda self: jnp.where(self.schedule == Schedule.INTERLEAVED, self.interleave, 1.0)
        )
    },
)
MemoryPlan = _leaf_class(
    "MemoryPlan",
    "memory",
    "What a strategy keeps in device memory: ZeRO sharding, recomputation, sequence "
    "parallelism and the compute dtype.",
)
PARTS = {"layout": Layout, "batching": Batching, "memory": MemoryPlan}


@dataclasses.dataclass(frozen=True)
class Scope:
    """What the strategies of one compiled program may use (static): a program whose strategies
    have no context parallelism compiles no CP terms, one without FP8 no FP8 casts. The builders
    derive it from the values (:func:`make_strategy`, :func:`stack_strategies`); the default,
    everything, is right for any strategy."""

    cp: bool = True
    fp8: bool = True

    def __or__(self, other: Scope) -> Scope:
        return Scope(cp=self.cp or other.cp, fp8=self.fp8 or other.fp8)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Strategy:
    """One strategy (scalar leaves) or a grid of them (leaves with a leading axis).

    Attributes:
      layout: parallel degrees.
      batching: micro-batches and the pipeline schedule.
      memory: ZeRO stage, recomputation, sequence parallelism and dtype.
      stack: the software stack's behaviours (static).
      scope: what the program must be able to compute (static; see :class:`Scope`).
    """

    layout: Layout
    batching: Batching
    memory: MemoryPlan
    stack: Stack = jax.tree.static(default=Stack())
    scope: Scope = jax.tree.static(default=Scope())

    @property
    def global_batch(self):
        """Samples per optimiser step: dp · micro_batch_size · num_microbatches."""
        return self.layout.dp * self.batching.micro_batch_size * self.batching.num_microbatches

    @property
    def num_gpus(self):
        """Devices used: dp · tp · pp · cp."""
        return self.layout.num_gpus


def scope_of(columns: Mapping[str, Any]) -> Scope:
    """The narrowest :class:`Scope` that covers these knob values (scalars or columns)."""
    cp = np.asarray(columns.get("cp", 1.0), np.float32)
    dtype = np.asarray(columns.get("dtype", float(Dtype.BF16)), np.float32)
    # the fp8 scope covers every sub-16-bit GEMM dtype (FP8 and FP4 share the recipe terms)
    return Scope(cp=bool(np.any(cp > 1)), fp8=bool(np.any(dtype >= Dtype.FP8)))


def leaf_codes(values: Mapping[str, Any], where: str | None = None) -> dict[str, float]:
    """Every leaf knob's float code from user values (parsed by the registry; a knob left out
    takes its registry default, or one replica, one microbatch and 1F1B where that is derived)."""
    out = {}
    for knob in LEAF_KNOBS:
        if values.get(knob.name) is not None:
            out[knob.name] = knob.code(knob.parse(values[knob.name], where))
        elif knob.default is not None:
            out[knob.name] = knob.code(knob.default)
        else:
            out[knob.name] = _DERIVED_DEFAULTS[knob.name]
    return out


def from_leaves(leaves: Mapping[str, Any], stack=None, scope: Scope | None = None) -> Strategy:
    """A strategy from every leaf knob's value by name (scalars, arrays or tracers: nothing is
    parsed or checked), a stack (default: the registry's) and a scope (default: everything)."""
    stack = Stack() if stack is None else stack
    scope = Scope() if scope is None else scope
    parts = {
        home: cls(**{k.name: leaves[k.name] for k in knobs_of(home)}) for home, cls in PARTS.items()
    }
    return Strategy(**parts, stack=stack, scope=scope)


def make_strategy(*, stack=None, **knobs: Any) -> Strategy:
    """One :class:`Strategy` from Python values, without the checks of
    :func:`perfmodel.specs.validate.strategy_from_knobs`.

    Args:
      stack: the software :class:`~perfmodel.specs.stack.Stack` (default: every behaviour at its
        registry default); stack knobs among ``knobs`` override it.
      **knobs: any registry knob by name or alias (``tp=4``, ``recompute="selective"``,
        ``eager=True``); a leaf left out takes its default.

    Returns:
      A strategy with scalar float32 leaves and the narrowest scope for its values.

    Raises:
      AisimError: an unknown knob or a bad value (``field`` names it).
    """
    values = canonical(knobs)
    stack = stack_from_values(values, stack)
    leaves = leaf_codes(values)
    # numpy scalars, not jax arrays: a jax array per leaf is a device transfer each, which
    # made building the few thousand candidate layouts of the shipped runs take seconds; jit
    # takes either, and the values are the same float32
    return from_leaves(
        {k: np.asarray(v, np.float32) for k, v in leaves.items()}, stack, scope_of(leaves)
    )


def stack_strategies(columns: Mapping[str, Any], stack=None) -> Strategy:
    """A struct-of-arrays :class:`Strategy` from equal-length numpy columns of leaf codes (a
    leaf left out takes its default), all under one ``stack``."""
    columns = canonical(columns)
    n = len(next(iter(columns.values())))
    defaults = leaf_codes({})
    leaves = {
        k.name: f32(np.broadcast_to(np.asarray(columns.get(k.name, defaults[k.name])), (n,)))
        for k in LEAF_KNOBS
    }
    present = {k: v for k, v in columns.items() if BY_NAME[k].home != "stack"}
    return from_leaves(leaves, Stack() if stack is None else stack, scope_of(present))


def leaves_of(s: Strategy) -> dict[str, Any]:
    """Every leaf of a strategy by knob name (flat)."""
    return {k.name: getattr(getattr(s, k.home), k.name) for k in LEAF_KNOBS}


def strategy_to_dict(s: Strategy) -> dict[str, object]:
    """The knobs of one (unbatched) strategy by registry name, as reports show them: numbers,
    booleans and choice labels; an automatic stack knob as the registry derives it."""
    codes = {name: np.asarray(v).item() for name, v in leaves_of(s).items()}
    out = {k.name: k.label(codes[k.name]) for k in LEAF_KNOBS}
    for k in STACK_KNOBS:
        value = getattr(s.stack, k.name)
        out[k.name] = k.label(value if value is not None or k.derive is None else
                              k.derive(codes))  # fmt: skip
    return out


def strategy_from_row(row: Mapping[str, Any]) -> Strategy:
    """The strategy of one result row (a results frame's row or a result document: every
    knob by registry name, choices by label, and the stack's ``stack`` name)."""
    knobs = {k.name: row[k.name] for k in LEAF_KNOBS + STACK_KNOBS if row.get(k.name) is not None}
    return make_strategy(stack=Stack(name=str(row.get("stack") or "custom")), **knobs)
