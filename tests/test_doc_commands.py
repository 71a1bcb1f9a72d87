"""Every command shown in README.md and the documentation pages runs, with the exit code shown.

Commands are the ``$ ...`` lines of ```` ```console ```` blocks (see ``docs/doc_commands.py``);
a trailing ``# exit N`` states an expected non-zero exit code, and a failing command must say why
in one ``error:`` line on stderr, without a traceback (an error about a file may list its bad
rows on the lines below, one ``file:row:`` line each). Each distinct command runs once, in page order, in one
scratch folder that links to the repository's folders and holds a copy of ``docs/`` (some commands
rewrite figures), so ``--out`` files land there and later commands of a page can read them. The
benchmarks honour ``AISIM_QUICK=1`` (smoke-test sizes), which this test sets.

A command that is one plain ``aisim ...`` call (no redirection, ``&``, variable or prefix), or one
piped into other programs (``aisim ... --json | jq ...``), runs that call in this process, through
the console script's own entry point (:func:`aisim.app.main`) with the same arguments, folder and
environment, its stdout and stderr captured (stdout fed to the rest of the pipe in bash, whose
last program gives the exit code, as bash does) and an escaping exception written as the
traceback Python would print: that is what running it in bash does, less starting Python and
importing aisim (2 s each), and the programs one command compiles are there for the next. The
others (scripts, redirections, several processes, ``XLA_FLAGS=...``) run in bash.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import traceback
from pathlib import Path

import jax
import pytest

from aisim.app import main as aisim_main

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


SHELL = set("|&;<>$`(){}*?~\\")  # anything bash would treat specially


def plain_aisim_argv(command: str) -> list[str] | None:
    """The arguments of a command that is one plain ``aisim`` call, else None."""
    if SHELL & set(command):
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    return words[1:] if words and words[0] == "aisim" else None


def run_in_process(argv: list[str], cwd: Path, env: dict[str, str]):
    """``aisim ARGV`` through its entry point in this process (module docstring): the exit
    code, stdout and stderr as a subprocess would give them."""
    out, err = io.StringIO(), io.StringIO()
    saved = (dict(os.environ), os.getcwd(), sys.argv)
    promotion = jax.config.jax_numpy_rank_promotion
    os.environ.clear()
    os.environ.update(env)  # with the session's JAX_COMPILATION_CACHE_DIR (tests/conftest.py)
    os.chdir(cwd)
    sys.argv = ["aisim", *argv]
    jax.config.update("jax_numpy_rank_promotion", "allow")  # as in a user's process
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                aisim_main()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:  # what Python prints for an exception nothing caught
                traceback.print_exc(file=err)
                code = 1
    finally:
        jax.config.update("jax_numpy_rank_promotion", promotion)
        os.environ.clear()
        os.environ.update(saved[0])
        os.chdir(saved[1])
        sys.argv = saved[2]
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def run_command(command: str, cwd: Path, env: dict[str, str]):
    """One documented command as bash would run it (module docstring)."""
    head, bar, rest = command.partition(" | ")
    argv = plain_aisim_argv(head)
    if argv is None:
        return doc_commands.run(command, cwd, env, timeout_s=600)
    r = run_in_process(argv, cwd, env)
    if not bar:
        return r
    tail = subprocess.run(
        ["bash", "-c", rest], cwd=cwd, env=env, input=r.stdout, capture_output=True, text=True
    )
    return subprocess.CompletedProcess(
        command, tail.returncode, tail.stdout, r.stderr + tail.stderr
    )


def test_plain_aisim_argv():
    assert plain_aisim_argv("aisim perf grid --gpus 8,16 --json") == [
        "perf",
        "grid",
        "--gpus",
        "8,16",
        "--json",
    ]
    assert plain_aisim_argv("aisim fl run --x 'a b'") == ["fl", "run", "--x", "a b"]
    for shell in (
        "aisim a | jq .x",
        "aisim a > f.md",
        "X=1 aisim a",
        "aisim a & aisim b",
        "python x.py",
        "aisim a --out $HOME",
    ):
        assert plain_aisim_argv(shell) is None


def test_a_piped_command_gives_what_bash_gives(tmp_path):
    env = doc_commands.command_env(columns=160, quick=True)
    for command in ("aisim --version | tr a-z A-Z", "aisim --version | grep -c nothing"):
        ours = run_command(command, tmp_path, env)
        bash = doc_commands.run(command, tmp_path, env)
        assert (ours.returncode, ours.stdout) == (bash.returncode, bash.stdout), command


@pytest.mark.parametrize("cmd", COMMANDS, ids=[_id(c) for c in COMMANDS])
def test_doc_command_runs(cmd: doc_commands.Command, workdir: Path, free_compiled):
    env = doc_commands.command_env(columns=160, quick=True)
    r = run_command(cmd.command, workdir, env)
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
