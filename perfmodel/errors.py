"""The one domain error that every loader and the CLI raise for bad user input.

A message names where the bad value came from (file and row, or CLI option), the field, the bad
value, and what was expected, so the CLI can print it as one line without a traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class AisimError(Exception):
    """A problem with the user's input or environment, reported as one line.

    ``usage=True`` marks an error in how the tool was invoked (exit code 2); other errors
    (for example, a grid with no feasible strategy) exit with 1.
    """

    def __init__(self, message: str, *, usage: bool = True):
        super().__init__(message)
        self.usage = usage


def bad_value(
    where: str, field: str, value: object, expected: str, *, usage: bool = True
) -> AisimError:
    """Builds the standard message: ``WHERE: field 'F' = V: expected E``."""
    return AisimError(f"{where}: field '{field}' = {value!r}: expected {expected}", usage=usage)


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
