"""The tools file's approval rule holds however a session selects the tool, over real HTTP and SSE.

A live server whose tools file guards tools of a real MCP server (tests/tools/mcp_server.py over
streamable HTTP: `approval: [slow, "late_*"]`) and an HTTP tool (`approval: always`, a local receiver).
The demo model calls a tool by the `[call:NAME {args}]` trigger. Each test proves the call waited: an
`approval_requested`, the session awaiting input, and the tool's own side not touched (the MCP server's
log has no `started slow` / `ran <tool>`, the receiver no request) until the person approves; then it runs.
The selection forms: the tool's name, the whole server (`shop`, `shop/*`), a tool the server adds after
the session was created, an HTTP tool; and the session's own `approval` naming a whole server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from app.settings import Settings
from tests.interrupt.session import Session, open_session
from tests.support.mcp import McpHttpServer, seen
from tests.support.server import LiveServer, free_port, live_server
from tests.tool_requests.helpers import answer, awaiting, pending

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SECRET = "a-secret-of-sixteen-chars"
ORDER_SCHEMA = {"type": "object", "properties": {"number": {"type": "string"}}, "required": ["number"]}
SLOW_CALL = '[call:shop__slow {"seconds": 0.01}]'


@pytest.fixture
def mcp(tmp_path: Path) -> Iterator[McpHttpServer]:
    server = McpHttpServer(tmp_path / "mcp.log")
    server.start()
    yield server
    server.kill()


@dataclass
class Receiver:
    """An HTTP tool's endpoint on a free port, and the bodies it was sent."""

    url: str
    received: list[dict[str, Any]] = field(default_factory=list)


@asynccontextmanager
async def order_receiver() -> AsyncIterator[Receiver]:
    port = free_port()
    got = Receiver(f"http://127.0.0.1:{port}/order")

    async def order(request: web.Request) -> web.Response:
        got.received.append(json.loads(await request.read()))
        return web.json_response({"status": "shipped"})

    app = web.Application()
    app.add_routes([web.post("/order", order)])
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield got
    finally:
        await runner.cleanup()


@dataclass
class Guarded:
    server: LiveServer
    receiver: Receiver


@pytest.fixture
async def guarded(settings: Settings, tmp_path: Path, mcp: McpHttpServer) -> AsyncIterator[Guarded]:
    """A live server with the guarding tools file, once its MCP server is connected."""
    async with order_receiver() as receiver:
        tools = {
            "mcp_servers": {"shop": {"url": mcp.url, "timeout": 20, "approval": ["slow", "late_*"]}},
            "http_tools": {
                "order": {
                    "url": receiver.url,
                    "description": "Ship an order.",
                    "parameters": ORDER_SCHEMA,
                    "secret": SECRET,
                    "approval": "always",
                }
            },
            "allow_private_hosts": ["127.0.0.1"],
        }
        path = tmp_path / "tools.json"
        path.write_text(json.dumps(tools))
        with live_server(settings.model_copy(update={"tools_file": path, "mcp_retry_max": 0.5})) as server:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
                await listed(client, "shop__slow")
            yield Guarded(server, receiver)


async def listed(client: httpx.AsyncClient, name: str) -> dict[str, Any]:
    """The tool's entry in GET /v1/tools, once the MCP server lists it (it connects, or its list changes)."""
    found: dict[str, Any] = {}
    for _ in range(400):
        tools = {t["name"]: t for t in (await client.get("/v1/tools")).json()["tools"]}
        if name in tools:
            found = tools[name]
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"GET /v1/tools never listed {name}")


def last_seq(session: Session) -> int:
    return max((int(e.id) for e in session.reader.events), default=0)


async def asked_first(session: Session, name: str, after: int) -> None:
    """The call's first word after event `after` is an approval request, not a result (a bound, not a
    timing: the first model call of a test process waits for the model layer to load)."""
    [first] = await session.reader.wait_for(
        lambda e: int(e.id) > after and e.event in ("approval_requested", "tool_exec_end"), timeout=30.0
    )
    assert first.event == "approval_requested", f"{name} ran without approval: {first.data}"


