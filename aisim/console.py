"""Console helpers shared by every CLI area: one-line errors, JSON output, atomic writes.

Contract: a command body runs inside :func:`guard`; an :class:`~perfmodel.errors.AisimError`
becomes one red line on stderr and exit code 2 (usage) or 1 (other). Results are written with
:func:`write_table` / :func:`atomic_write_text`, which write to a temporary file in the same
folder and rename it, so an interrupted run never leaves a half-written file.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import typer
from rich.console import Console
from rich.table import Table

from perfmodel.errors import AisimError

# Tables are wide; when the output is not a terminal (a pipe, a file, a test) rich would fall
# back to 80 columns and fold names, so give it room.
_WIDTH = None if sys.stdout.isatty() else 160
console = Console(width=_WIDTH)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Prints one red line on stderr and returns the ``typer.Exit`` to raise."""
    err_console.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


@contextlib.contextmanager
def guard() -> Iterator[None]:
    """Turns domain errors into one line and an exit code (2 usage, 1 other)."""
    try:
        yield
    except AisimError as e:
        raise fail(str(e), 2 if e.usage else 1) from None
    except FileNotFoundError as e:
        raise fail(f"{e.filename}: file not found", 2) from None
    except KeyboardInterrupt:
        raise fail("interrupted", 130) from None


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if hasattr(x, "shape") and getattr(x, "shape", None) == ():  # jax scalar
        return _jsonable(np.asarray(x).item())
    return x


def to_json(obj: Any) -> str:
    """Serialises results (numpy/jax scalars, NaN as null) to a JSON string."""
    return json.dumps(_jsonable(obj), indent=2, sort_keys=False)


def print_json(obj: Any) -> None:
    """Prints exactly one JSON document on stdout (no rich markup)."""
    typer.echo(to_json(obj))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Writes ``data`` to ``path`` via a temporary file and ``os.replace``."""
    path = Path(path)
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


def write_table(df: pd.DataFrame, path: str | os.PathLike) -> None:
    """Writes a table atomically as CSV, Parquet or JSON, chosen by the file suffix."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        atomic_write_text(path, df.to_csv(index=False))
    elif suffix == ".json":
        atomic_write_text(path, to_json(df.to_dict(orient="records")))
    elif suffix == ".parquet":
        import io

        buf = io.BytesIO()
        try:
            df.to_parquet(buf, index=False)
        except ImportError as e:
            raise AisimError(f"{path}: writing Parquet needs pyarrow ({e})", usage=False) from None
        atomic_write_bytes(path, buf.getvalue())
    else:
        raise AisimError(
            f"--out {path}: suffix {suffix or '(none)'!r}: expected .csv, .parquet or .json"
        )


def check_out_suffix(path: Path | None, allowed: tuple[str, ...] = (".csv", ".parquet", ".json")):
    """Validates an ``--out`` path's suffix before any work starts."""
    if path is not None and path.suffix.lower() not in allowed:
        raise AisimError(
            f"--out {path}: suffix {path.suffix or '(none)'!r}: expected one of {', '.join(allowed)}"
        )


def rich_table(df: pd.DataFrame, title: str | None = None, float_fmt: str = "{:.4g}") -> Table:
    """A rich table of a DataFrame, for people."""
    table = Table(title=title, show_lines=False)
    for col in df.columns:
        table.add_column(str(col), justify="right")
    for row in df.itertuples(index=False):
        cells = []
        for v in row:
            if isinstance(v, float | np.floating):
                cells.append(float_fmt.format(v))
            else:
                cells.append(str(v))
        table.add_row(*cells)
    return table
