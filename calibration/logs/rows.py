"""Shared pieces of the log importers: clean lines, averaged timings, rows with provenance.

Contract:

- :func:`clean_lines` turns a raw log into :class:`Line` records (1-based physical line number,
  the rank or host a launcher prefixed, the text). It removes ANSI colour codes, a leading ISO
  timestamp that a log collector added, the prefixes that launchers add (``[rank3]:`` and
  ``[default3]:`` from torchrun, ``3:`` from ``srun --label``, ``worker-1:`` or an IP address
  from pdsh) and tqdm progress bars, whose carriage returns leave a bar and a log message on one
  physical line.
- :class:`Sample` is one timing line (the step it ends at, the mean seconds per step over the
  steps since the previous timing line, and how many steps that covers); :func:`summarise` drops
  the warm-up and averages the rest into a :class:`Timing`.
- :class:`RowBuilder` collects one measurement row, and for each value where it came from (a log
  line ``L12``, a line range ``L40-L98``, ``option``, ``default`` or ``derived``). Its
  ``provenance`` column is the compact ``field=origin;...`` string.

Library text never names a command-line flag: a missing value raises an
:class:`~simbase.errors.AisimError` with the field and a ``{field}`` hint the front end renders.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from perfmodel.specs.knobs import BY_NAME, KNOBS, STACK_KNOBS
from perfmodel.specs.stack_preset import load_stack, stack_preset_name
from simbase.errors import AisimError

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# A collector's timestamp before everything else (kubectl logs --timestamps, cloud log exports).
_STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s")
# torchrun ("[rank3]:", "[default3]:"), srun --label ("3: "), pdsh ("worker-1: ", "10.0.0.2: ").
_PREFIX = re.compile(
    r"^(?:\[(?:rank|default)(?P<rank>\d+)\]:\s?"
    r"|(?P<label>\d{1,5}):\s"
    r"|(?P<host>[A-Za-z][\w-]*-\d+|\d{1,3}(?:\.\d{1,3}){3}):\s)"
)
# A tqdm bar, "Step:  20%|██        | 1/5 [00:22<01:31, 22.90s/it]" (description optional).
_TQDM = re.compile(r"[^\r\n|]*?\d{1,3}%\|[^|\r\n]*\|\s*\d+/\d+\s*\[[^\]\r\n]*\]")

# Columns every importer writes, after the measurement columns.
META = ("step_time_s", "step_time_std_s", "iterations_averaged", "format", "source", "provenance")
# The measurement CSV's canonical columns (DESIGN.md), first in an imported table: the model, the
# hardware and software stack the runs ran on, the layout, batching and memory plan, then the
# stack's behaviours in the registry's order; and the extra columns an importer may fill. All
# of them, and every other knob of the registry, may be overridden by the caller.
CANONICAL = (
    "model", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size",
    "seq_len", "vocab_size", "hardware", "stack", "num_gpus", "gpus_per_node", "dp", "tp", "pp",
    "global_batch_size", "micro_batch_size", "num_microbatches", "interleave", "recompute",
    "sequence_parallel", "zero_stage", "dtype",
) + tuple(k.name for k in STACK_KNOBS)  # fmt: skip
EXTRA = ("cp", "ep", "num_experts", "experts_per_token")
OVERRIDES = CANONICAL + EXTRA + tuple(k.name for k in KNOBS if k.name not in CANONICAL + EXTRA)


def strip_ansi(text: str) -> str:
    """The text without ANSI colour codes."""
    return _ANSI.sub("", text)


@dataclass(frozen=True)
class Line:
    """One cleaned log line: physical line number (1-based), launcher rank or host, text."""

    no: int
    rank: str | None
    text: str


def clean_lines(text: str) -> list[Line]:
    """Splits a log into cleaned lines (see the module docstring)."""
    out: list[Line] = []
    for no, raw in enumerate(text.split("\n"), start=1):
        raw = _STAMP.sub("", _ANSI.sub("", raw), count=1)
        rank = None
        m = _PREFIX.match(raw)
        if m:
            rank = m.group("rank") or m.group("label") or m.group("host")
            raw = raw[m.end() :]
        for part in re.split(r"\r", _TQDM.sub("\r", raw)):
            if part.strip():
                out.append(Line(no, rank, part.rstrip()))
    return out


@dataclass(frozen=True)
class Sample:
    """One timing line: the step it ends at, mean seconds per step since the previous timing
    line, and how many steps that covers."""

    line: int
    step: int
    step_time_s: float
    steps: int = 1
    ok: bool = True  # False: NaN, skipped or overflowed steps in its interval


@dataclass(frozen=True)
class Timing:
    """The averaged step time of one run.

    Attributes:
      step_time_s: mean seconds per step, weighted by the steps each kept line covers (total
        time over total steps).
      step_time_std_s: sample standard deviation (ddof 1) of the kept lines' values; 0 for one.
      iterations_averaged: steps covered by the kept lines.
      lines_used: kept lines; ``warmup_lines`` and ``bad_lines`` were left out.
      first_line, last_line: the physical lines of the first and last kept line.
    """

    step_time_s: float
    step_time_std_s: float
    iterations_averaged: int
    lines_used: int
    warmup_lines: int
    bad_lines: int
    first_line: int
    last_line: int


def default_warmup_lines(n: int) -> int:
    """The default warm-up: the first 10% of ``n`` timing lines, at least one."""
    return max(1, math.ceil(0.1 * n))


def drop_warmup(samples: list[Sample], skip_iterations: int | None) -> tuple[list[Sample], int]:
    """Removes the warm-up from one uninterrupted stretch of samples.

    Args:
      samples: in log order, from one start of the program.
      skip_iterations: steps to skip after the start (a line is kept when every step it covers
        comes after them); ``None``: the first 10% of the lines, at least one.

    Returns:
      The kept samples and the number dropped.
    """
    if not samples:
        return [], 0
    if skip_iterations is None:
        k = default_warmup_lines(len(samples))
        return samples[k:], k
    start = samples[0].step - samples[0].steps
    kept = [s for s in samples if s.step - s.steps >= start + skip_iterations]
    return kept, len(samples) - len(kept)


def summarise(kept: list[Sample], warmup: int, where: str) -> Timing:
    """Averages samples already past their warm-up; NaN or skipped ones are left out.

    Raises:
      AisimError: (``field='skip_iterations'``) when no usable sample is left.
    """
    good = [s for s in kept if s.ok and math.isfinite(s.step_time_s)]
    if not good:
        raise AisimError(
            source=where,
            field="skip_iterations",
            expected=f"a timing line after the warm-up ({warmup} line(s) skipped, "
            f"{len(kept)} left, none usable)",
            hint="pass a smaller {skip_iterations}",
        )
    steps = sum(s.steps for s in good)
    mean = sum(s.step_time_s * s.steps for s in good) / steps
    values = [s.step_time_s for s in good]
    if len(values) > 1:
        m = sum(values) / len(values)
        std = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))
    else:
        std = 0.0
    return Timing(
        step_time_s=mean,
        step_time_std_s=std,
        iterations_averaged=steps,
        lines_used=len(good),
        warmup_lines=warmup,
        bad_lines=len(kept) - len(good),
        first_line=good[0].line,
        last_line=good[-1].line,
    )


def line_range(first: int, last: int) -> str:
    """``L12`` or ``L12-L40``."""
    return f"L{first}" if first == last else f"L{first}-L{last}"


class RowBuilder:
    """One measurement row and the origin of each value.

    Values from the log are ``put`` with their line number; :meth:`apply` lays the caller's
    overrides over them (origin ``option``); derived values name ``derived``.
    """

    def __init__(self, fmt: str, path: str):
        self.fmt = fmt
        self.path = path
        self.values: dict[str, Any] = {}
        self.origin: dict[str, str] = {}

    def put(self, field: str, value: Any, origin: int | str) -> None:
        """Sets a value (ignored when ``None``); ``origin`` is a line number or a word."""
        if value is None:
            return
        self.values[field] = value
        self.origin[field] = f"L{origin}" if isinstance(origin, int) else origin

    def setdefault(self, field: str, value: Any, origin: int | str) -> None:
        """Sets a value only when the field has none yet."""
        if self.values.get(field) is None:
            self.put(field, value, origin)

    def get(self, field: str, default: Any = None) -> Any:
        return self.values.get(field, default)

    def apply(self, overrides: Mapping[str, Any]) -> None:
        """Overrides win over the log."""
        for field, value in overrides.items():
            if value is not None:
                self.put(field, value, "option")

    def require(self, field: str, expected: str, via: str | None = None) -> Any:
        """The value of ``field``, or an error naming it and the override that supplies it
        (``via``, default the field itself; the front end names its option)."""
        value = self.values.get(field)
        if value is None:
            raise AisimError(
                source=self.path, field=field, expected=f"{expected}, not in the log",
                hint="pass {" + (via or field) + "}",
            )  # fmt: skip
        return value

    def timing(self, t: Timing) -> None:
        """Records an averaged step time."""
        where = line_range(t.first_line, t.last_line)
        self.put("step_time_s", t.step_time_s, where)
        self.put("step_time_std_s", t.step_time_std_s, where)
        self.put("iterations_averaged", t.iterations_averaged, where)
        self.values["warmup_lines_skipped"] = t.warmup_lines
        self.values["bad_lines_skipped"] = t.bad_lines

    def row(self) -> dict[str, Any]:
        """The finished row: values, ``format``, ``source`` and ``provenance``.

        ``source`` is ``FILE:Lfirst-Llast``, from the first to the last log line a value came from.
        """
        nos = [int(n) for o in self.origin.values() for n in re.findall(r"\bL(\d+)", o)]
        first_line, last_line = (min(nos), max(nos)) if nos else (0, 0)
        row = dict(self.values)
        row["format"] = self.fmt
        row["source"] = f"{self.path}:{line_range(first_line, last_line)}"
        row["provenance"] = ";".join(f"{k}={v}" for k, v in sorted(self.origin.items()))
        return row


def parse_scalar(text: str) -> Any:
    """A printed Python value: ``None``, ``True``/``False``, an int, a float, else the text."""
    s = text.strip()
    if s == "None":
        return None
    if s in ("True", "False"):
        return s == "True"
    for kind in (int, float):
        try:
            return kind(s)
        except ValueError:
            pass
    return s.strip("'\"")


def first_not_none(*values: Any) -> Any:
    """The first value that is not ``None``."""
    return next((v for v in values if v is not None), None)


def check_overrides(overrides: Mapping[str, Any] | None, known: Iterable[str]) -> dict[str, Any]:
    """The overrides without ``None`` values, each strategy knob's value checked by the knob
    registry (a parallel degree of 0 or -4 is an error naming it, not a row); an unknown key is
    an error naming it."""
    known = tuple(known)
    out = {k: v for k, v in (overrides or {}).items() if v is not None}
    for key, value in out.items():
        if key not in known:
            raise AisimError(
                field="overrides", value=key, expected=f"one of {', '.join(sorted(known))}"
            )
        if key in BY_NAME:
            BY_NAME[key].parse(value)
        elif key == "stack":
            load_stack(value)  # a preset name or a stack file; else an error with the closest
            out[key] = stack_preset_name(str(value)) or value  # the preset's own name
        elif key == "seq_len" and (isinstance(value, bool) or not int(value) >= 1):
            raise AisimError(field=key, value=value, expected="a positive integer")
    return out
