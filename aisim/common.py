"""Option glue shared by the CLI areas.

The model and hardware are resolved by the library (:func:`perfmodel.resolve_model`,
:func:`perfmodel.resolve_hardware`; re-exported here for the commands that imported them from
this module). What stays here joins two libraries that must not import each other: a
calibrated profile (``calibration``) applied over a hardware preset's constants (``perfmodel``).
"""

from __future__ import annotations

from pathlib import Path

from calibration.profile import load_profile_constants, load_profile_covariance
from perfmodel import Constants, Hardware, resolve_hardware, resolve_model
from perfmodel.plan.stack_constants import StackConstants, stack_constants
from simbase.parse import parse_int_list

__all__ = [
    "parse_int_list",
    "resolve_calibration",
    "resolve_constants",
    "resolve_hardware",
    "resolve_model",
]


def resolve_calibration(hw: Hardware, profile: Path | None, stack=None) -> StackConstants:
    """The constants a run uses and how sure they are: a calibrated profile's (``--profile``)
    over the preset's, else the stack's on this hardware (fitted, carried over, or the
    preset's: :func:`perfmodel.plan.stack_constants.stack_constants`)."""
    if profile is None:
        return stack_constants(stack, hw)
    return StackConstants(
        load_profile_constants(profile, hw.name, hw.constants),
        load_profile_covariance(profile),
        "profile",
        f"the calibrated profile {profile}",
    )


def resolve_constants(hw: Hardware, profile: Path | None, stack=None) -> Constants:
    """:func:`resolve_calibration`'s constants."""
    return resolve_calibration(hw, profile, stack).constants
