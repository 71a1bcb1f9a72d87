"""The one domain error of aisim's libraries, carried as data.

An :class:`AisimError` holds where a bad value came from (``source``: a file and row, or ``None``
for the arguments of a call), the ``field``, the bad ``value`` and what was ``expected``. The
libraries raise it without knowing who called them; a front end (the ``aisim`` command line, a
notebook) decides how to show it. :meth:`AisimError.render` makes the one line, and takes a map
from field names to the names the caller's user knows (command-line flags, CSV columns).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping

_MISSING = object()


class AisimError(Exception):
    """A problem with the user's input or environment, reported as one line.

    Attributes:
      source: where the value came from (``"m.csv:3"``, a file path), or ``None`` when it was an
        argument of the call (the front end names it: "command line", a config file).
      field: the argument, column or JSON key that holds the bad value (library names:
        ``num_gpus``, ``links.inter_node.bandwidth_gb_per_s``), or ``None``.
      value: the bad value (absent when the error is not about one value).
      expected: what would have been accepted, or a free-form explanation.
      hint: an optional follow-up that may name other fields as ``{field}`` placeholders
        (``"pass {num_gpus}"``), rendered with the same names as ``field``.
      usage: ``True`` for an error in how the tool was invoked (exit code 2); ``False`` for
        other failures (exit code 1), such as a grid with no feasible strategy.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        source: str | None = None,
        field: str | None = None,
        value: object = _MISSING,
        expected: str | None = None,
        hint: str | None = None,
        usage: bool = True,
    ):
        self.message = message
        self.source = source
        self.field = field
        self.value = value
        self.expected = expected
        self.hint = hint
        self.usage = usage
        super().__init__(self.render())

    @property
    def has_value(self) -> bool:
        """Whether the error is about one bad value."""
        return self.value is not _MISSING

    def render(
        self,
        names: Mapping[str, str] | Callable[[str], str] | None = None,
        source: str | None = None,
    ) -> str:
        """The one-line message.

        Args:
          names: field name -> the name the reader knows (a flag such as ``--gpus``, a column),
            as a mapping (fields not in it keep their own name) or a function.
          source: what to call an error whose ``source`` is ``None`` (default ``"argument"``).
        """
        if callable(names):
            name = names
        else:
            table = names or {}

            def name(f: str) -> str:
                return table.get(f, f)

        where = self.source if self.source is not None else (source or "argument")
        if self.message is not None:
            text = self.message
        elif self.field is None:
            text = f"{where}: {self.expected}"
        elif self.has_value:
            text = f"{where}: field '{name(self.field)}' = {self.value!r}: expected {self.expected}"
        else:
            text = f"{where}: field '{name(self.field)}': {self.expected}"
        if self.hint:
            text += "; " + self.hint.format_map(_Names(name))
        return text

    def __str__(self) -> str:
        return self.render()

    def relabel(self, *, source: str | None = None, names: Mapping[str, str] | None = None):
        """The same error seen from a caller: a new source (when it had none) and field names."""
        names = dict(names or {})
        field = names.get(self.field, self.field) if self.field is not None else None
        hint = self.hint.format_map(_Names(lambda f: names.get(f, f))) if self.hint else None
        return AisimError(
            self.message,
            source=self.source if self.source is not None else source,
            field=field,
            value=self.value,
            expected=self.expected,
            hint=hint,
            usage=self.usage,
        )


class _Names(dict):
    """``str.format_map`` helper: ``{field}`` -> the reader's name of that field."""

    def __init__(self, name):
        super().__init__()
        self._name = name

    def __missing__(self, key: str) -> str:
        return self._name(key)


def bad_value(
    where: str | None,
    field: str,
    value: object,
    expected: str,
    *,
    usage: bool = True,
    hint: str | None = None,
) -> AisimError:
    """The standard error: ``WHERE: field 'F' = V: expected E`` (``where=None``: an argument)."""
    return AisimError(
        source=where, field=field, value=value, expected=expected, usage=usage, hint=hint
    )


def suggest(name: str, choices: Iterable[str]) -> str:
    """Returns ``"; did you mean a, b?"`` with the closest names, or a list of all choices.

    Names are compared without case and punctuation, so ``gpt-3`` finds ``gpt3-175b``.
    """
    choices = sorted(choices)

    def norm(x: str) -> str:
        return "".join(ch for ch in x.lower() if ch.isalnum())

    key = norm(name)
    by_norm = {norm(c): c for c in choices}
    close = [by_norm[c] for c in difflib.get_close_matches(key, list(by_norm), n=3, cutoff=0.6)]
    prefixed = [c for c in choices if key and norm(c).startswith(key) and c not in close]
    close = (close + prefixed)[:5]
    if close:
        return "; did you mean " + ", ".join(close) + "?"
    return "; known: " + ", ".join(choices)
