"""Option glue shared by the CLI areas.

The model and hardware are resolved by the library (:func:`perfmodel.resolve_model`,
:func:`perfmodel.resolve_hardware`; re-exported here for the commands that imported them from
this module). What stays here joins two libraries that must not import each other: a
calibrated profile (``calibration``) applied over a hardware preset's constants (``perfmodel``).
"""

from __future__ import annotations

from pathlib import Path

from calibration.profile import load_profile_constants
from perfmodel import Constants, Hardware, resolve_hardware, resolve_model
from simbase.parse import parse_int_list

__all__ = ["parse_int_list", "resolve_constants", "resolve_hardware", "resolve_model"]


def resolve_constants(hw: Hardware, profile: Path | None) -> Constants:
    """The preset's constants, or a calibrated profile's (``--profile``) over them."""
    if profile is None:
        return hw.constants
    return load_profile_constants(profile, hw.name, hw.constants)
