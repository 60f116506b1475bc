"""The event stream's response (app/api/sse.py) at the ASGI level, each way a stream ends, and the rule
that the app uses sse-starlette's public API only: nothing private of it is named anywhere in app/."""

from __future__ import annotations

import ast
import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sse_starlette
import sse_starlette.event
import sse_starlette.sse
from sse_starlette import EventSourceResponse, JSONServerSentEvent, ServerSentEvent
from starlette.types import Message

from app.api.sse import EventStreamResponse

APP = Path(__file__).resolve().parents[2] / "app"
SAFETY = 10.0  # a net under waits that end on something the test causes; never a timing assertion


class Body:
    """A stream's body that records whether it started and whether its clean-up ran."""

    def __init__(self, *chunks: bytes, endless: bool = False) -> None:
        self.chunks = chunks
        self.endless = endless
        self.started = False
        self.closed = False

    async def __call__(self) -> AsyncIterator[bytes]:
        self.started = True
        try:
            for chunk in self.chunks:
                yield chunk
            if self.endless:
                await asyncio.Event().wait()
        finally:
            self.closed = True


class Exchange:
    """One request's ASGI side: what the response sent, how often it closed, and a client that leaves
    when the test says."""

    def __init__(self, *, stalls_on: str | None = None) -> None:
        self.sent: list[Message] = []
        self.body_sent = asyncio.Event()
        self.left = asyncio.Event()
        self.closes = 0
        # A client that reads nothing: sends of this message type never complete.
        self.stalls_on = stalls_on

    async def run(self, body: Body, method: str = "GET", *, send_timeout: float = 30) -> None:
        response = EventStreamResponse(
            body(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store"},
            send_timeout=send_timeout,
            shutdown_grace=1,
            on_close=self.close,
        )
        scope = {"type": "http", "method": method, "path": "/events", "headers": []}
        await asyncio.wait_for(response(scope, self.receive, self.send), SAFETY)

    def close(self) -> None:
        self.closes += 1

    async def receive(self) -> Message:
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)
        if message["type"] == self.stalls_on:
            await asyncio.Event().wait()
        if message["type"] == "http.response.body":
            self.body_sent.set()

    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]


pytestmark = pytest.mark.anyio


async def test_a_body_that_ends_ends_the_response() -> None:
    body, exchange = Body(b"a", b"b"), Exchange()
    await exchange.run(body)

    assert exchange.sent[0]["type"] == "http.response.start"
    assert exchange.bodies() == [b"a", b"b", b""]
    assert exchange.sent[-1]["more_body"] is False
    assert exchange.closes == 1 and body.closed


async def test_a_client_that_leaves_ends_the_body_and_closes_once() -> None:
    body, exchange = Body(b"a", endless=True), Exchange()
    call = asyncio.create_task(exchange.run(body))
    await asyncio.wait_for(exchange.body_sent.wait(), SAFETY)
    exchange.left.set()
    await call

    assert exchange.bodies() == [b"a"]
    assert exchange.closes == 1 and body.closed


async def test_a_client_gone_before_the_body_started_closes_once() -> None:
    body, exchange = Body(b"a", endless=True), Exchange(stalls_on="http.response.start")
    exchange.left.set()
    await exchange.run(body)

    assert exchange.closes == 1
    assert not body.started


async def test_head_answers_the_headers_alone_and_closes_once() -> None:
    body, exchange = Body(b"a", endless=True), Exchange()
    await exchange.run(body, "HEAD")

    start = exchange.sent[0]
    assert start["type"] == "http.response.start" and start["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in start["headers"]
    assert exchange.bodies() == [b""]
    assert exchange.closes == 1
    assert not body.started


async def test_a_send_that_times_out_is_a_warning_and_closes_once(caplog: pytest.LogCaptureFixture) -> None:
    body, exchange = Body(b"a", endless=True), Exchange(stalls_on="http.response.body")
    caplog.set_level(logging.WARNING, logger="app.api.sse")
    await exchange.run(body, send_timeout=0.05)  # returns: not raised as a server error

    assert [r.getMessage() for r in caplog.records] == [
        "an event stream was cut: its client read nothing for 0.05 s"
    ]
    assert exchange.closes == 1 and body.closed
    assert exchange.sent[-1]["more_body"] is True  # left unfinished: the server closes the connection


# sse-starlette's private names: its modules' and classes' underscore attributes, and those a response
# sets on itself. Dunder names are left to the subclass rule below.
def _private(*owners: object) -> set[str]:
    return {n for owner in owners for n in dir(owner) if n.startswith("_") and not n.startswith("__")}


PRIVATE = _private(
    sse_starlette,
    sse_starlette.sse,
    sse_starlette.event,
    EventSourceResponse,
    ServerSentEvent,
    JSONServerSentEvent,
    sse_starlette.sse.AppStatus,
) | {n for n in vars(EventSourceResponse(iter(()))) if n.startswith("_")}


def _sse_starlette_names(tree: ast.Module) -> set[str]:
    """The names a module binds to sse-starlette or to anything imported from it."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {
                (a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("sse_starlette")
            }
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sse_starlette"):
            names |= {a.asname or a.name for a in node.names}
    return names


def private_uses(source: str) -> list[str]:
    """Where `source` names something private of sse-starlette, or overrides a method of one of its classes
    (it documents no hook to override)."""
    tree = ast.parse(source)
    bound = _sse_starlette_names(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in (m for m in modules if m.startswith("sse_starlette")):
                if any(part.startswith("_") for part in module.split(".")):
                    found.append(f"line {node.lineno}: imports {module}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sse_starlette"):
                found += [
                    f"line {node.lineno}: imports {a.name}" for a in node.names if a.name.startswith("_")
                ]
        elif isinstance(node, ast.Attribute) and node.attr in PRIVATE:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ClassDef):
            bases = {b.id if isinstance(b, ast.Name) else ast.unparse(b).split(".")[0] for b in node.bases}
            subclass = bool(bases & bound)
            for method in node.body:
                if not isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                # In a subclass any underscore method is an override of its machinery; elsewhere one
                # of its private names is, through an intermediate class.
                if method.name in PRIVATE or (subclass and method.name.startswith("_")):
                    found.append(f"line {method.lineno}: {node.name} overrides {method.name}")
    return found


def test_the_app_names_nothing_private_of_sse_starlette() -> None:
    modules = {str(path.relative_to(APP.parent)): path.read_text() for path in sorted(APP.rglob("*.py"))}
    assert "app/api/sse.py" in modules
    found = {name: uses for name, source in modules.items() if (uses := private_uses(source))}
    assert found == {}


def test_the_check_sees_what_the_old_subclass_did() -> None:
    """The rule above is only as good as this: overriding sse-starlette's internals, or reaching into its
    state or its private modules, is each caught."""
    old = """
from sse_starlette import EventSourceResponse
from sse_starlette.sse import SendTimeoutError
from sse_starlette._utils import collapse_excgroups

class Stream(EventSourceResponse):
    async def _send_with_timeout(self, send, message): ...
    async def __call__(self, scope, receive, send):
        await self._stream_response(send)

def pinged(response):
    return response._ping_interval
"""
    assert set(private_uses(old)) == {
        "line 4: imports sse_starlette._utils",
        "line 7: Stream overrides _send_with_timeout",
        "line 8: Stream overrides __call__",
        "line 9: ._stream_response",
        "line 12: ._ping_interval",
    }
