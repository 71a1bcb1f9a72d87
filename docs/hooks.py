"""mkdocs hook: expands ``<!-- public-api PACKAGE -->`` into the package's API reference, and
``<!-- knobs -->`` into the table of every strategy knob of the registry
(:data:`perfmodel.specs.knobs.KNOBS`), which is what the commands' options are made from.

The reference follows the package's ``__all__``, in its order: first the package docstring, then
one ``::: path`` block (mkdocstrings) per exported name; a name re-exported from another package
is a link to that package's page. mkdocstrings reads the source statically, so a name it cannot
see as ``package.name`` points at the module that defines the object: a name that is also a
submodule (``perfmodel.step.step_time`` is both a module and the function it re-exports), and a name
that the package loads lazily (a module ``__getattr__``), under the defining module's own name for
it (``calibration.import_training_logs`` is ``calibration.logs.import_logs``).
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- public-api (\w+) -->$", flags=re.M)
KNOBS_MARKER = re.compile(r"^<!-- knobs -->$", flags=re.M)


def _defining_module(package: str, name: str, obj: object) -> str | None:
    home = getattr(obj, "__module__", None)
    if home and home.startswith(package + ".") and not inspect.ismodule(obj):
        return home
    for mod_name, mod in sorted(sys.modules.items()):
        if mod_name.startswith(package + ".") and getattr(mod, name, None) is obj:
            return mod_name
    return None


def _target(package: str, name: str, obj: object, static: griffe.Module) -> str:
    member = static.members.get(name)
    visible = member is not None and (inspect.ismodule(obj) or not member.is_module)
    if not visible:
        home = _defining_module(package, name, obj)
        if home:
            # the defining module's own name for it (a lazy export may rename it)
            own = name if getattr(sys.modules.get(home), name, None) is obj else obj.__name__
            return f"{home}.{own}"
    return f"{package}.{name}"


def api_markdown(package: str) -> str:
    """The mkdocstrings blocks for ``package``'s docstring and every name in its ``__all__``."""
    mod = importlib.import_module(package)
    static = griffe.load(package, search_paths=[str(ROOT)])
    blocks = [
        f"::: {package}\n    options:\n      members: false\n      show_root_heading: false\n"
    ]
    for name in mod.__all__:
        obj = getattr(mod, name)
        home = getattr(obj, "__module__", None) or package
        if not inspect.ismodule(obj) and home.split(".")[0] not in (package, "builtins"):
            # a re-export of another package's object: documented there, linked here
            base = home.split(".")[0]
            blocks.append(f"`{name}`: re-exported from [`{base}`][{base}.{name}].\n")
            continue
        blocks.append(f"::: {_target(package, name, obj, static)}\n")
    return "\n".join(blocks)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def knobs_markdown() -> str:
    """One row per knob of the registry, grouped as ``--help`` groups them: the option, the
    name ``--json``, CSV columns and ``--set`` use (with the other spellings a CSV may use), the
    values it takes, its default and what it means."""
    from perfmodel.specs.knobs import KNOBS

    groups = {"layout": "layout", "batching": "batching", "memory": "memory plan"}
    rows = [
        "| option | name (`--set`, CSV, JSON) | values | library default | meaning |",
        "|---|---|---|---|---|",
    ]
    for k in sorted(KNOBS, key=lambda k: list(groups).index(k.home) if k.home in groups else 3):
        name = f"`{k.name}`" + "".join(f", `{a}`" for a in k.aliases)
        default = "derived" if k.default is None else (k.label(k.default) or "none")
        if isinstance(default, bool):
            default = "on" if default else "off"
        where = groups.get(k.home, "software stack" if k.home == "stack" else "job")
        rows.append(
            f"| `{k.option}` | {name} | {_cell(k.expected())} | {_cell(default)} | "
            f"{_cell(k.help)} ({where}) |"
        )
    return "\n".join(rows) + "\n"


def on_page_markdown(markdown: str, **kwargs) -> str:
    markdown = KNOBS_MARKER.sub(lambda m: knobs_markdown(), markdown)
    return MARKER.sub(lambda m: api_markdown(m.group(1)), markdown)
