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
        page = cmd.path.read_text().splitlines()
        rows = [ln.rstrip() for ln in out.read_text().splitlines() if ln.startswith("|")]
        missing = [r for r in rows if r not in page]
        assert rows and not missing, (
            f"{cmd.path.name}: rows not as `{m.group(1)}` prints them:\n" + ("\n".join(missing))
        )
        checked += 1
    assert checked >= 3
