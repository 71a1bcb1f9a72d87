"""Load measurement / configuration CSVs into one canonical table, validated at the boundary.

Contract: :func:`load_measurements` reads a CSV whose columns use the canonical names of
``DESIGN.md`` or any of their aliases (Colossal-AI and DistIR spellings, any letter case) and
returns a DataFrame with canonical names, normalised values and these derived columns:

- ``dp`` = num_gpus / (tp·pp) and ``num_gpus`` = dp·tp·pp where blank;
- ``measured_step_time_s``: ``step_time_s`` if given, else global_batch_size / throughput, else NaN;
- ``has_measurement``: whether the row may be fitted on (rows without one are kept, for
  prediction; a ``kind`` of ``simulated`` marks a value as not measured);
- ``source_file`` and ``source_row`` (1-based data row, the header not counted).

The vocabulary (canonical columns, aliases, cell readers) is ``calibration.columns``. Unknown
columns pass through unchanged. Every bad cell is reported as ``FILE:ROW: field 'COL'
= V: expected ...``; all of them are collected into one :class:`InvalidRows` error (first
line a summary; its ``problems`` are the cells as data), or, with ``skip_bad_rows=True``, their rows are dropped and the messages
are kept in ``df.attrs['skipped']``. Integer knobs use pandas' nullable ``Int64`` (``.astype(float)``
turns blanks into NaN), on/off knobs the nullable ``boolean``, named choices their labels; every
knob column is read and checked by the knob registry (:mod:`perfmodel.specs.knobs`), so a
column means what the same option means on the command line.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from calibration.columns import (  # noqa: F401  (CANONICAL, MEASURED: re-exported)
    ALIAS_OF,
    ALIASES,
    CANONICAL,
    DIMENSIONS,
    KNOB_COLUMNS,
    MEASURED,
    NON_NEGATIVE_INT,
    NOT_MEASURED_KINDS,
    POSITIVE_FLOAT,
    POSITIVE_INT,
    as_bool,
    as_fp8,
    as_number,
    column_key,
    is_blank,
    preset_name,
    rename_columns,
)
from perfmodel.specs.knobs import BY_NAME, Knob
from simbase.errors import AisimError, bad_value, suggest
from simbase.io import read_text

Purpose = Literal["any", "fit", "predict"]


def _preset_names(kind: str) -> list[str] | None:
    """The preset names of ``kind`` ('model' or 'hardware'), or None while unavailable."""
    try:
        if kind == "model":
            from perfmodel.specs.model import model_names
        else:
            from perfmodel.specs.hardware import hardware_names as model_names
    except ImportError:
        return None
    return list(model_names())


def _canonical(kind: str, name: str) -> str:
    """The preset a cell's model, hardware or stack name or alias names (``llama3.1-70b`` ->
    ``llama3-70b``, ``nemo`` -> ``megatron-core@nemo``), else the name as it is (checked
    later against the presets, or read as a stack file)."""
    if kind == "model":
        from perfmodel.specs.model import model_preset_name as resolve
    elif kind == "hardware":
        from perfmodel.specs.hardware import hardware_preset_name as resolve
    else:
        from perfmodel.specs.stack_preset import stack_preset_name as resolve
    return resolve(name) or name


class InvalidRows(AisimError):
    """Some rows of a table are invalid: one error whose ``problems`` are the bad cells.

    Attributes:
      problems: one :class:`AisimError` per bad cell (``source`` ``FILE:ROW``, ``field`` the
        column, ``value`` the cell, ``expected``), in row order.
      rows: the 1-based file rows that are invalid.
      total: the number of rows in the table.
      every: say "every row is invalid" (when skipping bad rows left none) instead of how many.

    Rendered as a summary line (``source``: how many rows are invalid, and the ``hint``) followed
    by one line per problem.
    """

    def __init__(
        self,
        source: str,
        problems: list[AisimError],
        rows: list[int],
        total: int,
        *,
        every: bool = False,
        hint: str | None = None,
    ):
        self.problems = list(problems)
        self.rows = list(rows)
        self.total = total
        expected = "every row is invalid" if every else f"{len(rows)} of {total} rows are invalid"
        super().__init__(source=source, expected=expected, hint=hint)

    def render(self, names=None, source=None) -> str:
        head = super().render(names, source)
        return "\n".join([head + ":", *(p.render() for p in self.problems)])


class _Problems:
    """Collects the bad cells, ``(row index, error)``, for the one error raised at the end."""

    def __init__(self, source: str, rows: list[int]):
        self.source = source
        self.rows = rows  # index position -> 1-based file row
        self.items: list[tuple[int, AisimError]] = []

    def add(self, i: int, field: str, value: Any, expected: str) -> None:
        where = f"{self.source}:{self.rows[i]}"
        self.items.append((i, bad_value(where, field, value, expected)))

    def raise_or_skip(self, df: pd.DataFrame, skip_bad_rows: bool) -> pd.DataFrame:
        """``df`` without the bad rows (their messages in ``attrs['skipped']``), or raise.

        Raises:
          InvalidRows: some rows are bad and ``skip_bad_rows`` is false, or every row is bad.
        """
        bad = sorted({i for i, _ in self.items})
        errors = [e for _, e in self.items]
        n = len(df)
        if bad and (not skip_bad_rows or len(bad) == n):
            hint = None if skip_bad_rows else "fix them, or pass {skip_bad_rows} to use the rest"
            bad_rows = [self.rows[i] for i in bad]
            raise InvalidRows(self.source, errors, bad_rows, n, every=skip_bad_rows, hint=hint)
        out = df.drop(index=[df.index[i] for i in bad]).reset_index(drop=True)
        out.attrs["skipped"] = [str(e) for e in errors]
        return out


def normalise_measurements(
    df: pd.DataFrame,
    source: str = "<table>",
    skip_bad_rows: bool = False,
    *,
    defaults: Mapping[str, Any] | None = None,
    purpose: Purpose = "any",
    rows: Iterable[int] | None = None,
) -> pd.DataFrame:
    """Maps aliases to canonical columns, normalises values, derives columns and validates.

    Args:
      df: one row per run; any header spelling from DESIGN.md's table, any letter case.
      source: the file name used in messages.
      skip_bad_rows: drop failing rows (messages in ``attrs['skipped']``) instead of raising.
      defaults: canonical column -> value used where the column is absent or a cell is blank
        (for example ``{"model": "mlp-small", "hardware": "v100-32gb", "dtype": "fp16"}``).
      purpose: ``"fit"`` needs model, hardware and a measured value (step_time_s, or throughput
        with global_batch_size); ``"predict"`` needs model and hardware; ``"any"`` needs nothing.
      rows: the 1-based file row of each row of ``df`` (default 1..n).

    Returns:
      A new DataFrame (see the module docstring for its columns).

    Raises:
      AisimError: a required column is missing, or some rows are bad and not skipped.
    """
    rows = list(rows) if rows is not None else list(range(1, len(df) + 1))
    df = _with_defaults(rename_columns(df.reset_index(drop=True)), defaults)
    _check_required(df, source, purpose)
    problems = _Problems(source, rows)
    out = _normalise_values(df, problems)
    _derive_parallel(out, problems)
    _check_rows(out, problems, purpose)
    out["measured_step_time_s"], out["has_measurement"] = _measured(out)
    for col in POSITIVE_INT + NON_NEGATIVE_INT + _INT_KNOBS:
        if col in out.columns:
            out[col] = _to_int(out[col])
    out["source_file"] = source
    out["source_row"] = pd.array(rows, dtype="Int64")
    return problems.raise_or_skip(out, skip_bad_rows)


def _with_defaults(df: pd.DataFrame, defaults: Mapping[str, Any] | None) -> pd.DataFrame:
    """``df`` with each default filling its (canonical) column where absent or blank."""
    for name, value in (defaults or {}).items():
        canon = ALIAS_OF.get(column_key(name), name)
        if canon not in df.columns:
            df[canon] = value
        else:
            df[canon] = df[canon].astype(object).where(~df[canon].map(is_blank), value)
    return df


_INT_KNOBS = tuple(k for k in KNOB_COLUMNS if BY_NAME[k].numeric and BY_NAME[k].kind is not float)


def _normalise_values(df: pd.DataFrame, problems: _Problems) -> pd.DataFrame:
    """Numbers, preset names and every knob column (read by the registry), checked cell by
    cell (a bad cell is a problem and becomes blank)."""
    out = df.copy()
    for col in POSITIVE_INT + NON_NEGATIVE_INT + POSITIVE_FLOAT:
        if col in df.columns:
            out[col] = _numbers(df[col], col, problems)
    for col in ("model", "hardware", "stack"):
        if col in df.columns:
            out[col] = pd.Series(
                [np.nan if is_blank(v) else _canonical(col, preset_name(v)) for v in df[col]],
                index=df.index,
                dtype=object,
            )
    for col in (c for c in df.columns if c in KNOB_COLUMNS):  # a row's problems in column order
        out[col] = _knob_cells(df[col], BY_NAME[col], problems)
    if "fp8" in df.columns:
        out["fp8"] = _booleans(df["fp8"], "fp8", problems, read=as_fp8,
                               expected="yes/no, or an FP8 recipe (tensorwise, delayed, ...)")  # fmt: skip
        _fp8_dtype(out, problems)
    return out


def _knob_cells(col: pd.Series, knob: Knob, problems: _Problems) -> pd.Series:
    """A knob column parsed by the registry: numbers (NaN when blank), switches as the
    nullable ``boolean``, choices by label, recompute modules by name."""
    vals: list[Any] = []
    for i, v in enumerate(col):
        if is_blank(v):
            vals.append(pd.NA if knob.kind is bool else np.nan)
            continue
        try:
            x = knob.parse(str(v).strip() if isinstance(v, str) else v)
        except AisimError as e:
            problems.add(i, knob.name, v, e.expected)
            vals.append(pd.NA if knob.kind is bool else np.nan)
            continue
        vals.append(
            float(x)
            if knob.numeric
            else (x if knob.kind is bool or isinstance(knob.kind, dict) else knob.label(x))
        )
    if knob.kind is bool:
        return pd.array(vals, dtype="boolean")
    numeric = knob.numeric
    return pd.Series(vals, index=col.index, dtype=float if numeric else object)


def _fp8_dtype(df: pd.DataFrame, problems: _Problems) -> None:
    """``fp8`` yes makes the row's dtype fp8 (FP8 GEMMs of the linear layers, the rest in
    BF16, as Transformer Engine runs a ``--bf16 --fp8-format`` job); ``fp8`` no with dtype fp8
    is a contradiction."""
    if "dtype" not in df.columns:
        df["dtype"] = pd.Series(np.nan, index=df.index, dtype=object)
    dtype = df["dtype"].astype(object).copy()
    for i, on in enumerate(df["fp8"]):
        if on is pd.NA:
            continue
        if on:
            dtype.iloc[i] = "fp8"
        elif dtype.iloc[i] == "fp8":
            problems.add(i, "fp8", "no", "yes when the dtype is fp8 (or leave it blank)")
    df["dtype"] = dtype


def _booleans(
    col: pd.Series,
    name: str,
    problems: _Problems,
    read: Callable[[Any], bool] = as_bool,
    expected: str = "yes/no, true/false or 1/0",
) -> pd.Series:
    vals: list[Any] = []
    for i, v in enumerate(col):
        if is_blank(v):
            vals.append(pd.NA)
            continue
        try:
            vals.append(read(v))
        except ValueError:
            problems.add(i, name, v, expected)
            vals.append(pd.NA)
    return pd.array(vals, dtype="boolean")


def load_measurements(
    path: str | os.PathLike,
    *,
    skip_bad_rows: bool = False,
    defaults: Mapping[str, Any] | None = None,
    purpose: Purpose = "any",
) -> pd.DataFrame:
    """Reads a measurement / configuration CSV and normalises it (see :func:`normalise_measurements`).

    Every cell is read as text first (:func:`read_csv_cells`), so that a literal ``nan`` or
    ``inf`` is reported as a bad value rather than taken for a blank.

    Raises:
      AisimError: the file is missing or unreadable, or has bad rows (see above).
    """
    raw = read_csv_cells(path)
    return normalise_measurements(
        raw, source=str(path), skip_bad_rows=skip_bad_rows, defaults=defaults, purpose=purpose
    )


def read_csv_cells(path: str | os.PathLike) -> pd.DataFrame:
    """A CSV file as read, every cell as text (blank cells as ``""``), headers stripped.

    Raises:
      AisimError: the file is missing, not a regular file (a directory, a FIFO), unreadable,
        or not a CSV table (``source`` is the path).
    """
    path = Path(path)
    text = read_text(path, "CSV file")
    try:
        raw = pd.read_csv(
            io.StringIO(text), dtype=str, keep_default_na=False, skipinitialspace=True
        )
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        reason = str(e).strip().splitlines()[0]
        raise AisimError(
            f"{path}: not a readable CSV ({reason})", source=str(path), expected="a CSV table"
        ) from None
    raw.columns = [str(c).strip() for c in raw.columns]
    return raw


def _check_required(df: pd.DataFrame, source: str, purpose: Purpose) -> None:
    def accepted(canon: str) -> str:
        return ", ".join((canon, *ALIASES[canon]))

    def missing(canon: str, why: str = "") -> AisimError:
        return AisimError(
            f"{source}: missing required column '{canon}' ({why}accepted headers:"
            f" {accepted(canon)})",
            source=source,
            field=canon,
            expected=f"a column '{canon}' ({accepted(canon)})",
            hint=None if why else "or pass a default {" + canon + "}",
        )

    needed = [] if purpose == "any" else ["model", "hardware"]
    for canon in needed:
        if canon not in df.columns:
            raise missing(canon)
    if purpose == "fit":
        has_time = "step_time_s" in df.columns
        has_tput = "throughput_samples_per_s" in df.columns
        if not (has_time or has_tput):
            raise AisimError(
                f"{source}: fitting needs a measured value column: step_time_s"
                f" ({accepted('step_time_s')}) or throughput_samples_per_s"
                f" ({accepted('throughput_samples_per_s')})",
                source=source,
                field="step_time_s",
                expected="a column step_time_s or throughput_samples_per_s",
            )
        if not has_time and "global_batch_size" not in df.columns:
            raise missing("global_batch_size", "needed to turn throughput into step time; ")


# Beyond these a cell is a typo, not a run: the model computes in float32 and counts in int32,
# and no training step takes months
MAX_STEP_S = 1e7
MAX_NUMBER = 1e15


def _numbers(col: pd.Series, name: str, problems: _Problems) -> pd.Series:
    vals = np.full(len(col), np.nan)
    integer = name in POSITIVE_INT or name in NON_NEGATIVE_INT
    for i, v in enumerate(col):
        if is_blank(v):
            continue
        try:
            x = as_number(v)
        except ValueError:
            problems.add(i, name, v, "an integer" if integer else "a number")
            continue
        if not math.isfinite(x):
            problems.add(i, name, v, "a finite number (leave the cell blank if not measured)")
        elif integer and abs(x) >= 2**31:
            problems.add(i, name, v, "an integer below 2^31")
        elif name == "step_time_s" and x > MAX_STEP_S:
            problems.add(i, name, v, f"seconds up to {MAX_STEP_S:g} (115 days a step)")
        elif abs(x) > MAX_NUMBER:
            problems.add(i, name, v, f"a number up to {MAX_NUMBER:g}")
        elif name in NON_NEGATIVE_INT:
            if x < 0 or x != round(x):
                problems.add(i, name, v, "a non-negative integer (0 = the default)")
            else:
                vals[i] = x
        elif x <= 0:
            problems.add(i, name, v, "a positive number" if not integer else "a positive integer")
        elif integer and x != round(x):
            problems.add(i, name, v, "a positive integer")
        else:
            vals[i] = x
    return pd.Series(vals, index=col.index)


def _derive_parallel(df: pd.DataFrame, problems: _Problems) -> None:
    """dp = num_gpus/(tp·pp·cp) and num_gpus = dp·tp·pp·cp where blank (cp blank = 1: the
    Megatron-Core rank order tp-cp-dp-pp); checks their consistency."""
    for col in ("num_gpus", "dp", "tp", "pp"):
        if col not in df.columns:
            df[col] = np.nan
    ng = df["num_gpus"].to_numpy(float).copy()
    dp = df["dp"].to_numpy(float).copy()
    tp = df["tp"].to_numpy(float)
    pp = df["pp"].to_numpy(float)
    cp = df["cp"].to_numpy(float) if "cp" in df.columns else np.full(len(df), np.nan)
    cp = np.where(np.isnan(cp), 1.0, cp)
    for i in range(len(df)):
        model_par = tp[i] * pp[i] * cp[i]
        if math.isnan(model_par):
            # With one degree blank, the other must still divide the world size.
            known = [(c, x) for c, x in (("tp", tp[i]), ("pp", pp[i])) if not math.isnan(x)]
            if known and not math.isnan(ng[i]) and ng[i] % known[0][1]:
                c, x = known[0]
                problems.add(i, c, int(x), f"{c} = {int(x)} to divide num_gpus = {int(ng[i])}")
            continue
        names = "tp·pp" if cp[i] == 1 else "tp·pp·cp"
        degrees = f"{int(tp[i])}·{int(pp[i])}" + ("" if cp[i] == 1 else f"·{int(cp[i])}")
        if math.isnan(dp[i]) and not math.isnan(ng[i]):
            if ng[i] % model_par:
                problems.add(
                    i, "tp", int(tp[i]),
                    f"{names} = {degrees} = {int(model_par)} to divide"
                    f" num_gpus = {int(ng[i])}",
                )  # fmt: skip
                continue
            dp[i] = ng[i] / model_par
        elif math.isnan(ng[i]) and not math.isnan(dp[i]):
            ng[i] = dp[i] * model_par
        elif not math.isnan(ng[i]) and dp[i] * model_par != ng[i]:
            problems.add(
                i, "dp", int(dp[i]),
                f"dp·{names} = {int(dp[i])}·{degrees} = {int(dp[i] * model_par)}"
                f" to equal num_gpus = {int(ng[i])}",
            )  # fmt: skip
    df["num_gpus"] = ng
    df["dp"] = dp


def _check_rows(df: pd.DataFrame, problems: _Problems, purpose: Purpose) -> None:
    for kind in ("model", "hardware"):
        names = _preset_names(kind) if kind in df.columns else None
        if names is None:
            continue
        known = set(names)
        for i, v in enumerate(df[kind]):
            if is_blank(v) or v in known:
                continue
            if kind == "model" and v == "custom":
                missing = [c for c in DIMENSIONS if c not in df.columns or is_blank(df[c].iloc[i])]
                if missing:
                    problems.add(i, "model", v, f"'custom' with the columns {', '.join(missing)}")
                continue
            extra = ", or 'custom' with the dimension columns" if kind == "model" else ""
            problems.add(i, kind, v, f"a {kind} preset{extra}{suggest(v, known)}")
    if purpose == "any":
        return
    for kind in ("model", "hardware"):
        for i, v in enumerate(df[kind]):
            if is_blank(v):
                problems.add(i, kind, "", f"a {kind} preset name (the cell is blank)")
    if purpose == "fit" and "throughput_samples_per_s" in df.columns:
        t = df["step_time_s"] if "step_time_s" in df.columns else None
        b = df["global_batch_size"] if "global_batch_size" in df.columns else None
        for i, q in enumerate(df["throughput_samples_per_s"]):
            no_time = t is None or math.isnan(t.iloc[i])
            if no_time and not math.isnan(q) and (b is None or math.isnan(b.iloc[i])):
                problems.add(i, "global_batch_size", "", "a batch size, to turn throughput into"
                             " step time")  # fmt: skip


def _measured(df: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """step_time_s where given, else global_batch_size / throughput; NaN when not measured."""
    n = len(df)
    nan = pd.Series(np.full(n, np.nan), index=df.index)
    t = df["step_time_s"].astype(float) if "step_time_s" in df.columns else nan
    if "throughput_samples_per_s" in df.columns and "global_batch_size" in df.columns:
        derived = df["global_batch_size"].astype(float) / df["throughput_samples_per_s"].astype(
            float
        )
    else:
        derived = nan
    value = t.where(t.notna(), derived)
    if "kind" in df.columns:
        simulated = df["kind"].map(lambda v: str(v).strip().lower() in NOT_MEASURED_KINDS)
        value = value.where(~simulated.astype(bool), np.nan)
    value = value.astype(float)
    return value, value.notna() & np.isfinite(value)


def _to_int(col: pd.Series) -> pd.Series:
    x = col.astype(float).to_numpy()
    return pd.Series(
        pd.array([pd.NA if math.isnan(v) else int(v) for v in x], dtype="Int64"), index=col.index
    )


def data_path(name: str) -> Path:
    """The path of a CSV shipped in ``calibration/data`` (see its SOURCES.md)."""
    return Path(__file__).parent / "data" / name
