"""One error model: domain errors carry a code; app.api.errors alone maps it to an HTTP status and headers.

See docs/api.md, "Errors".
"""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
from pathlib import Path
from typing import Any

import pytest

import app
from app.api import errors as edge
from app.errors import (
    DomainError,
    InvalidRequest,
    StorageFull,
    TooManyStreams,
    Unauthorized,
    error_kinds,
)
from app.turns.pending_calls import AnswerExpired
from app.turns.replicas.turns import OwnerUnreachable

APP = Path(app.__file__).parent


def _all_kinds() -> dict[str, type[DomainError]]:
    """Every domain error of the app: each module imported first, since a kind registers when defined."""
    for module in pkgutil.walk_packages(app.__path__, "app."):
        if module.name not in ("app.__main__",):
            importlib.import_module(module.name)
    return error_kinds()


def test_every_code_has_a_status_and_the_table_names_no_other() -> None:
    codes = set(_all_kinds())
    assert codes - set(edge.STATUS) == set(), "a domain error code without an HTTP status"
    assert set(edge.STATUS) - codes == set(), "a status for a code no domain error carries"


def test_server_side_errors_are_the_5xx() -> None:
    """The idempotency store keeps a key reserved after a server-side failure and releases it after a
    refusal: `server_side` must say what the status says."""
    for code, kind in _all_kinds().items():
        assert kind.server_side == (edge.STATUS[code] >= 500), code


def test_a_family_without_a_code_cannot_be_raised() -> None:
    with pytest.raises(TypeError, match="no code"):
        DomainError("no kind")


def test_a_code_names_one_class() -> None:
    with pytest.raises(TypeError, match="storage_full"):

        class Another(DomainError):
            code = "storage_full"


@pytest.mark.parametrize(
    "error",
    [
        StorageFull("The server's storage is full; retry later.", retry_after=30),
        OwnerUnreachable("send it again", details={"session_id": "s_1"}, retry_after=1),
        AnswerExpired("expired", details={"tool_call_id": "c_1", "expired_at": 1.5}),
        TooManyStreams("2 event streams are open", retry_after=5),
        InvalidRequest("body.model", "model cannot be null", "not_null"),
        Unauthorized("no key"),
    ],
    ids=lambda e: e.code,
)
def test_an_error_crosses_replicas_as_its_code_and_comes_back_the_same(error: DomainError) -> None:
    rebuilt = DomainError.from_wire(json.loads(json.dumps(error.wire())))
    assert type(rebuilt) is type(error)
    seen = (rebuilt.code, rebuilt.message, rebuilt.details, rebuilt.retry_after, str(rebuilt))
    assert seen == (error.code, error.message, error.details, error.retry_after, str(error))
    assert (edge.http_status(rebuilt), edge.http_headers(rebuilt)) == (
        edge.http_status(error),
        edge.http_headers(error),
    )


def test_an_unknown_code_from_another_replica_is_not_mistaken_for_a_known_one() -> None:
    with pytest.raises(RuntimeError, match="unknown code"):
        DomainError.from_wire({"code": "from_a_newer_build", "message": "?"})


def test_the_headers_come_from_the_error() -> None:
    assert edge.http_headers(StorageFull("full", retry_after=30)) == {"Retry-After": "30"}
    assert edge.http_headers(Unauthorized("no key")) == {"WWW-Authenticate": "Bearer"}
    assert edge.http_headers(AnswerExpired("expired")) is None
    assert StorageFull("full", retry_after=30).details == {"retry_after": 30}


# --- nothing outside the API edge sets an HTTP status ------------------------------------------------------

# app.llm reads the model provider's HTTP statuses (upstream's, never this server's answer).
_EDGE = ("api", "main.py", "llm")
_STATUS_NAMES = {"status", "status_code", "http_status"}
_HEADERS = {"retry-after", "www-authenticate", "allow"}
# The HTTP stack's answers and statuses (FastAPI itself may be imported: the spec, the tracing).
_HTTP_MODULES = ("fastapi", "starlette")
_HTTP_ANSWERS = {"HTTPException", "Response", "JSONResponse", "status"}


def _outside_the_edge() -> list[Path]:
    return [p for p in sorted(APP.rglob("*.py")) if p.relative_to(APP).parts[0] not in _EDGE]


def _docstrings(tree: ast.AST) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _error_status(value: Any) -> bool:
    return isinstance(value, ast.Constant) and isinstance(value.value, int) and 400 <= value.value <= 599


def _http_settings(path: Path, root: Path = APP.parent) -> list[str]:
    """Where the module sets an HTTP error status or header, or reaches for the HTTP stack."""
    tree = ast.parse(path.read_text(), str(path))
    # Pydantic's extra="allow" is no Allow header.
    docstrings = _docstrings(tree) | {
        id(node.value) for node in ast.walk(tree) if isinstance(node, ast.keyword) and node.arg == "extra"
    }
    found: list[str] = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(root)}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Assign | ast.AnnAssign) and _error_status(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", None)
                if name in _STATUS_NAMES:
                    found.append(f"{where}: {name} = {getattr(node.value, 'value', None)}")
        elif isinstance(node, ast.keyword) and node.arg in _STATUS_NAMES and _error_status(node.value):
            found.append(f"{where}: {node.arg}={ast.unparse(node.value)}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if node.value.lower() in _HEADERS:
                found.append(f"{where}: header {node.value!r}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _HTTP_MODULES:
            names = {a.name for a in node.names}
            module = node.module or ""
            if names & _HTTP_ANSWERS or module.endswith((".responses", ".exceptions", ".status")):
                found.append(f"{where}: from {node.module} import {', '.join(sorted(names))}")
    return found


def test_no_module_outside_the_api_edge_sets_an_http_status() -> None:
    paths = _outside_the_edge()
    assert APP / "errors" / "__init__.py" in paths and APP / "chat" / "limits.py" in paths
    found = [line for path in paths for line in _http_settings(path)]
    assert found == []


def test_the_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    """The check above would see the error model of before: statuses and headers on the error classes."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from starlette.responses import JSONResponse\n"
        "class Gone(Exception):\n    status = 410\n"
        "def refuse(wait):\n    return Gone('x', {'Retry-After': str(wait)}, status_code=410)\n"
        "def answer(response):\n    response.status_code = 503\n"
    )
    found = _http_settings(sample, root=tmp_path)
    assert len(found) == 5, found


def test_storage_refusals_are_read_through_the_wrapping_to_the_drivers_error() -> None:
    """SQLAlchemy wraps the driver's error and a task group wraps that: the refusal is still found, with
    its code and wait; a constraint error or any other exception is no refusal."""
    import sqlite3

    from sqlalchemy.exc import OperationalError

    from app.errors.storage import storage_refusal

    def wrapped(driver: sqlite3.Error) -> BaseException:
        try:
            raise OperationalError("INSERT ...", {}, driver) from driver
        except OperationalError as exc:
            return ExceptionGroup("turn", [exc])

    busy = storage_refusal(wrapped(sqlite3.OperationalError("database is locked")))
    full = storage_refusal(wrapped(sqlite3.OperationalError("database or disk is full")))
    assert busy is not None and busy.code == "storage_busy" and busy.retry_after
    assert full is not None and full.code == "storage_full" and full.retry_after
    assert storage_refusal(wrapped(sqlite3.IntegrityError("UNIQUE constraint failed"))) is None
    assert storage_refusal(ValueError("not storage")) is None
