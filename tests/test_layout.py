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
    "app.api.waiting": _OVER_HTTP,
    "app.llm.litellm_zygote": "a process of its own (python -m): tests/llm/test_litellm_process.py starts it",
    "app.turns.lease": _REPLICAS,
    "app.turns.leased_runner": _REPLICAS,
    "app.turns.replica_mode": _REPLICAS,
    "app.turns.sweeper": _REPLICAS,
    "app.llm.lazy_encoding": "it acts before litellm's import: tests/llm/test_gateway.py runs it in a fresh "
    "interpreter",
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
