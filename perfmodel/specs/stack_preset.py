"""Software-stack presets: what a training framework does, as data (``profiles/stacks/*.json``).

Contract: :func:`load_stack` reads a stack document (schema ``aisim.stack/1``; a shipped preset
by name, a variant as ``NAME@VARIANT``, or a file) into a :class:`StackPreset`:

- ``behaviours``: each stack knob of the registry, a value or ``cases`` (``when`` conditions
  on the layout and memory knobs, first match wins, the last case unconditional), every one
  citing the framework's source;
- ``defaults``: the recipe defaults a framework applies when the user does not choose (a
  value, maybe only ``when`` a condition holds, ``auto`` for "the least that fits in memory",
  and ``choices``: what the framework can run at all, which a grid searches);
- ``variants``: named releases or front ends whose behaviours or defaults differ
  (``torchtitan@2024-12``);
- ``aliases`` (of the stack and of each variant) and ``covers``: the frameworks' own names a
  user may give instead (``nemo`` is ``megatron-core@nemo``, ``megatron-lm`` and ``fsdp`` name
  ``megatron-core`` and ``pytorch-fsdp``; :func:`stack_preset_name`);
- ``constants``: the calibrated constants of the stack on each hardware preset, fitted or
  carried over with a stated reason.

A preset resolves to one static :class:`~perfmodel.specs.stack.Stack` per strategy
(:meth:`StackPreset.stack_for`) or per group of a grid's rows (:meth:`StackPreset.partition`).
A bad document raises :class:`~simbase.errors.AisimError` naming the file and the entry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import operator
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from perfmodel.specs.knobs import BY_NAME, KNOBS, PARALLEL_DEGREES, STACK_KNOBS
from perfmodel.specs.names import normalise
from perfmodel.specs.stack import Stack
from simbase.errors import bad_value, suggest
from simbase.io import read_json

STACK_SCHEMA = "aisim.stack/1"
AUTO = "auto"
# the key of a constants block that holds the carried-over scatter, not a hardware preset's fit
CARRIED = "carried_over"
OPERATORS = {
    "==": operator.eq, "!=": operator.ne, ">=": operator.ge, "<=": operator.le,
    ">": operator.gt, "<": operator.lt,
}  # fmt: skip
# the knobs a condition may test: the layout and memory plan, never another behaviour
CONDITION_KNOBS = tuple(k.name for k in KNOBS if k.home in ("layout", "batching", "memory"))


@dataclasses.dataclass(frozen=True)
class Condition:
    """Tests on knob values that must all hold: ``(knob, operator, code)``."""

    tests: tuple[tuple[str, str, float], ...]

    def holds(self, codes: Mapping[str, Any]) -> Any:
        """Whether it holds for knob codes (scalars: a bool; numpy columns: a mask)."""
        out: Any = True
        for knob, op, code in self.tests:
            out = out & OPERATORS[op](np.asarray(codes[knob], np.float64), code)
        return out

    def text(self) -> str:
        return " and ".join(f"{k} {op} {BY_NAME[k].text(c)}" for k, op, c in self.tests)


def _condition(when: Any, where: str) -> Condition:
    if not isinstance(when, dict) or not when:
        raise bad_value(where, "when", when, "an object of knob: '<op><value>' tests")
    tests = []
    for knob, test in when.items():
        if knob not in CONDITION_KNOBS:
            raise bad_value(where, "when", knob, "a layout or memory knob")
        text = str(test).strip()
        op = next((o for o in ("==", "!=", ">=", "<=", ">", "<") if text.startswith(o)), None)
        if op is None:
            raise bad_value(where, f"when.{knob}", test, "an operator and a value, e.g. '>1'")
        value = BY_NAME[knob].parse(text[len(op) :].strip(), where)
        tests.append((knob, op, BY_NAME[knob].code(value)))
    return Condition(tuple(tests))


@dataclasses.dataclass(frozen=True)
class Rule:
    """A knob whose value depends on the strategy: ``(condition, value)`` cases in order, the
    last one's condition ``None`` (it always holds)."""

    knob: str
    cases: tuple[tuple[Condition | None, Any], ...]

    def value(self, codes: Mapping[str, Any]) -> Any:
        for cond, value in self.cases:
            if cond is None or bool(cond.holds(codes)):
                return value
        raise AssertionError("the last case always holds")

    def gives(self, value: Any, codes: Mapping[str, Any]) -> bool:
        """Whether the rule gives ``value`` for the knob codes ``codes`` (scalars: one
        strategy; numpy columns: every row)."""
        taken = np.zeros(np.shape(next(iter(codes.values()))), bool)
        for cond, case in self.cases:
            hit = ~taken & (True if cond is None else np.asarray(cond.holds(codes), bool))
            if case != value and np.any(hit):
                return False
            taken = taken | hit
        return True


