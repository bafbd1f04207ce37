"""The package's shape: modules import only from their own or earlier stages of the data flow
(common -> io -> layers -> capturing -> model -> solver -> plan -> exporters -> reporting -> api
-> cli), there are no import circles (deferred and type-checking imports count: they hide a
circle, they do not remove it), and every public module says what it exports (``__all__``).
The graph is read from the source with ``ast``; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "stagesplit"

#: stage of each top-level part of the package, in the order data flows through them
STAGES = {"errors": 0, "common": 0, "io": 1, "layers": 2, "capturing": 3, "model": 4, "solver": 5, "plan": 6,
          "exporters": 7, "reporting": 8, "api": 9, "cli": 10}
FRONT_DOOR = {"stagesplit", "stagesplit.__main__"}          # may import anything


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports, at any depth of its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        for target in targets:
            while target and target not in modules:          # a name imported from a module: that module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
                break
    return found


def _stage(module: str) -> int | None:
    parts = module.split(".")
    return STAGES.get(parts[1]) if len(parts) > 1 else None


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_every_module_has_a_stage(graph):
    assert sorted(m for m in graph if m not in FRONT_DOOR and _stage(m) is None) == []


def test_no_module_imports_a_later_stage(graph):
    backwards = []
    for module, imported in graph.items():
        if module in FRONT_DOOR:
            continue
        for other in imported:
            if other in FRONT_DOOR or _stage(other) > _stage(module):
                backwards.append(f"{module} -> {other}")
    assert sorted(backwards) == []


def test_no_import_circles(graph):
    # Tarjan's strongly connected components: any component of two or more modules is a circle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == []


def test_the_checker_sees_deferred_and_type_checking_imports(tmp_path):
    """The check itself: an import inside a function or under TYPE_CHECKING is an edge."""
    a = tmp_path / "a.py"
    a.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import x\n"
                 "def f():\n    from .c import y\n")
    modules = {"p.a": a, "p.b": a, "p.c": a}
    assert _imports("p.a", a, modules) == {"p.b", "p.c"}


def test_every_public_module_declares_all():
    missing = []
    for name, path in _modules().items():
        if any(part.startswith("_") for part in name.split(".")[1:]) or name in FRONT_DOOR:
            continue
        tree = ast.parse(path.read_text())
        if path.name == "__init__.py" and all(isinstance(node, ast.Expr) for node in tree.body):
            continue                                          # a package that only describes itself
        if not any(isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
                   for node in tree.body):
            missing.append(name)
    assert sorted(missing) == []
