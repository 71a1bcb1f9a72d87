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
    """Returns ``"; did you mean a, b?"`` with the closest names, or a list of all choices."""
    choices = sorted(choices)
    close = difflib.get_close_matches(name.lower(), choices, n=3, cutoff=0.5)
    if close:
        return "; did you mean " + ", ".join(close) + "?"
    return "; known: " + ", ".join(choices)
