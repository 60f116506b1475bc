"""Every 5xx carries its request id, in the body, the X-Request-ID header and the log line: a write that
waited out SQLite's busy timeout (503 storage_busy), a full disk (503 storage_full), and any other
exception a route lets escape (500 internal_error). Storage that refused a write stored nothing."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import event
from sqlalchemy.pool import Pool

from app.chat.sessions import Sessions
from app.settings import Settings
from tests.support.server import LiveServer, live_server

pytestmark = pytest.mark.anyio

BUSY_TIMEOUT_MS = 200


@pytest.fixture
def storage(settings: Settings) -> Iterator[LiveServer]:
    """A server whose writes give up on SQLite's write lock after 200 ms instead of 10 s."""
    with live_server(settings.model_copy(update={"database_busy_timeout_ms": BUSY_TIMEOUT_MS})) as running:
        yield running


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Warnings and errors of the app and of uvicorn (whose loggers do not propagate to caplog's root)."""
    caplog.set_level(logging.WARNING)
    uvicorn_log = logging.getLogger("uvicorn")
    uvicorn_log.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        uvicorn_log.removeHandler(caplog.handler)


def _database_path(settings: Settings) -> str:
    return settings.database_url.split(":///", 1)[1]


@pytest.fixture
def full_disk() -> Iterator[list[bool]]:
    """While its one item is True, every connection the server checks out may not grow the database file:
    SQLite answers SQLITE_FULL ("database or disk is full"), as it does when the disk is full."""
    full = [False]

    def cap(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        if full[0]:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA max_page_count = 1")  # never below the current size: no page more
            cursor.close()

    event.listen(Pool, "checkout", cap)
    try:
        yield full
    finally:
        event.remove(Pool, "checkout", cap)


def _assert_5xx_with_its_id(
    response: httpx.Response, status: int, code: str, logs: pytest.LogCaptureFixture
) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"code", "message", "details", "request_id"}
    request_id = response.headers["x-request-id"]
    assert error["code"] == code
    assert error["request_id"] == request_id != "-"
    assert "Traceback" not in response.text
    lines = [r.getMessage() for r in logs.records if r.levelno >= logging.WARNING]
    # The id is in the line's text, so any log format shows it; and every line about the failure has it.
    assert any(request_id in line and code in line for line in lines), lines
    assert not [line for line in lines if "Exception in ASGI application" in line], lines
    return request_id


async def _session_ids(client: httpx.AsyncClient) -> list[str]:
    response = await client.get("/v1/sessions")
    assert response.status_code == 200, response.text
    return [s["id"] for s in response.json()["sessions"]]


async def test_a_write_that_waits_out_the_busy_timeout_is_a_503_storage_busy_that_stored_nothing(
    storage: LiveServer, settings: Settings, logs: pytest.LogCaptureFixture
) -> None:
    async with httpx.AsyncClient(base_url=storage.base_url, timeout=30) as client:
        assert await _session_ids(client) == []
        holder = sqlite3.connect(_database_path(settings), isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")  # SQLite's one write lock, held past the busy timeout
            response = await client.post("/v1/sessions", json={"title": "locked out"})
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        _assert_5xx_with_its_id(response, 503, "storage_busy", logs)
        assert int(response.headers["retry-after"]) >= 1
        assert response.json()["error"]["details"] == {"retry_after": int(response.headers["retry-after"])}

        assert await _session_ids(client) == []
        # Busy was not broken: once the lock is free, the same request succeeds.
        assert (await client.post("/v1/sessions", json={"title": "later"})).status_code == 201


async def test_a_full_disk_is_a_503_storage_full_that_stored_nothing(
    server: LiveServer, full_disk: list[bool], logs: pytest.LogCaptureFixture
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        full_disk[0] = True
        # Far larger than a page, so the row cannot fit in the free room of the pages already there.
        response = await client.post("/v1/sessions", json={"system_prompt": "x" * 20_000})
        _assert_5xx_with_its_id(response, 503, "storage_full", logs)
        retry_after = int(response.headers["retry-after"])
        assert retry_after > 1
        assert response.json()["error"]["details"] == {"retry_after": retry_after}
        full_disk[0] = False
        assert await _session_ids(client) == []


async def test_any_other_exception_is_a_500_internal_error_with_its_request_id(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch, logs: pytest.LogCaptureFixture
) -> None:
    async def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("a bug with a secret in it: hunter2")

    monkeypatch.setattr(Sessions, "create", broken)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        response = await client.post("/v1/sessions", json={}, headers={"X-Request-ID": "req-client-7"})
    request_id = _assert_5xx_with_its_id(response, 500, "internal_error", logs)
    assert request_id == "req-client-7"
    assert "hunter2" not in response.text
    failure = next(r for r in logs.records if request_id in r.getMessage())
    assert failure.exc_info is not None  # the traceback is in the log, never in the answer
    assert getattr(failure, "request_id", None) == request_id


async def test_a_500_through_cors_still_carries_the_cors_headers(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, logs: pytest.LogCaptureFixture
) -> None:
    async def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(Sessions, "create", broken)
    origin = "https://app.example"
    with live_server(settings.model_copy(update={"cors_origins": [origin]})) as running:
        async with httpx.AsyncClient(base_url=running.base_url, timeout=30) as client:
            response = await client.post("/v1/sessions", json={}, headers={"Origin": origin})
    _assert_5xx_with_its_id(response, 500, "internal_error", logs)
    assert response.headers["access-control-allow-origin"] == origin
