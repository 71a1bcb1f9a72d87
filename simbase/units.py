"""SI constants and converters between human strings and SI numbers; nothing else.

Inside aisim every quantity is SI (seconds, bytes, FLOPs, bytes per second). Strings such as
``"60M"`` (a count), ``"4GB"`` (bytes) or ``"1Gbps"`` (bits per second) are converted once, here,
at the boundary.
"""

from __future__ import annotations

import re

KILO = 1e3
MEGA = 1e6
GIGA = 1e9
TERA = 1e12
PETA = 1e15
KIB = 2.0**10
MIB = 2.0**20
GIB = 2.0**30
BITS_PER_BYTE = 8.0
US = 1e-6
MS = 1e-3
HOUR_S = 3600.0

_COUNT_SUFFIX = {"": 1.0, "K": KILO, "M": MEGA, "B": GIGA, "G": GIGA, "T": TERA}
_BYTES_SUFFIX = {
    "": 1.0,
    "B": 1.0,
    "KB": KILO,
    "MB": MEGA,
    "GB": GIGA,
    "TB": TERA,
    "KIB": KIB,
    "MIB": MIB,
    "GIB": GIB,
    "TIB": 2.0**40,
}
_BITRATE_SUFFIX = {
    "BPS": 1.0,
    "KBPS": KILO,
    "MBPS": MEGA,
    "GBPS": GIGA,
    "TBPS": TERA,
    "BIT/S": 1.0,
    "KBIT/S": KILO,
    "MBIT/S": MEGA,
    "GBIT/S": GIGA,
    "TBIT/S": TERA,
}
_NUM = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


def parse_count(text: str | float | int) -> float:
    """Parses a count such as ``"60M"``, ``"1.5B"``, ``"7e9"`` or ``"100k"``.

    Raises:
      ValueError: the text is not a non-negative number with an optional K/M/B/G/T suffix.
    """
    if isinstance(text, int | float):
        return float(text)
    m = re.fullmatch(_NUM + r"\s*([A-Za-z]?)", text.strip())
    if not m or m.group(2).upper() not in _COUNT_SUFFIX:
        raise ValueError(f"{text!r} is not a count like 60M, 1.5B or 7e9")
    return float(m.group(1)) * _COUNT_SUFFIX[m.group(2).upper()]


def parse_bytes(text: str | float | int) -> float:
    """Parses a size such as ``"4GB"`` (decimal), ``"16GiB"`` (binary) or ``"1e9"`` into bytes."""
    if isinstance(text, int | float):
        return float(text)
    m = re.fullmatch(_NUM + r"\s*([A-Za-z]*)", text.strip())
    if not m or m.group(2).upper() not in _BYTES_SUFFIX:
        raise ValueError(f"{text!r} is not a size like 4GB, 512MiB or 1e9")
    return float(m.group(1)) * _BYTES_SUFFIX[m.group(2).upper()]


def parse_bitrate(text: str | float | int) -> float:
    """Parses a link speed such as ``"1Gbps"``, ``"25 Gbit/s"`` or ``"100Mbps"`` into bytes/s.

    A bare number is taken as bits per second.
    """
    if isinstance(text, int | float):
        return float(text) / BITS_PER_BYTE
    m = re.fullmatch(_NUM + r"\s*([A-Za-z/]*)", text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a link speed like 1Gbps or 25Gbit/s")
    suffix = m.group(2).upper() or "BPS"
    if suffix not in _BITRATE_SUFFIX:
        raise ValueError(f"{text!r} is not a link speed like 1Gbps or 25Gbit/s")
    return float(m.group(1)) * _BITRATE_SUFFIX[suffix] / BITS_PER_BYTE


def format_count(n: float) -> str:
    """Formats a count with a K/M/B/T suffix, for tables (``1.07B``)."""
    for suffix, scale in (("T", TERA), ("B", GIGA), ("M", MEGA), ("K", KILO)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{suffix}"
    return f"{n:.3g}"
