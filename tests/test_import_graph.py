"""app/llm and app/tools are leaves: neither imports the rest of the service (app.settings aside, and for
app/llm the observability hooks), neither has an import cycle, and app/llm alone imports litellm.

Read from the source (ast), not from `sys.modules`: every import counts, the ones deferred into a function
or kept under TYPE_CHECKING included, since a cycle dodged by deferring an import is still a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]  # holds the `app` package
# Each leaf package, and what it may import from the rest of `app`.
# app.llm also reports its model calls through the observability hooks (app/llm/observed.py), themselves
# a leaf that imports no layer.
LEAVES = {"app.llm": {"app.settings", "app.observability.hooks"}, "app.tools": {"app.settings"}}


def modules(package: str) -> dict[str, Path]:
    """Every module of `package` (its subpackages included), by dotted name; a package by its own name."""
    found = {}
    for path in sorted(ROOT.joinpath(*package.split(".")).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(source: str, package: str, known: Collection[str]) -> set[str]:
    """The modules that `source`, a module of `package`, imports anywhere in its text. `from p import n`
    counts the module `p.n` when `known` has it, and `p` itself when some name is not a module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0]
                base = f"{anchor}.{base}" if base else anchor
            names = [f"{base}.{alias.name}" for alias in node.names]
            found.update(name for name in names if name in known)
            if any(name not in known for name in names):
                found.add(base)
    return found


def imports(package: str) -> dict[str, set[str]]:
    """Each module of `package` and every module it imports, from anywhere."""
    known = modules("app")
    graph = {}
    for name, path in modules(package).items():
        own_package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = imported(path.read_text(encoding="utf-8"), own_package, known) - {name}
    return graph


def cycles(edges: Mapping[str, Collection[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = stack[stack.index(node) :]
            del stack[stack.index(node) :]
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_every_import_counts_deferred_and_type_checking_ones_too() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from p import q\n"
        "if TYPE_CHECKING:\n"
        "    import p.r\n"
        "def f() -> None:\n"
        "    from . import s, value\n"
    )
    assert imported(source, "p", {"p.q", "p.s"}) == {"typing", "p.q", "p.r", "p.s", "p"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("package", sorted(LEAVES))
def test_the_package_has_no_import_cycle(package: str) -> None:
    graph = imports(package)
    inside = {name: {m for m in targets if m in graph} for name, targets in graph.items()}
    assert any(inside.values()), "no import between the package's modules was read"
    assert cycles(inside) == []


@pytest.mark.parametrize("package", sorted(LEAVES))
def test_the_package_imports_nothing_else_of_the_app(package: str) -> None:
    outside = {
        (name, target)
        for name, targets in imports(package).items()
        for target in targets
        if (target == "app" or target.startswith("app."))
        and target != package
        and not target.startswith(f"{package}.")
        and target not in LEAVES[package]
    }
    assert outside == set()


def test_only_the_llm_package_imports_litellm() -> None:
    importers = {
        name
        for name, targets in imports("app").items()
        if name != "app.llm" and not name.startswith("app.llm.")
        for target in targets
        if target.split(".")[0] == "litellm"
    }
    assert importers == set()
