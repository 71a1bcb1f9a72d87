"""Calibrated profiles: the fitted constants of one hardware, as a versioned JSON document.

Schema ``aisim.profile/1``::

    {"schema": "aisim.profile/1", "hardware": "a100-80gb", "constants": {<Constants field>: SI value},
     "fitted": [names of free constants], "data_sha256": "...", "rows": N,
     "fit": {"in_sample_mape_pct": ..., "cv_mape_pct": ...}, "created_by": "aisim 0.1.0",
     "covariance": {"entries": [...], "matrix": [[...]], "residual_variance_log": σ², "dof": N-p}}

``covariance`` (optional; profiles written before it have only the ``uncertainty`` standard
deviations) is what :mod:`perfmodel.plan.uncertainty` propagates to prediction intervals.

``constants`` may hold any subset of :class:`perfmodel.specs.constants.Constants` fields; the rest
come from the hardware preset. Collaboration profiles (``aisim collab fit``) add their own keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfmodel.plan.stack_constants import StackConstants, check_constant, stack_constants
from perfmodel.plan.uncertainty import ConstantsCovariance, covariance_from_dict
from perfmodel.specs.constants import Constants, constants_from_si_dict
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.stack_preset import stack_names
from simbase.errors import AisimError, bad_value
from simbase.io import read_json

PROFILE_SCHEMA = "aisim.profile/1"


def read_profile(path: str | Path) -> dict[str, Any]:
    """Reads and validates a profile JSON document (any aisim profile kind).

    Raises:
      AisimError: the file is missing or unreadable, not JSON, or not a profile (``source`` is
        the path).
    """
    path = _profile_path(path)
    doc = read_json(path, what="profile file")
    if not isinstance(doc, dict) or doc.get("schema") != PROFILE_SCHEMA:
        raise bad_value(
            str(path),
            "schema",
            doc.get("schema") if isinstance(doc, dict) else doc,
            repr(PROFILE_SCHEMA),
            hint="a calibration fit writes one",
        )
    return doc


def _profile_path(name: str | Path) -> Path:
    """A ``--profile`` argument as a file. A bare stack name is refused with a pointer to
    ``--stack``, which carries the stacks' fitted constants.

    Raises:
      AisimError: a stack's name was given where a profile file is expected.
    """
    p = Path(name)
    if p.exists() or p.suffix == ".json" or len(p.parts) > 1:
        return p  # a file (read_json reports a missing one)
    stacks = stack_names()
    if p.name in stacks:
        raise AisimError(
            source=str(name),
            field="profile",
            value=str(name),
            expected="a profile JSON file written by a calibration fit",
            hint=f"a stack's fitted constants come with --stack {p.name}",
        )
    return p


def profile_constants(doc: dict[str, Any], base: Constants, where: str = "profile") -> Constants:
    """The profile's constants over ``base`` (a hardware preset's defaults)."""
    consts = doc.get("constants", {})
    if not isinstance(consts, dict):
        raise bad_value(where, "constants", consts, "an object of SI values")
    for k, v in consts.items():
        if not hasattr(base, k):
            raise AisimError(
                source=where, field=f"constants.{k}", expected="a model constant's name"
            )
        for x in v if isinstance(v, list) else [v]:
            check_constant(where, f"constants.{k}", k, x)
    return constants_from_si_dict(consts, base)


def load_profile_constants(path: str | Path, hardware_name: str, base: Constants) -> Constants:
    """Loads a profile for ``hardware_name`` and applies it over ``base``.

    Raises:
      AisimError: the file is not a profile, or was fitted for other hardware.
    """
    doc = read_profile(path)
    hw = str(doc.get("hardware", "")).lower()
    if hw and hw != hardware_name.lower():
        raise bad_value(
            str(path),
            "hardware",
            hw,
            f"the run's hardware {hardware_name!r} (this profile was fitted for {hw})",
            hint="pass {hardware} " + hw,
        )
    return profile_constants(doc, base, str(path))


def load_profile_covariance(path: str | Path) -> ConstantsCovariance | None:
    """The covariance block of a profile (:class:`perfmodel.plan.uncertainty.ConstantsCovariance`),
    or None when the profile has none (written before covariances were stored, or fitted to
    no more rows than free constants).

    Raises:
      AisimError: the file is not a profile, or its covariance block is malformed.
    """
    doc = read_profile(path)
    if doc.get("covariance") is None:
        return None
    return covariance_from_dict(doc["covariance"], str(path))


def run_constants(hw: Hardware, profile: str | Path | None = None, stack=None) -> StackConstants:
    """The constants a run uses and how sure they are.

    Args:
      hw: the hardware preset the run uses.
      profile: a calibrated profile (``aisim calibrate fit --out``), or None.
      stack: the run's software stack (a preset, or None).

    Returns:
      The profile's constants over the preset's, with the profile's covariance (status
      ``profile``); without a profile, the stack's constants on this hardware: fitted, carried
      over, or the preset's (:func:`perfmodel.plan.stack_constants.stack_constants`).

    Raises:
      AisimError: the profile cannot be read, or was fitted for other hardware.
    """
    if profile is None:
        return stack_constants(stack, hw)
    return StackConstants(
        load_profile_constants(profile, hw.name, hw.constants),
        load_profile_covariance(profile),
        "profile",
        f"the calibrated profile {profile}",
    )
