"""Console helpers shared by every CLI area: one-line errors, JSON output, atomic writes.

Contract: a command body runs inside :func:`guard`; an :class:`~simbase.errors.AisimError`
becomes one red line on stderr and exit code 2 (usage) or 1 (other). Results are written with
:func:`write_table` / :func:`atomic_write_text`, which write to a temporary file in the same
folder and rename it, so an interrupted run never leaves a half-written file.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import typer
from rich.console import Console
from rich.table import Table

from simbase.errors import AisimError
from simbase.io import TABLE_SUFFIXES, check_table_suffix, to_json

# Tables are wide; when the output is not a terminal (a pipe, a file, a test) rich would fall
# back to 80 columns and fold names, so give it room.
_WIDTH = None if sys.stdout.isatty() else 160
console = Console(width=_WIDTH)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Prints one red line on stderr and returns the ``typer.Exit`` to raise."""
    err_console.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def flag_names(*fields: str, **renamed: str) -> dict[str, str]:
    """Library field names -> command-line flags: ``num_gpus`` -> ``--num-gpus`` for each name in
    ``fields``, and ``renamed`` for the flags spelled otherwise (``num_gpus="--gpus"``)."""
    return {f: "--" + f.replace("_", "-") for f in fields} | renamed


@contextlib.contextmanager
def guard(flags: Mapping[str, str] | None = None) -> Iterator[None]:
    """Turns domain errors into one line and an exit code (2 usage, 1 other).

    ``flags`` maps library field names to this command's options. An error about an argument
    (no source) names the command line and its flag; an error from a file keeps its source, and
    the file's own field names.
    """
    try:
        yield
    except AisimError as e:
        table = flags or {}

        def flag(field: str) -> str:
            return table.get(field) or "--" + field.replace("_", "-")

        message = e.render(flag if e.source is None else None, source="command line")
        raise fail(message, 2 if e.usage else 1) from None
    except FileNotFoundError as e:
        raise fail(f"{e.filename}: file not found", 2) from None
    except KeyboardInterrupt:
        raise fail("interrupted", 130) from None


def print_json(obj: Any) -> None:
    """Prints exactly one JSON document on stdout (no rich markup)."""
    typer.echo(to_json(obj))


def check_out_suffix(path: Path | None, allowed: tuple[str, ...] = TABLE_SUFFIXES) -> None:
    """Validates an ``--out`` path's suffix before any work starts."""
    check_table_suffix(path, allowed)


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
