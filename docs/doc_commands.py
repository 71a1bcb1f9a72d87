"""The shell commands that README.md and the documentation pages show, and their real output.

A command is a ``$ ...`` line of a ```` ```console ```` block (a trailing ``\\`` continues it on
the next line). A trailing ``# exit N`` states the exit code the command is expected to return
(some pages show bad input); without it the command must succeed. The lines after a command, up
to the next command or the end of the block, are its output as pasted.

``tests/test_doc_commands.py`` runs every command (each distinct command once, in the order of
:func:`doc_files`) in one scratch folder that links to the repository's folders and holds a copy
of ``docs/`` (some commands rewrite figures). Run this file to paste fresh output under every
command::

    python docs/doc_commands.py                 # every page (the benchmarks take minutes)
    python docs/doc_commands.py docs/guides/grid.md --match "perf grid"

Outputs are printed at ``COLUMNS=100`` so that tables fit the page. An output that was trimmed
with a ``...`` line keeps as many lines before and after the ``...`` as it had.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXIT_NOTE = re.compile(r"\s+#\s*exit\s+(\d+)\s*$")
FENCE = re.compile(r"^(\s*)```")


@dataclass(frozen=True)
class Command:
    """One ``$`` command of a page: where it is, what runs, what it must return."""

    path: Path
    first_line: int  # index of the `$ ` line in the file
    last_line: int  # index of the command's last continuation line
    output_end: int  # index one past the command's pasted output
    command: str  # what bash runs (continuations joined, `# exit N` removed)
    expected_exit: int


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md, then every Markdown page under docs/ (name order), without the figure scripts."""
    pages = sorted(
        p for p in (root / "docs").rglob("*.md") if "notebooks" not in p.relative_to(root).parts
    )
    return [root / "README.md", *pages]


def console_commands(path: Path) -> list[Command]:
    """The commands of the page's console blocks, in order."""
    lines = path.read_text().splitlines()
    cmds: list[Command] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```console":
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not FENCE.match(lines[end]):
            end += 1
        starts = [j for j in range(i + 1, end) if lines[j].startswith("$ ")]
        for k, j in enumerate(starts):
            cmd = lines[j][2:].strip()
            last = j
            while cmd.endswith("\\") and last + 1 < end:
                last += 1
                cmd = cmd[:-1].rstrip() + " " + lines[last].strip()
            expected = 0
            m = EXIT_NOTE.search(cmd)
            if m:
                expected = int(m.group(1))
                cmd = cmd[: m.start()].rstrip()
            stop = starts[k + 1] if k + 1 < len(starts) else end
            cmds.append(Command(path, j, last, stop, cmd, expected))
        i = end + 1
    return cmds


def all_commands(root: Path = ROOT) -> list[Command]:
    """Every distinct command of every page, first occurrence first."""
    seen: set[str] = set()
    out = []
    for path in doc_files(root):
        for c in console_commands(path):
            if c.command not in seen:
                seen.add(c.command)
                out.append(c)
    return out


def make_workdir(dest: Path, root: Path = ROOT) -> Path:
    """A scratch folder: links to the repository's entries, and a copy of docs/."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in root.iterdir():
        if entry.name.startswith(".") or entry.name in ("out", "site"):
            continue
        if entry.name == "docs":
            # a copy: commands such as `calibrate fit --plot docs/figures/...` rewrite figures
            shutil.copytree(entry, dest / entry.name, symlinks=True)
        else:
            (dest / entry.name).symlink_to(entry)
    return dest


def command_env(columns: int, quick: bool) -> dict[str, str]:
    """The environment a command runs in: this interpreter's bin folder first on PATH."""
    bindir = str(Path(sys.executable).parent)
    env = dict(
        os.environ,
        MPLBACKEND="Agg",
        COLUMNS=str(columns),
        PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
    )
    if quick:
        env["AISIM_QUICK"] = "1"
    return env


def run(cmd: str, cwd: Path, env: dict[str, str], timeout_s: float = 900):
    """Runs one command as a user would, in bash."""
    return subprocess.run(
        ["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s
    )


def _trimmed(new: list[str], old: list[str]) -> list[str]:
    if "..." not in [o.strip() for o in old]:
        return new
    k = [o.strip() for o in old].index("...")
    head, tail = k, len(old) - k - 1
    if len(new) <= head + tail + 1:
        return new
    return [*new[:head], "...", *(new[len(new) - tail :] if tail else [])]


def refresh(paths: list[Path], match: str | None, columns: int, quick: bool) -> int:
    """Pastes each command's fresh output under it; returns the number of failed commands."""
    failed = 0
    with tempfile.TemporaryDirectory(prefix="aisim-docs-") as tmp:
        work = make_workdir(Path(tmp) / "work")
        env = command_env(columns, quick)
        for path in paths:
            cmds = console_commands(path)
            lines = path.read_text().splitlines()
            # edit from the bottom so that earlier indices stay valid; run from the top
            results = []
            for c in cmds:
                if match and match not in c.command:
                    results.append(None)
                    continue
                print(f"{path.relative_to(ROOT)}: $ {c.command}", file=sys.stderr)
                r = run(c.command, work, env)
                if r.returncode != c.expected_exit:
                    print(f"  exit {r.returncode}, expected {c.expected_exit}:\n{r.stderr}")
                    failed += 1
                    results.append(None)
                    continue
                text = (r.stdout + r.stderr).rstrip("\n")
                results.append([ln.rstrip() for ln in text.splitlines()] if text else [])
            for c, new in reversed(list(zip(cmds, results, strict=True))):
                if new is None:
                    continue
                old = lines[c.last_line + 1 : c.output_end]
                lines[c.last_line + 1 : c.output_end] = _trimmed(new, old)
            path.write_text("\n".join(lines) + "\n")
    return failed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pages", nargs="*", type=Path, help="pages to refresh (default: all)")
    ap.add_argument("--match", help="only the commands that contain this text")
    ap.add_argument("--columns", type=int, default=100)
    ap.add_argument("--quick", action="store_true", help="set AISIM_QUICK=1 (smoke sizes)")
    args = ap.parse_args()
    paths = [p.resolve() for p in args.pages] or doc_files()
    sys.exit(1 if refresh(paths, args.match, args.columns, args.quick) else 0)


if __name__ == "__main__":
    main()
