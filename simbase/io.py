"""Files in and out: JSON documents read with one clear error, results written atomically.

Every result file is written to a temporary file in the same folder, flushed, and renamed over
the target (``os.replace``), so an interrupted run never leaves half a file behind.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simbase.errors import AisimError

if TYPE_CHECKING:
    import pandas as pd

TABLE_SUFFIXES = (".csv", ".parquet", ".json")


def _a(what: str) -> str:
    """``what`` with its indefinite article: "an experiment file", "a CSV file"."""
    return f"{'an' if what[:1].lower() in 'aeiou' else 'a'} {what}"


def read_text(path: str | os.PathLike, what: str = "file") -> str:
    """A text file's contents, or one :class:`AisimError` line for a missing, unreadable or
    non-text file (a directory, a FIFO, an I/O error)."""
    path = Path(path)
    try:
        if path.exists() and not path.is_file():
            raise AisimError(f"{path}: not a regular file (expected {_a(what)})")
        return path.read_text()
    except FileNotFoundError:
        raise AisimError(f"{path}: {what} not found") from None
    except UnicodeDecodeError:
        raise AisimError(f"{path}: not a text file (expected {_a(what)})") from None
    except OSError as e:
        raise AisimError(f"{path}: cannot read the {what} ({e.strerror or e})") from None


def read_json(path: str | os.PathLike, what: str = "file") -> Any:
    """Parses a JSON file; a missing file or bad JSON is one :class:`AisimError` line."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise AisimError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None


def jsonable(x: Any) -> Any:
    """``x`` with numpy/jax scalars and arrays as Python values, non-finite floats as ``None``,
    and each float to the precision it carries (:func:`carried_float`)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, float):
        return carried_float(x) if math.isfinite(x) else None
    if hasattr(x, "shape") and getattr(x, "shape", None) == ():  # a jax scalar
        return jsonable(np.asarray(x).item())
    return x


def carried_float(x: float) -> float:
    """``x`` written with the digits it carries: a value that is exactly a float32 (the step
    model, the fits and the federated engine compute in float32) becomes the shortest decimal
    that reads back as that float32 (``0.33278394``, not ``0.33278393745422363``); any other
    float is left as it is."""
    x32 = np.float32(x)
    if float(x32) != x or x == int(x):  # not a float32, or a whole number (a count) as it is
        return x
    return float(str(x32))  # numpy writes a float32 as its shortest round-trip decimal


def significant(x: Any, digits: int = 7) -> Any:
    """``x`` (a float, or a dict, list or tuple of them) with each non-integer float to ``digits``
    significant digits: for quantities derived in float64 from the float32 step model and from
    rates published to a few digits (days to train, cost, failures per day), which carry no more
    (``32.85338``, not ``32.853381818013084``). Whole numbers, non-finite values and everything
    else are left as they are."""
    if isinstance(x, dict):
        return {k: significant(v, digits) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return type(x)(significant(v, digits) for v in x)
    if isinstance(x, float) and math.isfinite(x) and x != int(x):
        return float(f"{x:.{digits}g}")
    return x


def carried_floats(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with each float64 column whose every value is exactly a float32 held as float32,
    so that a CSV writes the digits the values carry (``0.31983986``, not
    ``0.31983986496925354``); no value changes, and other columns are left as they are."""
    cast = {}
    for name in df.columns:
        col = df[name]
        if col.dtype != np.float64:
            continue
        values = col.to_numpy()
        with np.errstate(over="ignore", invalid="ignore"):
            same = values.astype(np.float32).astype(np.float64) == values
        if np.all(same | np.isnan(values)):
            cast[name] = np.float32
    return df.astype(cast) if cast else df


def to_json(obj: Any) -> str:
    """Serialises results (numpy/jax scalars, NaN as null) to an indented JSON string."""
    return json.dumps(jsonable(obj), indent=2, sort_keys=False)


def check_new_file(path: str | os.PathLike | None, field: str = "out") -> None:
    """Checks, before any work starts, that an output path can be written as a file: not an
    existing directory or special file (a FIFO), its folder not a file.

    Raises:
      AisimError: naming ``field`` and the path.
    """
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise AisimError(field=field, value=str(path), expected="a file name, not a directory")
    if p.exists() and not p.is_file():
        raise AisimError(field=field, value=str(path), expected="a regular file to write")
    parent = next((q for q in p.parents if q.exists()), None)
    if parent is not None and not parent.is_dir():
        raise AisimError(
            field=field, value=str(path), expected=f"a path in a folder ({parent} is a file)"
        )


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Writes ``data`` to ``path`` via a temporary file and ``os.replace``.

    Raises:
      AisimError: the path cannot be a file (:func:`check_new_file`); no temporary file is left.
    """
    path = Path(path)
    check_new_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Writes text atomically (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode())


def check_table_suffix(path: str | os.PathLike | None, allowed: tuple[str, ...] = TABLE_SUFFIXES):
    """Checks an output path's suffix, and that it can be written as a file
    (:func:`check_new_file`), before any work starts (field ``out``)."""
    if path is not None and Path(path).suffix.lower() not in allowed:
        raise AisimError(
            field="out", value=str(path), expected="a file name ending in " + ", ".join(allowed)
        )
    check_new_file(path)


def write_table(df: pd.DataFrame, path: str | os.PathLike) -> None:
    """Writes a table atomically as CSV, Parquet or JSON records, chosen by the file suffix."""
    path = Path(path)
    check_table_suffix(path)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        atomic_write_text(path, carried_floats(df).to_csv(index=False))
    elif suffix == ".json":
        atomic_write_text(path, to_json(df.to_dict(orient="records")))
    else:
        buf = io.BytesIO()
        try:
            df.to_parquet(buf, index=False)
        except ImportError as e:
            raise AisimError(f"{path}: writing Parquet needs pyarrow ({e})", usage=False) from None
        atomic_write_bytes(path, buf.getvalue())
