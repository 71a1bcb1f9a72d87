"""Preset names as people write them: ``Llama-3.1-70B``, ``meta-llama/Llama-3.1-70B-Instruct``
and ``llama3.1-70b`` all name the ``llama3-70b`` preset.

Contract: :func:`preset_name` maps a name to the file stem of a shipped preset in a folder of
JSON presets, or None. A name matches a preset's file stem or one of the names in its
``"aliases"`` list after :func:`normalise`: lower case, without a ``owner/`` prefix (Hugging Face
repository ids), without a trailing variant word that does not change the architecture
(``-hf``, ``-instruct``, ``-chat``, ``-base``) or a leading brand word (``NVIDIA``, ``Tesla``:
the device names nvidia-smi prints), and without spaces, hyphens, underscores and
plus signs. Dots stay, so ``qwen2.5-7b`` and ``qwen2-57b`` remain different models.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

# trailing words of released checkpoint names that fine-tuning or packaging adds to an
# architecture it does not change
VARIANT_WORDS = frozenset({"hf", "instruct", "chat", "base"})
# leading brand words of the device names nvidia-smi prints ("NVIDIA A100-SXM4-80GB",
# "Tesla V100-SXM2-32GB")
VENDOR_WORDS = frozenset({"nvidia", "tesla"})


def normalise(name: str) -> str:
    """The form names are compared in (module docstring)."""
    base = name.strip().lower().rsplit("/", 1)[-1]
    words = [w for w in re.split(r"[\s_+-]+", base) if w]
    while len(words) > 1 and words[-1] in VARIANT_WORDS:
        words.pop()
    while len(words) > 1 and words[0] in VENDOR_WORDS:
        words.pop(0)
    return "".join(words)


@functools.cache
def _index(folder: str) -> dict[str, str]:
    """Normalised stem and alias -> stem, for every ``*.json`` preset in ``folder``."""
    out: dict[str, str] = {}
    for path in sorted(Path(folder).glob("*.json")):
        out.setdefault(normalise(path.stem), path.stem)
    for path in sorted(Path(folder).glob("*.json")):
        for alias in json.loads(path.read_text()).get("aliases", []):
            out.setdefault(normalise(alias), path.stem)
    return out


def preset_name(name: str, folder: Path) -> str | None:
    """The stem of the preset in ``folder`` that ``name`` names (module docstring), or None."""
    key = name.strip().lower()
    if (folder / f"{key}.json").is_file():
        return key
    return _index(str(folder)).get(normalise(name))


def aliases(folder: Path) -> dict[str, list[str]]:
    """Stem -> the aliases its file lists, for every preset in ``folder`` (in name order)."""
    return {
        p.stem: list(json.loads(p.read_text()).get("aliases", []))
        for p in sorted(folder.glob("*.json"))
    }
