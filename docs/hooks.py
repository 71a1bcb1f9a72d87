"""mkdocs hook: expands ``<!-- public-api PACKAGE -->`` into the package's API reference.

The reference follows the package's ``__all__``, in its order: first the package docstring, then
one ``::: path`` block (mkdocstrings) per exported name; a name re-exported from another package
is a link to that package's page. mkdocstrings reads the source statically, so a name it cannot
see as ``package.name`` points at the module that defines the object: a name that is also a
submodule (``perfmodel.step_time`` is both a module and the function it re-exports), and a name
that the package loads lazily (a module ``__getattr__``).
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
            return f"{home}.{name}"
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


def on_page_markdown(markdown: str, **kwargs) -> str:
    return MARKER.sub(lambda m: api_markdown(m.group(1)), markdown)
