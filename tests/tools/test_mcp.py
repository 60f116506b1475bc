"""MCP servers through the SDK's Client (app/tools/mcp.py), against a real MCP server written with the
SDK's MCPServer (tests/tools/mcp_server.py), over streamable HTTP on a free port and over stdio.

Each test proves its point by what a real peer shows: the server's own log (it saw the cancellation),
/proc (no process left), the registry's answer (an is_error result, never an exception).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from app.tools.config import McpServerConfig
from app.tools.context import ToolContext
from app.tools.mcp import McpServers
from app.tools.registry import ToolRegistry, build_default_registry
from tests.support.mcp import McpHttpServer, alive, seen, stdio_config, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
CTX = ToolContext(session_id="s", turn_id="t", tool_call_id="call-1")


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "mcp.log"


@pytest.fixture
def http_server(log: Path) -> Iterator[McpHttpServer]:
    server = McpHttpServer(log)
    server.start()
    yield server
    server.kill()


@pytest.fixture(params=["http", "stdio"])
def config(request: pytest.FixtureRequest, log: Path) -> Iterator[McpServerConfig]:
    if request.param == "stdio":
        yield stdio_config(log, timeout=3, max_result_chars=1000)
        return
    server = McpHttpServer(log)
    server.start()
    yield server.config(timeout=3, max_result_chars=1000)
    server.kill()


@asynccontextmanager
async def connected(configs: dict[str, McpServerConfig]) -> AsyncIterator[tuple[McpServers, ToolRegistry]]:
    servers = McpServers(configs, backoff=0.1, backoff_max=0.5)
    registry = build_default_registry()
    registry.add_provider(servers)
    servers.start()
    try:
        await wait_for(lambda: all(s.state == "connected" for s in servers.servers.values()), what="connect")
        yield servers, registry
    finally:
        await servers.stop()


async def call(registry: ToolRegistry, name: str, arguments: object) -> tuple[str, bool, bool]:
    outcome = await registry.execute(name, json.dumps(arguments), CTX, default_timeout=30)
    return outcome.content, outcome.is_error, outcome.truncated


async def test_discovery_call_error_and_truncation(config: McpServerConfig) -> None:
    async with connected({"demo": config}) as (servers, registry):
        names = registry.names()
        assert {"demo__add", "demo__slow", "demo__fail", "calculate"} <= set(names)
        assert registry.source_of("demo__add") == "mcp"
        assert registry.source_of("calculate") == "builtin"
        assert servers.servers["demo"].tools[0].parameters["type"] == "object"
        assert await call(registry, "demo__add", {"a": 2, "b": 40}) == ("42", False, False)
        # The server's isError result reaches the model as an error, with the server's words.
        content, is_error, _ = await call(registry, "demo__fail", {"reason": "no such order"})
        assert is_error and "no such order" in content
        # Arguments that do not match the tool's schema never reach the server.
        content, is_error, _ = await call(registry, "demo__add", {"a": "two"})
        assert is_error and "'b' is a required property" in content
        content, is_error, truncated = await call(registry, "demo__big", {"chars": 5000})
        assert not is_error and truncated
        assert content.startswith("x" * 1000) and "[truncated: the result had 5000 characters" in content


async def test_timeout_is_an_error_result_and_the_server_sees_the_cancel(
    config: McpServerConfig, log: Path
) -> None:
    async with connected({"demo": config.model_copy(update={"timeout": 0.5})}) as (_servers, registry):
        content, is_error, _ = await call(registry, "demo__slow", {"seconds": 30})
        assert is_error and "timed out after 0.5 s" in content
        await wait_for(lambda: "cancelled slow" in seen(log), what="the server to see the cancel")
        # The connection is still good for the next call.
        assert await call(registry, "demo__add", {"a": 1, "b": 1}) == ("2", False, False)


async def test_cancel_during_a_call_reaches_the_server(config: McpServerConfig, log: Path) -> None:
    async with connected({"demo": config}) as (_servers, registry):
        task = asyncio.create_task(call(registry, "demo__slow", {"seconds": 30}))
        # Cancelled once the server runs it (a cancel before the request left has nothing to tell it).
        await wait_for(lambda: "started slow" in seen(log), what="the server to start the call")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_for(lambda: "cancelled slow" in seen(log), what="the server to see the cancel")


async def test_list_changed_refreshes_the_tools(config: McpServerConfig) -> None:
    async with connected({"demo": config}) as (_servers, registry):
        assert "demo__late" not in registry.names()
        assert await call(registry, "demo__grow", {"name": "late"}) == ("ok", False, False)
        await wait_for(lambda: "demo__late" in registry.names(), what="the new tool")
        assert await call(registry, "demo__late", {}) == ("added", False, False)


async def test_http_server_killed_mid_call_then_back(http_server: McpHttpServer) -> None:
    async with connected({"demo": http_server.config(timeout=10)}) as (servers, registry):
        task = asyncio.create_task(call(registry, "demo__slow", {"seconds": 30}))
        await asyncio.sleep(0.5)
        http_server.kill()
        content, is_error, _ = await task
        assert is_error and "demo" in content
        server = servers.servers["demo"]
        await wait_for(lambda: server.state == "error", what="the error state")
        assert server.error and server.tools == []
        # A tool of a server that is down: an error the model reads, not a crash.
        content, is_error, _ = await call(registry, "demo__add", {"a": 1, "b": 1})
        assert is_error
        http_server.start()
        await wait_for(lambda: server.state == "connected", what="the reconnect")
        assert await call(registry, "demo__add", {"a": 1, "b": 2}) == ("3", False, False)


async def test_stdio_server_dying_mid_call_is_restarted_and_leaves_no_orphan(log: Path) -> None:
    async with connected({"demo": stdio_config(log, timeout=10)}) as (servers, registry):
        child = int((await call(registry, "demo__spawn", {}))[0])
        assert alive(child)
        content, is_error, _ = await call(registry, "demo__crash", {})
        assert is_error and "demo" in content
        await wait_for(lambda: not alive(child), what="the crashed server's child to be ended")
        server = servers.servers["demo"]
        await wait_for(lambda: server.state == "connected" and server.connects == 2, what="the restart")
        assert await call(registry, "demo__add", {"a": 1, "b": 2}) == ("3", False, False)


async def test_no_orphan_after_shutdown(log: Path) -> None:
    pids: list[int] = []
    async with connected({"demo": stdio_config(log)}) as (_servers, registry):
        pids.append(int((await call(registry, "demo__spawn", {}))[0]))
        pids += [int(line.split()[1]) for line in seen(log) if line.startswith("start ")]
        assert len(pids) == 2 and all(alive(pid) for pid in pids)
    # stop() has returned: the server and the child it started are gone, checked in /proc.
    await wait_for(lambda: not any(alive(pid) for pid in pids), timeout=5, what="no process left")


async def test_unreachable_server_is_an_error_while_others_work(log: Path) -> None:
    down = McpServerConfig(url="http://127.0.0.1:9/mcp")
    servers = McpServers({"down": down, "up": stdio_config(log)}, backoff=0.1, backoff_max=0.2)
    registry = build_default_registry()
    registry.add_provider(servers)
    servers.start()
    try:
        await wait_for(lambda: servers.servers["up"].state == "connected", what="connect")
        await wait_for(lambda: servers.servers["down"].state == "error", what="the error")
        assert "ConnectError" in (servers.servers["down"].error or "")
        assert registry.expand(["down", "up/*"]) == [t.name for t in servers.servers["up"].tools]
        assert registry.unknown(["down", "down__x", "up__add", "nope"]) == ["nope"]
        assert await call(registry, "up__add", {"a": 1, "b": 2}) == ("3", False, False)
    finally:
        await servers.stop()


async def test_stop_ends_a_holder_whose_cancel_the_client_turned_into_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client whose way out turns the holder's cancel into an error (as an anyio scope inside the SDK
    can): the holder used to log it as a connection failure, back off and connect again, for ever, and
    shutdown hung on it (CI, test_unreachable_server_is_an_error_while_others_work). stop() returns."""
    entered = asyncio.Event()

    class SwallowsCancel:
        async def __aenter__(self) -> None:
            entered.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                raise ConnectionError("the stream closed") from None

        async def __aexit__(self, *exc: object) -> None:
            return None

    servers = McpServers(
        {"odd": McpServerConfig(url="http://127.0.0.1:9/mcp")}, backoff=0.01, backoff_max=0.01
    )
    server = servers.servers["odd"]
    monkeypatch.setattr(server, "_client_for", lambda stack: SwallowsCancel())
    servers.start()
    await asyncio.wait_for(entered.wait(), 10)
    async with asyncio.timeout(30):
        await servers.stop()
    assert server.tools == []