# the behaviours a program may hold as a rule traced per row (the registry's ``traced`` knobs)
TRACED_BEHAVIOURS = frozenset(k.name for k in STACK_KNOBS if k.traced)


def program_key(stack: Stack, rules: tuple[Rule, ...], codes: Mapping[str, Any] | None = None):
    """What a compiled program for several stacks of one preset holds in place of ``stack``:
    each behaviour one of ``rules`` chose and the step function can trace, as the rule. With
    the knob ``codes`` of the strategies (scalars or columns) that run under ``stack``, only
    where the rule gives ``stack``'s own value to all of them (a value the user set stays
    fixed); without, the caller vouches for it. Stacks with equal keys can share a program
    (:func:`shared_program`)."""
    traced = {
        r.knob: r
        for r in rules
        if r.knob in TRACED_BEHAVIOURS and (codes is None or r.gives(getattr(stack, r.knob), codes))
    }
    return dataclasses.replace(stack, **traced) if traced else stack


def shared_program(key: Stack, stacks: list[Stack]) -> Stack:
    """The stack of one program for ``stacks`` (all with the :func:`program_key` ``key``): a
    behaviour is the key's rule where the stacks differ in it, their common value elsewhere
    (nothing to trace)."""
    if len(set(stacks)) == 1:
        return stacks[0]
    differ = {
        f.name: getattr(key, f.name)
        for f in dataclasses.fields(key)
        if len({getattr(st, f.name) for st in stacks}) > 1
    }
    return dataclasses.replace(stacks[0], **differ)


@dataclasses.dataclass(frozen=True)
class Default:
    """A recipe default: ``value`` (or :data:`AUTO`) when the user does not choose, only
    where ``when`` holds (``None``: always), or the value of another knob (``same_as``:
    torchtitan pipelines as many microbatches as stages); ``choices``: the values the framework
    can run."""

    knob: str
    value: Any
    when: Condition | None = None
    choices: tuple | None = None
    same_as: str | None = None


@dataclasses.dataclass(frozen=True)
class StackPreset:
    """A software stack as its framework runs it (module docstring).

    Attributes:
      name: ``NAME`` or ``NAME@VARIANT``.
      base: the behaviours that do not depend on the strategy (and each rule's last case).
      rules: the behaviours that do, per strategy.
      defaults: the recipe defaults of the layout, batching and memory knobs.
      constants: hardware preset -> its calibrated constants entry (``constants`` SI values,
        ``status`` fitted or carried over, ``reason``, optional ``uncertainty``/``covariance``).
      document: the file as read (its sources).
      where: the file.
    """

    name: str
    base: Stack
    rules: tuple[Rule, ...]
    defaults: tuple[Default, ...]
    constants: dict
    document: dict
    where: str

    def stack_for(self, codes: Mapping[str, Any]) -> Stack:
        """The stack of one strategy (its knob codes: :meth:`perfmodel.specs.knobs.Knob.code`)."""
        if not self.rules:
            return self.base
        return dataclasses.replace(self.base, **{r.knob: r.value(codes) for r in self.rules})

    def partition(self, rows: Mapping[str, np.ndarray]) -> list[tuple[Stack, np.ndarray]]:
        """A grid's rows grouped by the stack each gets: ``(stack, row mask)`` pairs."""
        n = len(next(iter(rows.values())))
        if not self.rules:
            return [(self.base, np.ones(n, bool))]
        keys = np.zeros(n, np.int64)
        choices: list[list] = []
        for r in self.rules:
            taken = np.zeros(n, bool)
            pick = np.full(n, len(r.cases) - 1)
            for i, (cond, _) in enumerate(r.cases[:-1]):
                hit = ~taken & np.broadcast_to(np.asarray(cond.holds(rows), bool), (n,))
                pick[hit], taken = i, taken | hit
            keys = keys * len(r.cases) + pick
            choices.append([v for _, v in r.cases])
        out = []
        for key in np.unique(keys):
            picks, k = [], int(key)
            for r in reversed(self.rules):
                k, i = divmod(k, len(r.cases))
                picks.append((r.knob, r.cases[i][1]))
            out.append((dataclasses.replace(self.base, **dict(picks)), keys == key))
        return out

    def default_values(self, codes: Mapping[str, Any]) -> dict[str, Any]:
        """The recipe defaults that apply to a strategy whose known knob codes are ``codes``
        (conditional ones only where their condition holds); :data:`AUTO` where the framework
        leaves it to the least that fits."""
        out = {}
        for d in self.defaults:
            if d.when is not None and not (
                all(k in codes for k, _, _ in d.when.tests) and bool(d.when.holds(codes))
            ):
                continue
            if d.same_as is None:
                out[d.knob] = d.value
            elif d.same_as in codes:
                out[d.knob] = BY_NAME[d.knob].parse(codes[d.same_as])
        return out

    def choices(self, knob: str) -> tuple | None:
        """The values of a knob the framework can run (``None``: any)."""
        return next((d.choices for d in self.defaults if d.knob == knob and d.choices), None)

    def constants_entry(self, hardware: str) -> dict | None:
        """This stack's constants entry for a hardware preset, or ``None``."""
        return self.constants.get(hardware)

    def fitted_constants(self) -> dict[str, dict]:
        """The constants entries fitted to published runs: hardware preset -> entry."""
        return {
            k: v
            for k, v in self.constants.items()
            if k != CARRIED and isinstance(v, dict) and v.get("status") == "fitted"
        }


