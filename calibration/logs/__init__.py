"""calibration.logs: training logs people already have -> rows of the measurement CSV.

Public API::

  import_logs(paths, *, format="auto", overrides=None, skip_iterations=None) -> pandas.DataFrame
  detect_format(text, source=None) -> "megatron" | "torchtitan" | "deepspeed" | "colossal"

One row per run (a Megatron log with several configurations gives several rows; restarts of the
same configuration are pooled). Columns: the canonical measurement columns (DESIGN.md; see
``calibration.measurements``) that the log or ``overrides`` give, the extra columns a format has
(Megatron: ``cp``, ``ep``, ``num_experts``, ``experts_per_token``, ``swiglu``, ...), then
``step_time_s`` (mean seconds per optimiser step after the warm-up), ``step_time_std_s`` (the
spread of the averaged lines), ``iterations_averaged``, ``format``, ``source``
(``FILE:Lfirst-Llast``) and ``provenance`` (``field=origin;...``: ``L12`` or ``L40-L98`` for
log lines, ``option`` for an override, ``default``, ``derived``, or a job config's path). The
rows load with
:func:`calibration.measurements.normalise_measurements`.

Per format: :mod:`~calibration.logs.megatron`, :mod:`~calibration.logs.torchtitan`,
:mod:`~calibration.logs.deepspeed`, :mod:`~calibration.logs.colossal_bench` (which hands the
older Colossal-AI generations to :mod:`calibration.colossal`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from calibration.logs import colossal_bench, deepspeed, megatron, torchtitan
from calibration.logs.detect import FORMATS, detect_format
from calibration.logs.rows import CANONICAL, META, OVERRIDES, check_overrides
from simbase.errors import AisimError
from simbase.io import read_text

_PARSERS = {
    "megatron": megatron.parse,
    "torchtitan": torchtitan.parse,
    "deepspeed": deepspeed.parse,
    "colossal": colossal_bench.parse,
}


def import_logs(
    paths: Iterable[str | os.PathLike],
    *,
    format: str = "auto",
    overrides: Mapping[str, Any] | None = None,
    skip_iterations: int | None = None,
) -> pd.DataFrame:
    """Reads training logs into measurement rows.

    Args:
      paths: log files. A ``.toml`` file is a torchtitan job config: it fills what the
        torchtitan logs given with it lack.
      format: ``"auto"`` (per file, :func:`detect_format`) or one of :data:`FORMATS`.
      overrides: measurement column -> value, winning over every log (names in
        :data:`OVERRIDES`, such as ``model``, ``hardware``, ``num_gpus``, ``tp``, ``pp``); a
        ``None`` value is ignored.
      skip_iterations: warm-up steps left out after each start of a run; ``None``: the first 10%
        of its timing lines, at least one (Colossal-AI: the script's own ``ignore_steps``).

    Returns:
      One row per run, columns as in the module docstring, unvalidated (load them with
      :func:`calibration.measurements.normalise_measurements`).

    Raises:
      AisimError: a file is unreadable, its format unknown, it has no timing line, or a field
        the model needs is neither in it nor in ``overrides`` (``field`` names it; ``hint`` is
        ``"pass {field}"``).
    """
    if format != "auto" and format not in FORMATS:
        raise AisimError(
            field="format", value=format, expected=f"auto or one of {', '.join(FORMATS)}"
        )
    if skip_iterations is not None and (
        not isinstance(skip_iterations, int) or skip_iterations < 0
    ):
        raise AisimError(field="skip_iterations", value=skip_iterations, expected="an integer >= 0")
    ov = check_overrides(overrides, OVERRIDES)
    paths = [Path(p) for p in paths]
    tomls = [p for p in paths if p.suffix == ".toml"]
    toml = None
    if tomls:
        toml = (
            str(tomls[-1]),
            torchtitan.read_toml(str(tomls[-1]), read_text(tomls[-1], "job config")),
        )
    rows: list[dict[str, Any]] = []
    for path in paths:
        if path.suffix == ".toml":
            continue
        text = read_text(path, "log")
        fmt = detect_format(text, str(path)) if format == "auto" else format
        if fmt == "torchtitan":
            rows += torchtitan.parse(text, str(path), ov, skip_iterations, toml=toml)
        else:
            rows += _PARSERS[fmt](text, str(path), ov, skip_iterations)
    if not rows:
        raise AisimError(
            field="paths", value=[str(p) for p in paths], expected="at least one log file"
        )
    return _table(rows)


def _table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    first = [c for c in CANONICAL if c in df.columns]
    last = [c for c in META if c in df.columns]
    middle = [c for c in df.columns if c not in first and c not in last]
    return df[first + middle + last]


__all__ = ["FORMATS", "OVERRIDES", "detect_format", "import_logs"]
