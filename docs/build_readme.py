"""Joins ``docs/readme/*.md`` (in name order) into ``README.md``.

Code fences that contain ``$ `` command lines become ``console`` blocks (which
``tests/test_readme.py`` executes); a ``(exit N)`` line after a command moves onto the command as
``# exit N``. Sections named in ``SKIP`` are working notes, not README text.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORDER = [
    "00_intro",
    "grid",
    "distir",
    "measure",
    "calibration",
    "fl",
    "collab",
    "accuracy",
    "notebooks",
    "99_footer",
]
SKIP = {"BRIEF_COMMON"}


def convert(text: str) -> str:
    """Marks fences holding commands as console blocks and moves exit-code notes onto commands."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            body = lines[i + 1 : j]
            plain = line.strip() in ("```", "```console", "```bash", "```shell", "```text")
            if plain and any(b.startswith("$ ") for b in body):
                fixed: list[str] = []
                for b in body:
                    m = re.fullmatch(r"\(exit (\d+)\)", b.strip())
                    if m and fixed:
                        k = max(n for n, x in enumerate(fixed) if x.startswith("$ "))
                        while fixed[k].rstrip().endswith("\\") and k + 1 < len(fixed):
                            k += 1  # the note goes on the command's last continuation line
                        if "# exit" not in fixed[k]:
                            fixed[k] = fixed[k] + f"  # exit {m.group(1)}"
                        continue
                    fixed.append(b)
                out += ["```console", *fixed, "```"]
            else:
                out += lines[i : j + 1]
            i = j + 1
            continue
        out.append(line)
        i += 1
    # sections link figures relative to docs/readme/; README.md sits at the root
    return "\n".join(out).replace("](../figures/", "](docs/figures/") + "\n"


def build_text() -> tuple[str, list[str]]:
    """The README's text and the names of the sections it was joined from."""
    parts = {p.stem: p for p in (ROOT / "docs" / "readme").glob("*.md") if p.stem not in SKIP}
    names = [n for n in ORDER if n in parts] + sorted(n for n in parts if n not in ORDER)
    return "\n".join(convert(parts[n].read_text()) for n in names), names


def main() -> None:
    text, names = build_text()
    (ROOT / "README.md").write_text(text)
    print(f"README.md from {', '.join(names)}")


if __name__ == "__main__":
    main()