def _stacks_dir() -> Path:
    return Path(str(resources.files("perfmodel") / "profiles" / "stacks"))


def stack_names() -> list[str]:
    """Names of the shipped software-stack presets (``profiles/stacks/*.json`` of the stack
    schema), each variant as ``NAME@VARIANT``."""
    names = []
    for p in sorted(_stacks_dir().glob("*.json")):
        with contextlib.suppress(ValueError, OSError):
            doc = json.loads(p.read_text())
            if doc.get("schema") == STACK_SCHEMA:
                names += [p.stem] + [f"{p.stem}@{v}" for v in doc.get("variants") or {}]
    return names


@functools.cache
def _stack_documents() -> tuple[tuple[str, dict], ...]:
    """(file stem, document) of every shipped stack file of the stack schema, read once."""
    docs = []
    for p in sorted(_stacks_dir().glob("*.json")):
        with contextlib.suppress(ValueError, OSError):
            doc = json.loads(p.read_text())
            if doc.get("schema") == STACK_SCHEMA:
                docs.append((p.stem, doc))
    return tuple(docs)


@functools.cache
def _stack_index() -> dict[str, str]:
    """Normalised name -> shipped stack name: the names themselves, then each variant's
    aliases, then each stack's aliases and the frameworks it ``covers`` (a variant's alias
    wins over a framework its stack covers: ``nemo`` is ``megatron-core@nemo``)."""
    docs = _stack_documents()
    out: dict[str, str] = {}
    for name in stack_names():
        out.setdefault(normalise(name), name)
    for stem, doc in docs:
        for variant, v in (doc.get("variants") or {}).items():
            for a in v.get("aliases") or []:
                out.setdefault(normalise(a), f"{stem}@{variant}")
    for stem, doc in docs:
        for a in [*(doc.get("aliases") or []), *(doc.get("covers") or [])]:
            out.setdefault(normalise(a), stem)
    return out


def stack_preset_name(name: str) -> str | None:
    """The shipped stack that ``name`` names (``NAME``, ``NAME@VARIANT``, an alias of a stack
    or of a variant, or a framework a stack covers, compared as
    :func:`perfmodel.specs.names.normalise` does), or None."""
    key = name.strip().lower()
    if key in stack_names():
        return key
    return _stack_index().get(normalise(key))


