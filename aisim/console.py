"""Console helpers shared by every CLI area: one-line errors, JSON output, tables that fit.

Contract: a command body runs inside :func:`guard`; an :class:`~simbase.errors.AisimError`
becomes one red line on stderr and exit code 2 (usage) or 1 (other). Tables for people are
built with :func:`fitted_table` (or :func:`rich_table` for a DataFrame) and printed with
:func:`print_table`: they fit the console's width by dropping the minor columns first, with a
note naming them, unless the command's ``--wide`` asks for every column. The console is as
wide as ``$COLUMNS`` when it is set, else the terminal; output that goes to a pipe or a file
(no terminal) gets :data:`PIPE_WIDTH` columns.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import typer
from rich import box
from rich.console import Console, ConsoleDimensions
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from simbase.errors import AisimError
from simbase.io import to_json

if TYPE_CHECKING:
    import pandas as pd

# When the output is not a terminal (a pipe, a file, a test) rich would fall back to 80
# columns and fold names; tables are wide, so give them room unless $COLUMNS says otherwise.
PIPE_WIDTH = 160


class _Console(Console):
    """A rich console whose width is read at each use: ``$COLUMNS`` when set, the terminal's
    when the stream is one, else :data:`PIPE_WIDTH`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if kwargs.get("width") is None:
            # rich fixes the width from $COLUMNS as it was when the console was made (at import);
            # read it at each use instead
            self._width = None

    @property
    def size(self) -> ConsoleDimensions:
        dims = super().size
        if self._width is not None or os.environ.get("COLUMNS", "").strip().isdigit():
            return dims
        isatty = getattr(self.file, "isatty", None)
        if isatty is not None and isatty():
            return dims
        return ConsoleDimensions(PIPE_WIDTH, dims.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)


