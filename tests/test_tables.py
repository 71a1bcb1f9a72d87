"""Tables for people fit the terminal they are shown in: no line wider than ``$COLUMNS``, one
line per data row, the minor columns dropped first with a note that names them, and ``--wide``
to show them all. Without ``$COLUMNS``, output that is not a terminal gets 160 columns."""

from __future__ import annotations

import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from aisim import console as console_mod
from aisim.app import app

runner = CliRunner()
# a quick grid (GPT-3 13B on 64 A100s); the hardware sweep adds the per-point table
GRID = [
    "perf",
    "grid",
    "--model",
    "gpt3-13b",
    "--gpus",
    "64",
    "--global-batch",
    "512",
    "--recompute",
    "full",
    "--zero",
    "1",
]
SWEEP = [*GRID[:5], "64,128", *GRID[6:], "--hardware", "a100-80gb,h100-sxm", "--top", "4"]
LABEL = re.compile(r"dp\d+ tp\d+ pp\d+ ")
MINOR = ("overhead", "optim", "p2p", "$/Mtok")


def _run(args: list[str], columns: int | None) -> str:
    env = {"COLUMNS": None if columns is None else str(columns)}
    r = runner.invoke(app, args, env=env)
    assert r.exit_code == 0, r.output
    return r.stdout


def _header(out: str) -> str:
    return next(line for line in out.splitlines() if re.search(r"\bstrategy\b", line))


@pytest.mark.parametrize("columns", [80, 100, 160])
def test_grid_table_fits_the_terminal(columns):
    out = _run(GRID, columns)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= columns, out
    rows = [line for line in lines if LABEL.search(line)]
    assert len(rows) == 10, out  # the top 10, each on one line
    assert all(re.search(r"\d+\.\d%", row) for row in rows), out  # with its MFU
    header = _header(out)
    for must in ("strategy", "step", "tokens/s", "MFU"):
        assert must in header
    hidden = [ln for ln in lines if ln.startswith("hidden:")]
    shown = [c for c in MINOR if re.search(rf"(^|\s){re.escape(c)}(\s|$)", header)]
    if columns < 160:
        # the note is the table's caption: it may wrap onto a second line, each padded to the
        # table's width
        assert hidden, out
        note = " ".join(ln.strip() for ln in lines[lines.index(hidden[0]) :][:2])
        assert "(use --wide)" in note, out
        for c in MINOR:
            assert (c in shown) != (c in note), (c, out)
    else:
        assert not hidden and shown == list(MINOR), out


@pytest.mark.parametrize("columns", [80, 100])
def test_wide_keeps_every_column(columns):
    out = _run([*GRID, "--wide"], columns)
    header = _header(out)
    for c in ("compute", "bubble", *MINOR, "GiB"):
        assert c in header.split(), (c, header)
    assert "hidden:" not in out
    assert len([line for line in out.splitlines() if LABEL.search(line)]) == 10


def test_sweep_tables_fit_100_columns():
    out = _run(SWEEP, 100)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 100, out
    assert "best strategy of each sweep point" in out
    # 4 top rows and 4 sweep points (2 GPU counts x 2 hardware), one line each
    assert len([line for line in lines if LABEL.search(line)]) == 8, out
    assert "cheapest per million tokens" in out


def test_pipes_get_160_columns_without_COLUMNS():
    out = _run(GRID, None)
    assert "hidden:" not in out
    assert all(c in _header(out).split() for c in MINOR)


@pytest.mark.parametrize("columns", [60, 80])
def test_presets_fit_the_terminal(columns):
    out = _run(["presets"], columns)
    assert max(len(line) for line in out.splitlines()) <= columns, out
    assert "a100-80gb" in out and "gpt3-175b" in out  # names are never cut
    assert "hidden:" in out
    wide = _run(["presets", "--wide"], columns)
    assert "hidden:" not in wide and "IB GB/s/GPU" in wide and "$/h" in wide


def test_fitted_table_drops_in_priority_order_and_names_what_it_hid():
    headers = ["name", "a", "b", "c"]
    rows = [["first-row-name", "1" * 12, "2" * 12, "3" * 12]]
    rec = Console(width=40, record=True)
    table = console_mod.fitted_table(
        headers, rows, drop=["c", "a", "b"], left=["name"], width=40, title="t"
    )
    rec.print(table)
    text = rec.export_text()
    assert max(len(line) for line in text.splitlines()) <= 40
    assert "hidden: c, a (use --wide)" in text and "2" * 12 in text and "1" * 12 not in text
    everything = console_mod.fitted_table(headers, rows, drop=["c"], width=40, wide=True)
    assert console_mod.natural_width(everything) > 40 and everything.caption is None


def test_result_columns_get_short_headers_and_keep_their_names_elsewhere():
    short = console_mod.short_header
    assert short("measured_step_time_s") == "measured_s"
    assert short("predicted_step_time_s") == "pred_s"
    assert short("cv_predicted_step_time_s") == "cv_pred_s"
    assert short("cv_error_pct") == "cv_error_%"
    assert short("predicted_throughput_samples_per_s") == "pred_samples/s"
    assert short("chosen_micro_batch_size") == "best_mbs"
    assert short("step_time_s_lo") == "step_s_lo"
    assert short("compute %") == "compute %"  # a header already chosen for people
    # two columns that would read the same keep their names
    both = console_mod.short_headers(["global_batch_size", "batch_size", "num_gpus"])
    assert both == {"global_batch_size": "global_batch_size", "batch_size": "batch_size",
                    "num_gpus": "gpus"}  # fmt: skip
    import pandas as pd

    df = pd.DataFrame({"measured_step_time_s": [1.5], "error_pct": [2.0]})
    table = console_mod.rich_table(df, drop=["error_pct"])
    assert [str(c.header) for c in table.columns] == ["measured_s", "error_%"]