def stack_aliases() -> dict[str, list[str]]:
    """Shipped stack name -> the other names (its aliases, its variants' aliases and the
    frameworks it covers, as the documents write them) that :func:`stack_preset_name`
    resolves to it."""
    out: dict[str, list[str]] = {}
    for _, doc in _stack_documents():
        variants = doc.get("variants") or {}
        written = [*(doc.get("aliases") or []), *(doc.get("covers") or [])]
        written += [a for v in variants.values() for a in v.get("aliases") or []]
        for w in written:
            name = stack_preset_name(w)
            if name is not None and w != name and w not in out.setdefault(name, []):
                out[name].append(w)
    return out


def load_stack(spec: Any, hardware=None) -> StackPreset | Stack | None:
    """A software stack: a shipped preset by name (``NAME`` or ``NAME@VARIANT``, any case, or
    a framework's name: :func:`stack_preset_name`), a stack JSON file, an already loaded :class:`StackPreset` or :class:`Stack` (returned as
    they are), or ``None`` (no stack: the registry's behaviours).

    Args:
      spec: what names the stack.
      hardware: unused here (the preset carries every hardware's constants); kept so callers
        say which hardware the stack runs on.

    Raises:
      AisimError: an unknown name (with the closest names) or a bad file (``field`` names the
        entry).
    """
    del hardware
    if spec is None or isinstance(spec, StackPreset | Stack):
        return spec
    path = Path(str(spec))
    variant = None
    if not path.is_file():
        key = stack_preset_name(str(spec))
        if key is None and "," in str(spec):
            raise bad_value(
                None, "stack", str(spec), "one stack (perf estimate, grid and compare take several)"
            )
        if key is None:
            raise bad_value(None, "stack", str(spec), "a stack preset or a stack JSON file",
                            hint=suggest(str(spec).strip(), stack_names()).lstrip("; "))  # fmt: skip
        base, _, variant = key.partition("@")
        path = _stacks_dir() / f"{base}.json"
    return preset_from_dict(read_json(path, "stack file"), str(path), variant or None)


def preset_from_dict(doc: Any, where: str, variant: str | None = None) -> StackPreset:
    """A :class:`StackPreset` from a stack document (module docstring), with a variant's
    behaviours and defaults over the base ones.

    Raises:
      AisimError: naming ``where`` and the bad entry.
    """
    if not isinstance(doc, dict) or doc.get("schema") != STACK_SCHEMA:
        shown = doc.get("schema") if isinstance(doc, dict) else doc
        raise bad_value(where, "schema", shown, f"{STACK_SCHEMA!r} (a software-stack document)")
    behaviours = dict(doc.get("behaviours") or {})
    defaults = dict(doc.get("defaults") or {})
    constants = dict(doc.get("constants") or {})
    name = str(doc.get("name") or Path(where).stem)
    if variant:
        v = (doc.get("variants") or {}).get(variant)
        if not isinstance(v, dict):
            raise bad_value(where, "variants", variant, "a variant of the stack document")
        behaviours |= v.get("behaviours") or {}
        defaults |= v.get("defaults") or {}
        # a version's own fits (its hardware) over the stack's pooled ones
        constants |= v.get("constants") or {}
        name = f"{name}@{variant}"
    base, rules = _behaviours(behaviours, where, name)
    return StackPreset(
        name=name,
        base=base,
        rules=rules,
        defaults=tuple(_default(k, e, f"{where}: defaults.{k}") for k, e in defaults.items()),
        constants=constants,
        document=doc,
        where=where,
    )


def _behaviours(entries: dict, where: str, name: str) -> tuple[Stack, tuple[Rule, ...]]:
    values, rules = {}, []
    for knob_name, entry in entries.items():
        here = f"{where}: behaviours.{knob_name}"
        knob = BY_NAME.get(knob_name)
        if knob is None or knob.home != "stack":
            raise bad_value(where, "behaviours", knob_name, "a stack knob of the registry")
        if not isinstance(entry, dict) or ("value" not in entry and "cases" not in entry):
            raise bad_value(here, "value", entry, "an object with a 'value' or 'cases'")
        if "cases" not in entry:
            values[knob_name] = knob.parse(entry["value"], here)
            continue
        cases = []
        for i, case in enumerate(entry["cases"]):
            last = i == len(entry["cases"]) - 1
            cond = None if last and "when" not in case else _condition(case.get("when"), here)
            cases.append((cond, knob.parse(case.get("value"), here)))
        if cases[-1][0] is not None:
            raise bad_value(here, "cases", entry["cases"], "a last case without 'when'")
        values[knob_name] = cases[-1][1]
        rules.append(Rule(knob_name, tuple(cases)))
    missing = [k.name for k in STACK_KNOBS if k.name not in values]
    if missing:
        raise bad_value(where, "behaviours", ", ".join(missing), "every stack knob of the registry")
    return Stack(name=name, **values), tuple(rules)


