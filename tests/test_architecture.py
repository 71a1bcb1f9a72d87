"""The design card's structure, read from the source: imports point one way (the CLI, then the
libraries, then the shared base), no two modules import each other (not even inside functions,
where a circle would hide), and each framework knob of the registry is named in the code of at
most three source files (the registry, its physics and one more).

Only code counts: docstrings and comments may name a knob to explain it.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

from perfmodel.specs.knobs import STACK_KNOBS

ROOT = Path(__file__).resolve().parents[1]
# each package and the packages it may import (the CLI any library; simbase none of them)
ALLOWED = {
    "simbase": set(),
    "perfmodel": {"simbase"},
    "fl": {"perfmodel", "simbase"},
    "calibration": {"perfmodel", "simbase"},
    "collab": {"calibration", "perfmodel", "simbase"},
    "aisim": {"calibration", "collab", "fl", "perfmodel", "simbase"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in ALLOWED:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imported(node: ast.AST) -> set[str]:
    """The project modules an import statement loads: ``from fl import round`` is the module
    ``fl.round``, not the package ``fl`` (whose ``__init__`` only gathers its modules)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in MODULES}
    if not isinstance(node, ast.ImportFrom) or not node.module or node.level:
        return set()
    subs = {f"{node.module}.{a.name}" for a in node.names} & MODULES.keys()
    names_objects = len(subs) < len(node.names)
    return subs | ({node.module} if names_objects and node.module in MODULES else set())


def _graph() -> dict[str, set[str]]:
    return {
        name: set().union(*(_imported(n) for n in ast.walk(ast.parse(path.read_text()))))
        for name, path in MODULES.items()
    }


def test_imports_point_one_way():
    wrong = sorted(
        f"{name} imports {target}"
        for name, targets in _graph().items()
        for target in targets
        if (a := name.split(".")[0]) != (b := target.split(".")[0]) and b not in ALLOWED[a]
    )
    assert not wrong, wrong


def test_no_two_modules_import_each_other():
    graph = _graph()
    for name in graph:  # a module's package __init__ gathers it: that edge is not a circle
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    circles = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                circles.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, circles


def _code_names(path: Path) -> set[str]:
    """The names and string literals in a file's code (docstrings and comments left out)."""
    source = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    out = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.start[0] in docstrings:
            continue
        if tok.type == tokenize.NAME:
            out.add(tok.string)
        elif tok.type == tokenize.STRING:
            try:
                value = ast.literal_eval(tok.string)
            except (ValueError, SyntaxError):  # an f-string
                continue
            if isinstance(value, str):
                out.add(value)
    return out


def test_a_framework_knob_lives_in_at_most_three_source_files():
    names = {path: _code_names(path) for path in MODULES.values()}
    homes = {
        k.name: sorted(str(p.relative_to(ROOT)) for p, n in names.items() if k.name in n)
        for k in STACK_KNOBS
    }
    assert all(homes.values()), homes  # the scan finds every knob at least in the registry
    too_many = {k: files for k, files in homes.items() if len(files) > 3}
    assert not too_many, too_many
