"""Every command shown in the README runs, with the exit code the README says.

Commands are the ``$ ...`` lines of the README's ```console blocks. A trailing ``# exit N``
states an expected non-zero exit code (the README shows some bad-input examples). Commands run in
a scratch folder that links to the repository's folders (and holds a copy of ``docs/``, whose
figures some commands rewrite), so ``--out`` files land there. Benchmarks
honour ``AISIM_QUICK=1`` (small sizes), which this test sets.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def readme_commands() -> list[tuple[str, int]]:
    text = README.read_text()
    cmds = []
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            i += 1
            if not line.startswith("$ "):
                continue
            cmd = line[2:].strip()
            while cmd.endswith("\\") and i < len(lines):
                cmd = cmd[:-1].rstrip() + " " + lines[i].strip()
                i += 1
            expected = 0
            m = re.search(r"\s+#\s*exit\s+(\d+)\s*$", cmd)
            if m:
                expected = int(m.group(1))
                cmd = cmd[: m.start()].rstrip()
            cmds.append((cmd, expected))
    return cmds


COMMANDS = readme_commands()


def test_readme_shows_commands():
    assert len(COMMANDS) >= 10
    assert any(c.startswith("aisim perf grid") for c, _ in COMMANDS)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("readme")
    for entry in ROOT.iterdir():
        if entry.name.startswith(".") or entry.name in ("out",):
            continue
        if entry.name == "docs":
            # a copy: commands such as `calibrate fit --plot docs/figures/...` rewrite the shipped
            # figures, which must not change the checkout
            shutil.copytree(entry, d / entry.name)
        else:
            (d / entry.name).symlink_to(entry)
    return d


@pytest.mark.parametrize("cmd, expected", COMMANDS, ids=[c[:60] for c, _ in COMMANDS])
def test_readme_command_runs(cmd, expected, workdir):
    # run as a user would, in bash, with this interpreter's bin folder (the project's `aisim`
    # and `python`) first on PATH
    bindir = str(Path(sys.executable).parent)
    env = dict(
        os.environ,
        AISIM_QUICK="1",
        MPLBACKEND="Agg",
        COLUMNS="160",
        PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
    )
    r = subprocess.run(
        ["bash", "-c", cmd], cwd=workdir, env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == expected, (
        f"{cmd}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    )
    if expected:
        err = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(err) == 1 and "Traceback" not in r.stderr, r.stderr


def test_readme_is_built_from_its_sections():
    """README.md is what ``python docs/build_readme.py`` makes of ``docs/readme/*.md``."""
    sys.path.insert(0, str(ROOT / "docs"))
    import build_readme

    assert README.read_text() == build_readme.build_text()[0], "run: python docs/build_readme.py"


def test_readme_figures_exist():
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README.read_text())
    for f in figures:
        assert (ROOT / f).is_file(), f
    # every figure the repository ships is shown
    shipped = {f"docs/figures/{p.name}" for p in (ROOT / "docs" / "figures").glob("*.png")}
    assert shipped <= set(figures), shipped - set(figures)