def _default(knob_name: str, entry: Any, where: str) -> Default:
    knob = BY_NAME.get(knob_name)
    if knob is None or knob.home is None:
        raise bad_value(where, "defaults", knob_name, "a knob of the registry")
    if not isinstance(entry, dict) or ("value" not in entry and "same_as" not in entry):
        raise bad_value(where, "value", entry, "an object with a 'value' or 'same_as'")
    when = _condition(entry["when"], where) if entry.get("when") else None
    if "same_as" in entry:
        if entry["same_as"] not in CONDITION_KNOBS:
            raise bad_value(where, "same_as", entry["same_as"], "a layout or memory knob")
        return Default(knob_name, None, when, None, entry["same_as"])
    raw = entry["value"]
    value = AUTO if raw == AUTO and (knob.auto or knob.auto_rule) else knob.parse(raw, where)
    choices = entry.get("choices")
    if choices is not None:
        choices = tuple(knob.parse(c, where) for c in choices)
    return Default(knob_name, value, when, choices)


def explain(preset: StackPreset) -> list[dict[str, Any]]:
    """Every behaviour and recipe default of a preset with the source that states it: one dict
    per knob (``knob``, ``kind`` "behaviour" or "default", ``value`` as text, with its
    conditions, and ``source``), a variant's entries over its base's."""
    doc = preset.document or {}
    entries = {"behaviour": dict(doc.get("behaviours") or {}),
               "default": dict(doc.get("defaults") or {})}  # fmt: skip
    variant = preset.name.partition("@")[2]
    if variant:
        v = (doc.get("variants") or {}).get(variant) or {}
        entries["behaviour"] |= v.get("behaviours") or {}
        entries["default"] |= v.get("defaults") or {}
    rules = {r.knob: r for r in preset.rules}
    out = []
    for k in STACK_KNOBS:
        if k.name in rules:
            value = "; ".join(f"{k.text(v) or 'none'} if {c.text()}" if c
                              else f"{k.text(v) or 'none'} otherwise"
                              for c, v in rules[k.name].cases)  # fmt: skip
        else:
            value = k.text(getattr(preset.base, k.name))
        out.append(("behaviour", k.name, value))
    for d in preset.defaults:
        k = BY_NAME[d.knob]
        value = (f"= {d.same_as}" if d.same_as else AUTO if d.value == AUTO
                 else k.text(k.code(d.value)))  # fmt: skip
        if d.when:
            value += f" if {d.when.text()}"
        out.append(("default", d.knob, value))
    return [{"knob": knob, "kind": kind, "value": value or "none",
             "source": str((entries[kind].get(knob) or {}).get("source") or "registry default")}
            for kind, knob, value in out]  # fmt: skip


def with_caller_defaults(knobs: dict[str, Any], defaults: dict[str, Any], stack) -> dict[str, Any]:
    """The knobs given, over a caller's own defaults, except the defaults of the knobs the stack
    preset's recipe chooses (a framework's recomputation or ZeRO stage wins over the caller's),
    and except the caller's parallel degrees where ``knobs`` gives one: a layout given is the
    whole layout, its other degrees 1 as in the frameworks (``--pp 16 --ep 64`` is DeepSeek-V3's
    layout without tensor parallelism, not the caller's tp 8).

    Args:
      knobs: the knobs the user gave (they win over every default).
      defaults: the caller's defaults (``aisim perf estimate``'s GPT-3 run).
      stack: a :class:`StackPreset`, a plain :class:`~perfmodel.specs.stack.Stack` or None
        (no recipe: every caller default applies).

    Returns:
      The caller's defaults the recipe and the given layout leave alone, then ``knobs`` over
      them.
    """
    own = {d.knob for d in getattr(stack, "defaults", ())}
    if set(PARALLEL_DEGREES) & set(knobs):
        own |= set(PARALLEL_DEGREES)
    return {k: v for k, v in defaults.items() if k not in own} | knobs