async def waits_then_runs_once_approved(session: Session, content: str, name: str, ran: Any) -> str:
    """Posts `content` (a call of `name`); the call waits, `ran()` stays false until the approval; the
    result the tool gave once approved."""
    after = last_seq(session)
    posted = await session.accepted(content)
    await asked_first(session, name, after)
    [requested] = await awaiting(session, "approval_requested")
    assert requested["name"] == name
    assert [(p["kind"], p["name"]) for p in await pending(session)] == [("approval", name)]
    assert not ran(), f"{name} ran before anyone approved it"
    decision = {"tool_call_id": requested["tool_call_id"], "decision": "approve"}
    status, body = await answer(session, "approvals", decisions=[decision])
    assert status == 200, body
    done = await session.turn_done(posted["turn_id"], timeout=30)
    assert done["status"] == "completed"
    assert ran()
    [end] = [
        e
        for e in session.events("tool_exec_end")
        if e["tool_result"]["tool_call_id"] == decision["tool_call_id"]
    ]
    assert end["tool_result"]["is_error"] is False, end
    result: str = end["tool_result"]["content"]
    return result


@pytest.mark.parametrize("selection", [["shop__slow"], ["shop"], ["shop/*"]])
async def test_a_guarded_mcp_tool_waits_whichever_way_the_session_selects_it(
    guarded: Guarded, mcp: McpHttpServer, selection: list[str]
) -> None:
    async with open_session(guarded.server, tools=selection) as session:
        entry = await listed(session.client, "shop__slow")
        assert entry["requires_approval"] is True  # what GET /v1/tools says is what holds

        def started() -> bool:
            return "started slow" in seen(mcp.log)

        result = await waits_then_runs_once_approved(session, SLOW_CALL, "shop__slow", started)
        assert result == "slept 0.01"


async def test_a_tool_the_server_adds_after_the_session_was_created_waits(
    guarded: Guarded, mcp: McpHttpServer
) -> None:
    async with open_session(guarded.server, tools=["shop"]) as session:
        # `grow` is not guarded: it runs at once, adds `late_one` and announces the list changed.
        posted = await session.accepted('[call:shop__grow {"name": "late_one"}]')
        assert (await session.turn_done(posted["turn_id"], timeout=30))["status"] == "completed"
        assert session.events("approval_requested") == []
        assert (await listed(session.client, "shop__late_one"))["requires_approval"] is True

        def ran() -> bool:
            return "ran late_one" in seen(mcp.log)

        result = await waits_then_runs_once_approved(
            session, "[call:shop__late_one {}]", "shop__late_one", ran
        )
        assert result == "added"


async def test_an_http_tool_with_approval_waits(guarded: Guarded) -> None:
    received = guarded.receiver.received
    async with open_session(guarded.server, tools=["order"]) as session:
        assert (await listed(session.client, "order"))["requires_approval"] is True
        result = await waits_then_runs_once_approved(
            session, '[call:order {"number": "A-7"}]', "order", lambda: bool(received)
        )
    assert json.loads(result) == {"status": "shipped"}
    assert received == [{"number": "A-7"}]


@pytest.mark.parametrize("approval", [["shop"], ["shop/*"], ["shop__add"]])
async def test_the_sessions_own_approval_holds_for_a_whole_server(
    guarded: Guarded, approval: list[str]
) -> None:
    """`add` is not guarded by the tools file; the session asks for approval of the server it selected as
    a whole (or of one of its tools)."""
    async with open_session(guarded.server, tools=["shop"], approval=approval) as session:
        assert (await session.info())["approval"] == approval
        posted = await session.accepted('[call:shop__add {"a": 2, "b": 40}]')
        await asked_first(session, "shop__add", 0)
        [requested] = await awaiting(session, "approval_requested")
        assert requested["name"] == "shop__add"
        assert session.events("tool_exec_end") == []
        decision = {"tool_call_id": requested["tool_call_id"], "decision": "approve"}
        assert (await answer(session, "approvals", decisions=[decision]))[0] == 200
        assert (await session.turn_done(posted["turn_id"], timeout=30))["status"] == "completed"
        [end] = session.events("tool_exec_end")
        assert end["tool_result"]["content"] == "42"
