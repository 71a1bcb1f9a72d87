"""Named choices: the one error for a name that is not among the known ones.

Contract: :func:`unknown_name` builds the :class:`~simbase.errors.AisimError` that every ``fl``
module raises for an unknown data set, model, partition, algorithm or preset (``source=None``:
the value is an argument). It sits at the bottom of ``fl``'s import graph: it imports only
:mod:`simbase`.
"""

from __future__ import annotations

from collections.abc import Iterable

from simbase.errors import AisimError, bad_value, suggest


def unknown_name(field: str, value: object, choices: Iterable[str], what: str) -> AisimError:
    """The error for a name not among ``choices``: ``field`` = value, expected a known ``what``
    with the closest names as the hint, or one of ``choices`` when none is close."""
    close = suggest(str(value), choices)
    if close.startswith("; known: "):
        return bad_value(None, field, value, "one of " + close[len("; known: ") :])
    return bad_value(None, field, value, f"a known {what}", hint=close[2:])
