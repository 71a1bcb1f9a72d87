"""README.md and the documentation pages: short, free of history, and showing every figure.

These checks are fast; the commands the pages show run in ``tests/test_doc_commands.py``
(marked slow), and ``mkdocs build --strict`` in CI checks links, anchors and the API reference.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
import doc_commands  # noqa: E402

README = ROOT / "README.md"
PAGES = doc_commands.doc_files(ROOT)
README_MAX_LINES = 250
# development history and per-machine timings do not belong in user documentation
FORBIDDEN = [
    r"this 2-core machine",
    r"this VM\b",
    r"\bissue \d+",
    r"the targets are met",
    r"earlier note",
]
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; the details belong on the site"


def test_no_history_in_user_docs():
    hits = []
    for page in PAGES:
        for i, line in enumerate(page.read_text().splitlines(), 1):
            for pat in FORBIDDEN:
                if re.search(pat, line, flags=re.IGNORECASE):
                    hits.append(f"{page.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_every_figure_is_shown_and_every_image_exists():
    shown = set()
    for page in PAGES:
        for target in IMAGE.findall(page.read_text()):
            path = (page.parent / target).resolve()
            assert path.is_file(), f"{page.relative_to(ROOT)}: no such image {target}"
            shown.add(path)
    shipped = {p.resolve() for p in (ROOT / "docs" / "figures").glob("*.png")}
    assert shipped, "docs/figures holds no figure"
    missing = sorted(p.name for p in shipped - shown)
    assert not missing, f"figures shown on no page: {missing}"


def test_pages_show_commands():
    cmds = [c.command for c in doc_commands.all_commands(ROOT)]
    assert len(cmds) >= 30
    readme = [c.command for c in doc_commands.console_commands(README)]
    for example in (
        "aisim perf estimate",
        "aisim perf grid",
        "aisim calibrate fit",
        "aisim fl run",
    ):
        assert any(c.startswith(example) for c in readme), f"README shows no `{example}` example"


def test_ci_runs_the_readme_test_command():
    """`.ci/run` calls exactly the test command that the README's quick start shows."""
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ".venv/bin/python -m pytest" in ci
    assert ".venv/bin/python -m pytest" in README.read_text()
    assert any(line.endswith("mkdocs build --strict --site-dir site") for line in ci)


def test_command_parser_reads_continuations_and_exit_codes(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "```console\n$ aisim perf grid \\\n    --top 3\nout\n$ aisim x  # exit 2\nerror: x\n```\n"
        "```bash\n$ not run\n```\n"
    )
    cmds = doc_commands.console_commands(page)
    assert [(c.command, c.expected_exit) for c in cmds] == [
        ("aisim perf grid --top 3", 0),
        ("aisim x", 2),
    ]
    assert (cmds[0].first_line, cmds[0].last_line, cmds[0].output_end) == (1, 2, 4)


@pytest.mark.slow
def test_the_readmes_python_quick_start_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], "README.md", "exec"), {})  # noqa: S102 - the README's own code


def test_no_table_on_the_pages_cuts_a_header():
    """Every table a documented command prints (as pasted, at 100 columns) shows its headers
    whole: a header cut to '…' is a column whose short name should have been shown."""
    cut = [
        f"{page.relative_to(ROOT)}: {line.strip()}"
        for page in PAGES
        for line in page.read_text().splitlines()
        if "┃" in line and any(c.strip().endswith("…") for c in line.split("┃"))
    ]
    assert not cut, "\n".join(cut)
