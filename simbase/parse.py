"""Small parsers for the words people type: yes/no, comma-separated lists, integer ranges.

Each raises :class:`~simbase.errors.AisimError` naming the field, so the caller only says which
field the text came from.
"""

from __future__ import annotations

from simbase import units
from simbase.errors import bad_value

TRUE_WORDS = ("yes", "true", "1", "y", "t", "on")
FALSE_WORDS = ("no", "false", "0", "n", "f", "off")


def bool_word(text: object) -> bool | None:
    """``True``/``False`` for a yes/no word (``yes``, ``on``, ``1``, ``false``, ...), else ``None``."""
    if isinstance(text, bool):
        return text
    key = str(text).strip().lower()
    if key in TRUE_WORDS:
        return True
    if key in FALSE_WORDS:
        return False
    return None


def parse_bool(text: object, field: str, where: str | None = None) -> bool:
    """A yes/no word as a bool, or an error naming ``field``."""
    out = bool_word(text)
    if out is None:
        raise bad_value(where, field, text, "yes/no (true/false, on/off, 1/0)")
    return out


def split_list(text: object | list | None) -> list[str] | None:
    """``"a, b,c"`` (or a list of such strings, as a repeated option gives) -> ``["a", "b", "c"]``;
    ``None`` or nothing but commas -> ``None``."""
    if text is None:
        return None
    values = text if isinstance(text, list | tuple) else [text]
    out = [p.strip() for v in values for p in str(v).split(",") if p.strip()]
    return out or None


def parse_int_list(
    text: object | None, field: str, *, minimum: int = 0, where: str | None = None
) -> list[int] | None:
    """``"1,2,4"`` -> ``[1, 2, 4]``; ``"64,128,...,4096"`` continues the doubling (or the step).

    ``None`` stays ``None``; counts such as ``2k`` are accepted.
    """
    parts = split_list(text)
    if text is None:
        return None
    out: list[int] = []
    try:
        for i, p in enumerate(parts or []):
            if p == "...":
                if len(out) < 2 or i + 1 >= len(parts):
                    raise ValueError
                a, b = out[-2], out[-1]
                end = int(float(parts[i + 1]))
                ratio = b / a if a else 0
                step = b - a
                if step <= 0 or end <= b:  # a series must grow towards its end
                    raise ValueError
                x = b
                while True:
                    x = int(x * ratio) if ratio > 1 and a and b % a == 0 else x + step
                    if x >= end or x <= 0:
                        break
                    out.append(x)
                continue
            v = float(units.parse_count(p))
            if v != int(v) or abs(v) >= 2**31:
                raise ValueError
            out.append(int(v))
    except ValueError:
        raise bad_value(
            where, field, text, "comma-separated integers like 1,2,4 or 64,128,...,4096"
        ) from None
    if not out or any(v < minimum for v in out):
        raise bad_value(where, field, text, f"integers >= {minimum}")
    return out


def check_seed(seed: object, field: str = "seed") -> int:
    """A random seed as JAX and numpy take it: an integer in [0, 2^32).

    Raises:
      AisimError: naming ``field`` and the value.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise bad_value(None, field, seed, "an integer seed from 0 to 4294967295")
    return seed
