"""The aisim version, read once from the installed package metadata (pyproject.toml's)."""

from __future__ import annotations

import functools
from importlib import metadata


@functools.cache
def version() -> str:
    """The installed ``aisim`` distribution's version (``"0+unknown"`` when not installed)."""
    try:
        return metadata.version("aisim")
    except metadata.PackageNotFoundError:
        return "0+unknown"
