"""The request middleware's refusals that happen before any route: here, a keyless server reached beyond
loopback (the launcher refuses to start that way; this covers a server started some other way)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from app.api.middleware import RequestContextMiddleware

pytestmark = pytest.mark.anyio


async def _inner(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"reached"})


async def _call(
    *, loopback_only: bool, server: tuple[str, int] | None, path: str = "/v1/sessions"
) -> tuple[int, dict[str, str], bytes]:
    middleware = RequestContextMiddleware(_inner, max_body_bytes=1024, loopback_only=loopback_only)
    scope: dict[str, Any] = {"type": "http", "method": "GET", "path": path, "headers": [], "server": server}
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    async def send(message: Message) -> None:
        sent.append(message)

    await middleware(scope, receive, send)
    start, body = sent[0], sent[1]
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, body["body"]


@pytest.mark.parametrize("address", ["10.1.2.3", "0.0.0.0", "2001:db8::1", "parley.example"])
async def test_a_keyless_server_reached_beyond_loopback_refuses_with_what_to_set(address: str) -> None:
    status, headers, body = await _call(loopback_only=True, server=(address, 8000))
    assert status == 403
    error = json.loads(body)["error"]
    assert error["code"] == "open_mode_refused"
    assert "PARLEY_API_KEYS" in error["message"] and "PARLEY_ALLOW_OPEN=1" in error["message"]
    assert error["request_id"] == headers["x-request-id"]


@pytest.mark.parametrize(
    ("loopback_only", "server", "path"),
    [
        (True, ("127.0.0.1", 8000), "/v1/sessions"),
        (True, ("::1", 8000), "/v1/sessions"),
        (True, None, "/v1/sessions"),  # a Unix socket
        (True, ("10.1.2.3", 8000), "/healthz"),  # probes stay open
        (True, ("10.1.2.3", 8000), "/readyz"),
        (False, ("10.1.2.3", 8000), "/v1/sessions"),  # keys, or PARLEY_ALLOW_OPEN
    ],
)
async def test_what_passes(loopback_only: bool, server: tuple[str, int] | None, path: str) -> None:
    status, _, body = await _call(loopback_only=loopback_only, server=server, path=path)
    assert (status, body) == (200, b"reached")
