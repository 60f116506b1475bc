"""The code's shape, held by a machine: every module of app/ has a test module that imports it (tests
mirror app/: a module reached only through others is tested only as far as they happen to use it).

Size is a signal, not a wall (STYLE.md): `make sizes` lists the modules past ~400 lines and the functions
past ~60, to look at; a split made to pass a count is worse than the long file, so no test fails on it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app"
TESTS = APP.parent / "tests"

_OVER_HTTP = "exercised over HTTP by tests/api"
_REPLICAS = "runs inside real replica processes: tests/replicas drives them over HTTP and reads the database"
# The modules no test module imports, each for its reason.
NOT_IMPORTED = {
    "app.__main__": "the launcher: tests/test_launcher*.py run it as a process",
    "app.chat.errors": "only declares error classes",
    "app.api.debug": _OVER_HTTP,
    "app.api.health": _OVER_HTTP,
    "app.api.messages": _OVER_HTTP,
    "app.api.responses": _OVER_HTTP,
    "app.api.sessions": _OVER_HTTP,
    "app.api.turns": _OVER_HTTP,
    "app.api.turn_wait": _OVER_HTTP,
    "app.llm.litellm_child": "a process of its own (python -m): tests/llm/test_litellm_process.py starts it",
    "app.turns.replicas.lease": _REPLICAS,
    "app.turns.replicas.sweeper": _REPLICAS,
}


def _modules() -> list[Path]:
    return sorted(APP.rglob("*.py"))


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(APP.parent).with_suffix("").parts)


def _imported_by_tests() -> set[str]:
    """Every module a test module names in an import: `import X`, `from X import y` (X, and X.y in case y
    is a module)."""
    names: set[str] = set()
    for path in TESTS.rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_every_app_module_is_imported_by_a_test() -> None:
    modules = {_module_name(path) for path in _modules() if path.name != "__init__.py"}
    assert set(NOT_IMPORTED) - modules == set()  # no reason outlives its module
    assert sorted(modules - set(NOT_IMPORTED) - _imported_by_tests()) == []


CITES_OUTSIDE = re.compile(r"\bseed \d+|\bseeds?/|shared/notes|\.\./shared", re.IGNORECASE)


def test_code_cites_docs_not_documents_outside_the_repository() -> None:
    """A reader who clones the project can open what the code cites: docs/, never the design notes or
    notes beside the repository (STYLE.md, Docs)."""
    roots = (APP, APP.parent / "clients" / "typescript" / "src")
    found = [
        f"{path.relative_to(APP.parent)}:{number}"
        for root in roots
        for path in sorted(root.rglob("*"))
        if path.suffix in {".py", ".ts"}
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if CITES_OUTSIDE.search(line)
    ]
    assert found == []


# Underscore names that their libraries document as public: namedtuple's methods, SQLAlchemy's Row._mapping,
# os._exit, sys._current_frames.
DOCUMENTED_PUBLIC = {"_replace", "_asdict", "_fields", "_make", "_mapping", "_exit", "_current_frames"}
# Attributes that hand out a library's own objects (the driver's connection, the pool): whatever private
# name follows them is the library's.
LIBRARY_HANDLES = {"driver_connection", "dbapi_connection", "pool", "sync_engine"}
_FIRST_PARTY = {"app", "tests", "bench"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_names(trees: list[ast.Module]) -> set[str]:
    """The underscore names this repository defines (functions, classes, attributes it assigns)."""
    own: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                own.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                own.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
    return {name for name in own if _private(name)}


def _library_names(tree: ast.Module) -> set[str]:
    """The names a module binds to what it imports from other packages than this repository's."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {
                (alias.asname or alias.name).split(".")[0]
                for alias in node.names
                if alias.name.split(".")[0] not in _FIRST_PARTY
            }
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.split(".")[0] not in _FIRST_PARTY
        ):
            names |= {alias.asname or alias.name for alias in node.names}
    return names


def _chain(node: ast.expr) -> tuple[str | None, set[str]]:
    """The root name of `a.b.c` (None for a call or anything else) and the attributes on the way."""
    attributes: set[str] = set()
    while isinstance(node, ast.Attribute):
        attributes.add(node.attr)
        node = node.value
    return (node.id if isinstance(node, ast.Name) else None), attributes


def test_no_code_touches_a_librarys_private_names() -> None:
    """Only a library's public API (STYLE.md): an underscore attribute of aiosqlite, SQLAlchemy,
    prometheus_client or any other package is never read, called or patched, in app/ or in tests/, since
    its next release may change it silently. A private name of this repository's own is another matter."""
    paths = sorted([*APP.rglob("*.py"), *TESTS.rglob("*.py")])
    trees = {path: ast.parse(path.read_text()) for path in paths}
    own = _own_names(list(trees.values()))
    found: list[str] = []
    for path, tree in trees.items():
        libraries = _library_names(tree)
        for node in ast.walk(tree):
            target: ast.expr | None = None
            name = ""
            if isinstance(node, ast.Attribute) and _private(node.attr):
                target, name = node.value, node.attr
            elif (
                isinstance(node, ast.Call)
                and len(node.args) >= 2
                and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) == "setattr"
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and _private(node.args[1].value)
            ):
                target, name = node.args[0], node.args[1].value
            if target is None or name in DOCUMENTED_PUBLIC:
                continue
            root, attributes = _chain(target)
            if root in ("self", "cls") and not attributes & LIBRARY_HANDLES:
                continue
            if root in libraries or attributes & LIBRARY_HANDLES or name not in own:
                line = getattr(node, "lineno", 0)
                found.append(f"{path.relative_to(APP.parent)}:{line}: {ast.unparse(target)}.{name}")
    assert found == []
