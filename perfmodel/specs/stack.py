"""A software stack: what a training framework does that the parallel layout does not say.

Contract: :class:`Stack` is one frozen, hashable value whose fields are the registry's ``stack``
knobs (:data:`perfmodel.specs.knobs.STACK_KNOBS`: the attention kernel, eager or compiled
elementwise ops, the loss's logit bytes, the FSDP policy, master weights and gradient reduction
dtype, the selective-recomputation modules, the overlaps, the MoE dispatcher and the
context-parallel exchange). It is part of a compiled program's structure, not a traced leaf:
the step function branches on it in Python, so one stack compiles one kernel choice, and
different stacks are different sweep points, like hardware. Its ``name`` is for reports only
(two stacks that behave alike compare equal and share a compiled program).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from perfmodel.specs.knobs import BY_NAME, STACK_KNOBS, canonical
from simbase.errors import bad_value


def _replace(self, where: str | None = None, **changes: Any):
    """The stack with some behaviours changed; values are parsed and checked by the registry
    (``"fa2"``, ``"on"``, ``True``...), names may be any accepted spelling.

    Raises:
      AisimError: an unknown knob, a knob that is not a stack behaviour, or a bad value.
    """
    parsed = {}
    for name, value in canonical(changes, where).items():
        knob = BY_NAME[name]
        if knob.home != "stack" and name != "name":
            raise bad_value(where, name, value, "a software-stack behaviour")
        parsed[name] = knob.parse(value, where)
    return dataclasses.replace(self, **parsed)


def _to_dict(self) -> dict[str, Any]:
    """The stack's behaviours as reports and ``--json`` show them (``name`` first)."""
    return {"name": self.name} | {k.name: k.label(getattr(self, k.name)) for k in STACK_KNOBS}


def _doc() -> str:
    lines = [__doc__.split("\n\n")[0].strip(), "", "Attributes:", "  name: for reports only."]
    lines += [f"  {k.name}: {k.help}" for k in STACK_KNOBS]
    return "\n".join(lines)


Stack = dataclasses.make_dataclass(
    "Stack",
    [("name", str, dataclasses.field(default="custom", compare=False))]
    + [(k.name, Any, dataclasses.field(default=k.default)) for k in STACK_KNOBS],
    frozen=True,
    namespace={"replace": _replace, "to_dict": _to_dict, "__doc__": _doc()},
)
Stack.__module__ = __name__


def stack_from_values(values: Mapping[str, Any], base=None, where: str | None = None):
    """A :class:`Stack` from the stack knobs among ``values`` (others are ignored), over
    ``base`` (default: every behaviour at its registry default)."""
    base = Stack() if base is None else base
    picked = {k: v for k, v in canonical(values, where).items() if BY_NAME[k].home == "stack"}
    return base.replace(where, **picked) if picked else base
