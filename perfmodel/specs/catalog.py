"""The shipped presets as rows: what ``aisim presets --json`` prints and its tables show.

Contract: :func:`hardware_rows`, :func:`model_rows` and :func:`stack_rows` give one plain dict
per shipped preset, in the order of :func:`~perfmodel.specs.hardware.hardware_names`,
:func:`~perfmodel.specs.model.model_names` and :func:`~perfmodel.specs.stack_preset.stack_names`,
in the units people read (TFLOP/s, GiB, GB/s, USD, W); a quantity a preset does not give is
``None``. Nothing here prints.
"""

from __future__ import annotations

import math
from typing import Any

from perfmodel.specs.choices import Dtype
from perfmodel.specs.hardware import hardware_aliases, hardware_names, load_hardware
from perfmodel.specs.model import load_model, model_aliases, model_names, total_params
from perfmodel.specs.stack_preset import load_stack, stack_aliases, stack_names
from simbase import units


def hardware_rows() -> list[dict[str, Any]]:
    """One row per hardware preset.

    Returns:
      Dicts with ``name``, ``aliases`` (the other names it answers to), ``description``,
      ``peak_<dtype>_tflops`` per dtype (``None`` where the device has no such unit),
      ``memory_gib``, ``memory_bandwidth_gb_per_s``,
      ``gpus_per_node``, ``intra_node_gb_per_s``, ``inter_node_gb_per_s``, ``wan_gb_per_s``,
      ``price_per_device_hour_usd`` and ``board_power_w`` (``None`` when unknown).
    """
    rows = []
    other_names = hardware_aliases()
    for name in hardware_names():
        hw = load_hardware(name)
        s = hw.spec
        row: dict[str, Any] = {
            "name": name,
            "aliases": other_names[name],
            "description": hw.description,
        }
        for dt in Dtype:
            v = float(s.peak_flops_per_s[int(dt)])
            row[f"peak_{dt.label}_tflops"] = v / units.TERA if v > 0 else None
        links = [float(b) / units.GIGA for b in s.link_bandwidth_bytes_per_s[:3]]
        price = float(s.price_per_device_hour_usd)
        row.update(
            memory_gib=float(s.memory_capacity_bytes) / units.GIB,
            memory_bandwidth_gb_per_s=float(s.memory_bandwidth_bytes_per_s) / units.GIGA,
            gpus_per_node=int(s.gpus_per_node),
            intra_node_gb_per_s=links[0],
            inter_node_gb_per_s=links[1],
            wan_gb_per_s=links[2],
            price_per_device_hour_usd=None if math.isnan(price) else price,
            board_power_w=hw.board_power_w,
        )
        rows.append(row)
    return rows


def model_rows() -> list[dict[str, Any]]:
    """One row per model preset.

    Returns:
      Dicts with ``name``, ``aliases`` (the other names it answers to), ``kind``, ``params``
      (counted), ``published_params``,
      ``num_layers``, ``hidden_size``, and for a transformer ``num_heads``, ``num_kv_heads``,
      ``seq_len`` and ``vocab_size`` (``None`` for an MLP).
    """
    rows = []
    other_names = model_aliases()
    for name in model_names():
        m = load_model(name)
        sp = m.spec
        dims = ("num_heads", "num_kv_heads", "seq_len", "vocab_size")
        transformer = sp.kind == "transformer"
        rows.append(
            {
                "name": name,
                "aliases": other_names[name],
                "kind": sp.kind,
                "params": float(total_params(sp)),
                "published_params": m.published_params,
                "num_layers": int(sp.num_layers),
                "hidden_size": int(sp.hidden_size),
            }
            | {k: int(getattr(sp, k)) if transformer else None for k in dims}
        )
    return rows


def stack_rows() -> list[dict[str, Any]]:
    """One row per stack preset and variant.

    Returns:
      Dicts with ``name`` (``NAME`` or ``NAME@VARIANT``), ``aliases`` (the frameworks' names
      that name it, :func:`~perfmodel.specs.stack_preset.stack_preset_name`), ``description``
      (the variant's, else the file's; ``""`` when none) and ``fitted_on``: hardware preset -> ``runs``,
      ``sources`` (how many) and ``leave_one_source_out_pct`` of its fitted constants.
    """
    rows = []
    other_names = stack_aliases()
    for name in stack_names():
        preset = load_stack(name)
        doc = preset.document
        version = name.partition("@")[2]
        desc = (doc.get("variants", {}).get(version, {}) if version else doc).get("description")
        fitted = {
            hw: {"runs": e.get("runs"), "sources": len(e.get("sources") or []),
                 "leave_one_source_out_pct": (e.get("error_pct") or {}).get("leave_one_source_out")}
            for hw, e in preset.fitted_constants().items()
        }  # fmt: skip
        rows.append(
            {
                "name": name,
                "aliases": other_names.get(name, []),
                "description": desc or "",
                "fitted_on": fitted,
            }
        )
    return rows
