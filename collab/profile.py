"""Collaboration profiles: the ``aisim.profile/1`` documents of a collab fit or of measured
serialisation throughputs, and a scenario with such a profile applied.

Contract: :func:`collab.fit.fit_profile` and :func:`serde_profile` build the documents (a
``collab`` block with ``fit`` or ``serde``); :func:`apply_profile` reads one
(:func:`calibration.profile.read_profile`) and returns a :class:`collab.Scenario` with its values. A bad document raises
:class:`~simbase.errors.AisimError` naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import jax.numpy as jnp

from calibration.profile import PROFILE_SCHEMA, read_profile
from collab.scenario import Scenario
from collab.scenario_model import WAN
from simbase import version
from simbase.errors import AisimError, bad_value

COLLAB_KIND = "collab"


def serde_profile(results: dict[str, dict[str, float]], measurements: list[dict]) -> dict:
    """The ``aisim.profile/1`` document of measured (de)serialisation throughputs by format."""
    return {
        "schema": PROFILE_SCHEMA,
        "kind": COLLAB_KIND,
        "created_by": f"aisim {version()}",
        "collab": {"serde": results, "serde_measurements": measurements},
    }


def _positive_number(doc: dict, key: str, where: str) -> float:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        raise bad_value(where, key, v, "a positive SI number")
    return float(v)


def apply_profile(
    scenario: Scenario,
    path: str | Path,
    serde_format: str = "msgpack",
    keep_latency: bool = False,
) -> Scenario:
    """A scenario with a collaboration profile's values applied.

    A ``collab.serde`` block (:func:`serde_profile`) sets the (de)serialisation
    throughputs of ``serde_format``; a ``collab.fit`` block (:func:`collab.fit.fit_profile`) sets
    each site's compute efficiency and overhead (by index; sites beyond the fitted ones keep their
    preset), the WAN efficiency and latency (unless ``keep_latency``), the serialisation
    throughputs and the aggregation factor.

    Raises:
      AisimError: not a profile, no collab block, a missing format or a bad value.
    """
    doc = read_profile(path)
    block = doc.get("collab")
    if not isinstance(block, dict):
        raise AisimError(
            f"{path}: no 'collab' block: expected a collaboration profile (from fit_profile or "
            f"serde_profile)"
        )
    changes: dict = {}
    if isinstance(block.get("serde"), dict):
        changes.update(_serde_changes(block["serde"], serde_format, path))
    if isinstance(block.get("fit"), dict):
        changes.update(_fit_changes(block["fit"], scenario, keep_latency, path))
    if not changes:
        raise AisimError(f"{path}: the 'collab' block has neither 'serde' nor 'fit'")
    return dataclasses.replace(scenario, **changes)


def _serde_changes(serde: dict, serde_format: str, path) -> dict:
    """The scenario fields a ``collab.serde`` block sets: ``serde_format``'s throughputs."""
    if serde_format not in serde:
        raise bad_value(
            str(path), "collab.serde", serde_format, f"a measured format ({', '.join(serde)})"
        )
    w = f"{path}: collab.serde.{serde_format}"
    return {
        "serialize_bytes_per_s": _positive_number(serde[serde_format], "serialize_bytes_per_s", w),
        "deserialize_bytes_per_s": _positive_number(
            serde[serde_format], "deserialize_bytes_per_s", w
        ),
    }


def _fit_changes(fitted: dict, scenario: Scenario, keep_latency: bool, path) -> dict:
    """The scenario fields a ``collab.fit`` block sets: per-site constants and overheads, the
    serialisation throughputs and the aggregation factor."""
    v = fitted.get("values", {})
    w = f"{path}: collab.fit.values"
    consts, overheads = [], []
    base = scenario.per_site("consts")
    old_over = scenario.per_site("overhead_s")
    for i, hw in enumerate(scenario.hardware):
        c = hw.constants if base[i] is None else base[i]
        if f"site{i + 1}.overhead_s" in v:
            c = dataclasses.replace(
                c,
                matmul_efficiency_max=jnp.asarray(
                    _positive_number(v, f"site{i + 1}.matmul_efficiency_max", w)
                ),
                memory_efficiency_max=jnp.asarray(
                    _positive_number(v, f"site{i + 1}.memory_efficiency_max", w)
                ),
            )
            overheads.append(_positive_number(v, f"site{i + 1}.overhead_s", w))
        else:
            overheads.append(old_over[i])
        eff = (
            jnp.asarray(c.link_bandwidth_efficiency)
            .at[WAN]
            .set(_positive_number(v, "wan.bandwidth_efficiency", w))
        )
        c = dataclasses.replace(c, link_bandwidth_efficiency=eff)
        if not keep_latency:
            c = dataclasses.replace(
                c,
                link_latency_s=jnp.asarray(c.link_latency_s)
                .at[WAN]
                .set(_positive_number(v, "wan.latency_s", w)),
            )
        consts.append(c)
    return dict(
        consts=tuple(consts),
        overhead_s=tuple(overheads),
        serialize_bytes_per_s=_positive_number(v, "serialize_bytes_per_s", w),
        deserialize_bytes_per_s=_positive_number(v, "deserialize_bytes_per_s", w),
        aggregation_time_factor=_positive_number(v, "aggregation_time_factor", w),
    )