console = _Console()
err_console = _Console(stderr=True)


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
    the file's own field names, while the fields its hint names (``"pass {hardware} h100"``)
    are what the user can change here: this command's options.
    """
    try:
        yield
    except AisimError as e:
        table = flags or {}

        def flag(field: str) -> str:
            return table.get(field) or "--" + field.replace("_", "-")

        if e.source is not None and e.hint:
            e.hint = _hint_with_flags(e.hint, flag)
        message = e.render(flag if e.source is None else None, source="command line")
        raise fail(message, 2 if e.usage else 1) from None
    except FileNotFoundError as e:
        raise fail(f"{e.filename}: file not found", 2) from None
    except KeyboardInterrupt:
        raise fail("interrupted", 130) from None


def _hint_with_flags(hint: str, flag) -> str:
    """A hint's ``{field}`` placeholders as this command's options."""

    class Flags(dict):
        def __missing__(self, key: str) -> str:
            return flag(key)

    return hint.format_map(Flags())


def wrote(*paths: Path | None, what: str = "") -> None:
    """``wrote PATH`` for each file written (``None``: none), ``what`` before the path."""
    for path in paths:
        if path is not None:
            console.print(f"wrote {what}{path}", highlight=False)


def print_json(obj: Any) -> None:
    """Prints exactly one JSON document on stdout (no rich markup)."""
    typer.echo(to_json(obj))


def fitted_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    drop: Sequence[str] = (),
    left: Sequence[str] = (),
    wide: bool = False,
    width: int | None = None,
    wide_flag: str | None = "--wide",
    **table_options: Any,
) -> Table:
    """A rich table for people that fits ``width`` (default: the console's), one line per row.

    Columns are dropped in the order of ``drop`` (header names, the least important first)
    until the table's natural width fits; the caption then names them: ``hidden: optim,
    overhead (use --wide)``. Cells never wrap: if the kept columns are still too wide, the
    text columns (``left``) are cut with an ellipsis.

    Args:
      headers: the column headers, in order.
      rows: the cells of each row, as text (rich markup allowed).
      drop: the headers that may be dropped, first dropped first.
      left: the headers of left-justified columns (others are right-justified).
      wide: keep every column (print with :func:`print_table` ``wide=True``).
      width: the width to fit (default ``console.width``).
      wide_flag: the option that shows every column, named in the note (None: no option).
      **table_options: passed to :class:`rich.table.Table` (``title``, ``box``, ...).
    """
    width = console.width if width is None else width
    keep = list(headers)
    hidden: list[str] = []
    table = _build_table(keep, headers, rows, left, table_options)
    for name in drop if not wide else ():
        if natural_width(table) <= width:
            break
        if name in keep:
            keep.remove(name)
            hidden.append(name)
            table = _build_table(keep, headers, rows, left, table_options)
    if hidden:
        how = f" (use {wide_flag})" if wide_flag else ""
        table.caption = f"hidden: {', '.join(hidden)}{how}"
        table.caption_justify = "left"
    return table


def _build_table(keep, headers, rows, left, options) -> Table:
    """The table of the ``keep`` columns. Every cell stays on one line: the left-justified
    (text) columns are the ones rich may narrow when the table is still too wide, and their
    cells are then cut with an ellipsis; the numeric columns keep their width."""
    options = dict(options)
    options.setdefault("title_justify", "left")
    table = Table(**options)
    index = [list(headers).index(h) for h in keep]
    for h in keep:
        text = h in left
        # a header is never cut: a text column narrows its cells, not below its header
        table.add_column(h, justify="left" if text else "right", no_wrap=not text, min_width=len(h))
    for row in rows:
        table.add_row(*(_one_line(row[i]) for i in index))
    return table


def _one_line(cell: str) -> Text:
    text = Text.from_markup(cell, overflow="ellipsis")
    text.no_wrap = True
    return text


def natural_width(table: Table) -> int:
    """The columns a table needs to show every cell on one line."""
    options = console.options.update(width=10_000)
    return Measurement.get(console, options, table).maximum


def print_table(table: Table, *, wide: bool = False) -> None:
    """Prints a table; ``wide`` prints it at its natural width, wider than the console if need
    be (never folded), as ``--wide`` asks."""
    need = natural_width(table)
    if not wide or need <= console.width:
        console.print(table)
    else:
        Console(file=console.file, width=need, color_system=console.color_system).print(table)


def rich_table(
    df: pd.DataFrame,
    title: str | None = None,
    float_fmt: str = "{:.4g}",
    *,
    drop: Sequence[str] | None = None,
    wide: bool = False,
    wide_flag: str | None = "--wide",
) -> Table:
    """A rich table of a DataFrame, for people.

    With ``drop`` (column names, the least important first) the table fits the console as
    :func:`fitted_table` makes it, and names what it hid; without, every column is shown and
    rich wraps the cells as it must.
    """
    cells = [[_cell(v, float_fmt) for v in row] for row in df.itertuples(index=False)]
    names = [str(c) for c in df.columns]
    shown = short_headers(names)
    headers = [shown[c] for c in names]
    if drop is not None:
        return fitted_table(
            headers,
            cells,
            drop=[shown.get(str(d), str(d)) for d in drop],
            wide=wide,
            wide_flag=wide_flag,
            title=title,
            show_lines=False,
            title_justify="center",
        )
    table = Table(title=title, show_lines=False)
    for col in headers:
        table.add_column(col, justify="right")
    for row in cells:
        table.add_row(*row)
    return table


# a column's header in tables for people (its name in --json, CSV and the library is unchanged):
# the short names the CLI's options use, so that a header fits its numbers instead of being cut
_SHORT = {"source_file": "file", "source_row": "row", "num_gpus": "gpus", "world_size": "gpus",
          "num_layers": "layers", "hidden_size": "hidden", "global_batch_size": "batch",
          "batch_size": "batch", "micro_batch_size": "mbs", "seq_len": "seq",
          "zero_stage": "zero", "step_time_s": "step_s", "measured_step_time_s": "measured_s",
          "predicted_step_time_s": "pred_s", "throughput_samples_per_s": "samples/s",
          "tflops_per_gpu": "tflops", "feasible": "fits", "error_pct": "error_%",
          "sim_time_s": "sim_s", "test_accuracy": "test_acc", "clients_sampled": "sampled",
          "clients_kept": "kept", "clients_with_test": "tested"}  # fmt: skip
_PREFIXES = (("predicted_", "pred_"), ("chosen_", "best_"), ("cv_", "cv_"))
_SUFFIXES = ("_lo", "_hi")


def short_header(name: str) -> str:
    """The header a table shows for a result column: ``measured_step_time_s`` -> ``measured_s``,
    ``predicted_throughput_samples_per_s`` -> ``pred_samples/s``, ``cv_error_pct`` ->
    ``cv_error_%``, ``chosen_micro_batch_size`` -> ``best_mbs``; other names as they are."""
    if name in _SHORT:
        return _SHORT[name]
    for prefix, short in _PREFIXES:
        if name.startswith(prefix) and len(name) > len(prefix):
            return short + short_header(name[len(prefix) :])
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in _SHORT:
            return _SHORT[name[: -len(suffix)]] + suffix
    return name


def short_headers(names: Sequence[str]) -> dict[str, str]:
    """:func:`short_header` of each name, except where two would read the same (both keep
    their names)."""
    short = {n: short_header(n) for n in names}
    seen: dict[str, int] = {}
    for s in short.values():
        seen[s] = seen.get(s, 0) + 1
    return {n: s if seen[s] == 1 else n for n, s in short.items()}


def _cell(v: Any, float_fmt: str) -> str:
    if isinstance(v, float | np.floating):
        return float_fmt.format(v)
    return str(v)


# a compact table style for wide numeric tables (no vertical rules)
COMPACT = dict(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), collapse_padding=True)
