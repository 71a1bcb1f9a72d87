"""Every command shown in README.md and the documentation pages runs, with the exit code shown.

Commands are the ``$ ...`` lines of ```` ```console ```` blocks (see ``docs/doc_commands.py``);
a trailing ``# exit N`` states an expected non-zero exit code, and a failing command must say why
in one ``error:`` line on stderr, without a traceback (an error about a file may list its bad
rows on the lines below, one ``file:row:`` line each). Each distinct command runs once, in page order, in one
scratch folder that links to the repository's folders and holds a copy of ``docs/`` (some commands
rewrite figures), so ``--out`` files land there and later commands of a page can read them. The
benchmarks honour ``AISIM_QUICK=1`` (smoke-test sizes), which this test sets.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
import doc_commands  # noqa: E402

pytestmark = pytest.mark.slow

COMMANDS = doc_commands.all_commands(ROOT)
ROW_DETAIL = re.compile(r"^\S+:\d+: ")  # `file.csv:3: field 'dp' = 2: expected ...`


def _id(c: doc_commands.Command) -> str:
    return f"{c.path.relative_to(ROOT)}:{c.first_line + 1}:{c.command[:50]}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return doc_commands.make_workdir(tmp_path_factory.mktemp("docs") / "work", ROOT)


@pytest.mark.parametrize("cmd", COMMANDS, ids=[_id(c) for c in COMMANDS])
def test_doc_command_runs(cmd: doc_commands.Command, workdir: Path):
    env = doc_commands.command_env(columns=160, quick=True)
    r = doc_commands.run(cmd.command, workdir, env, timeout_s=600)
    assert r.returncode == cmd.expected_exit, (
        f"{_id(cmd)}\n$ {cmd.command}\nexit {r.returncode}, expected {cmd.expected_exit}\n"
        f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    )
    if cmd.expected_exit:
        # one line that says why; an error about a file may list its bad rows below, one each
        err = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert err and err[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr
        assert all(ROW_DETAIL.match(ln) for ln in err[1:]), r.stderr


TABLE_SCRIPT = re.compile(r"python (docs/make_\w+\.py) > (\S+\.md)")
NUMBER = re.compile(r"[-+]?\d+(?:\.(\d+))?")


def same_row(printed: str, pasted: str) -> bool:
    """A table row as pasted on a page is the row a script prints: its text equal, integers
    (counts) exact, and each number with decimals within two units of its last printed digit. A
    fit's last digit moves with XLA's float rounding from machine to machine (an L-BFGS fit's
    8.06% prints as 8.07% elsewhere): an exact match would fail on a fresh machine, while a
    real change of a result still fails."""
    if NUMBER.sub("#", printed) != NUMBER.sub("#", pasted):
        return False
    for a, b in zip(NUMBER.finditer(printed), NUMBER.finditer(pasted), strict=True):
        decimals = max(len(a.group(1) or ""), len(b.group(1) or ""))
        if not decimals and a.group() != b.group():
            return False
        if abs(float(a.group()) - float(b.group())) > 2.01 * 10.0**-decimals:
            return False
    return True


def test_same_row_allows_the_last_digit_only():
    row = "| fit | LOO mean 2.99%, max 8.06% | 140 | +30.2% |"
    assert same_row(row, row.replace("8.06", "8.07")) and same_row(row, row.replace("8.06", "8.04"))
    assert not same_row(row, row.replace("140", "141"))  # a count or a published integer
    assert not same_row(row, row.replace("8.06", "8.16"))  # a real change
    assert not same_row(row, row.replace("+30.2%", "+30.5%"))
    assert not same_row(row, row.replace("fit", "fits")) and not same_row(row, row + " 1 |")


def test_pasted_tables_are_what_their_scripts_print(workdir: Path):
    """A page that shows ``$ python docs/make_X.py > F.md`` shows the table that F.md holds."""
    checked = 0
    for cmd in COMMANDS:
        m = TABLE_SCRIPT.fullmatch(cmd.command)
        if not m:
            continue
        out = workdir / m.group(2)
        if not out.is_file():
            pytest.skip(f"{out.name} not written: run the whole file")
        page = [ln.rstrip() for ln in cmd.path.read_text().splitlines() if ln.startswith("|")]
        rows = [ln.rstrip() for ln in out.read_text().splitlines() if ln.startswith("|")]
        missing = [r for r in rows if not any(same_row(r, p) for p in page)]
        assert rows and not missing, (
            f"{cmd.path.name}: rows not as `{m.group(1)}` prints them:\n" + ("\n".join(missing))
        )
        checked += 1
    assert checked >= 3
