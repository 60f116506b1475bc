"""Tools from the tools file end to end: a real uvicorn Parley server, the fake OpenAI-compatible
upstream scripting the model's tool calls (the real LiteLLM path), and a real MCP server written with the
SDK over streamable HTTP and over stdio, plus an HTTP tool's local receiver.

Proofs: what the stream and the history say (`source`, `truncated`, the result), what the upstream got
back (the tool result in a history a strict provider accepts), what the MCP server saw (a cancel), and
/proc after a SIGTERM (no stdio server left).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from app.settings import Settings
from tests.fakes.upstream import FakeUpstream, Script, validate_history
from tests.support.mcp import SERVER, McpHttpServer, alive, seen, wait_for
from tests.support.process import ServerProcess
from tests.support.server import LiveServer, free_port, live_server
from tests.support.sse import EventReader

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
MODEL = "openai/fake-model"


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(api_key="sk-test") as running:
        yield running


@pytest.fixture
def mcp_http(tmp_path: Path) -> Iterator[McpHttpServer]:
    server = McpHttpServer(tmp_path / "http-mcp.log")
    server.start()
    yield server
    server.kill()


def write_files(tmp_path: Path, upstream: FakeUpstream, mcp_http: McpHttpServer) -> tuple[Path, Path]:
    models = tmp_path / "models.json"
    models.write_text(
        json.dumps(
            {
                "providers": {
                    "fake": {
                        "api_base": upstream.base_url,
                        "api_key_env": "PARLEY_TEST_FAKE_KEY",
                        "models": [MODEL],
                    }
                }
            }
        )
    )
    tools = tmp_path / "tools.yaml"
    tools.write_text(
        yaml.safe_dump(
            {
                "mcp_servers": {
                    "demo": {
                        "url": mcp_http.url,
                        "timeout": 20,
                        "max_result_chars": 500,
                        "approval": ["fail", "b*"],
                    },
                    "local": {
                        "command": "${PARLEY_TEST_PYTHON}",
                        "args": [str(SERVER), "stdio"],
                        "env": {"MCP_TEST_LOG": str(tmp_path / "stdio-mcp.log")},
                    },
                    "down": {"url": f"http://127.0.0.1:{free_port()}/mcp"},
                },
                "http_tools": {
                    "order": {
                        "url": f"http://127.0.0.1:{free_port()}/tool",
                        "description": "Order lookup.",
                        "secret": "${PARLEY_TEST_TOOL_SECRET}",
                        "approval": "always",
                    },
                },
            }
        )
    )
    return models, tools


@pytest.fixture
def configured(
    settings: Settings,
    upstream: FakeUpstream,
    mcp_http: McpHttpServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Settings:
    monkeypatch.setenv("PARLEY_TEST_FAKE_KEY", "sk-test")
    monkeypatch.setenv("PARLEY_TEST_PYTHON", sys.executable)
    monkeypatch.setenv("PARLEY_TEST_TOOL_SECRET", "a-secret-of-sixteen-chars")
    models, tools = write_files(tmp_path, upstream, mcp_http)
    return settings.model_copy(
        update={"models_file": models, "tools_file": tools, "default_model": MODEL, "mcp_retry_max": 0.5}
    )


@pytest.fixture
def server(configured: Settings) -> Iterator[LiveServer]:
    with live_server(configured) as running:
        yield running


async def connected_listing(client: httpx.AsyncClient) -> dict[str, Any]:
    listing: dict[str, Any] = {}

    async def ready() -> bool:
        nonlocal listing
        listing = (await client.get("/v1/tools")).json()
        states = {s["name"]: s["state"] for s in listing["mcp_servers"]}
        return states.get("demo") == "connected" and states.get("local") == "connected"

    for _ in range(400):
        if await ready():
            return listing
        await asyncio.sleep(0.05)
    raise AssertionError(f"MCP servers did not connect: {listing}")


async def test_listing_names_every_tool_and_each_servers_state(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        listing = await connected_listing(client)
        tools = {t["name"]: t for t in listing["tools"]}
        assert tools["calculate"]["source"] == "builtin"
        assert tools["demo__add"]["source"] == "mcp" and tools["demo__add"]["server"] == "demo"
        assert tools["demo__add"]["parameters"]["required"] == ["a", "b"]
        assert tools["local__echo"]["source"] == "mcp"
        assert tools["order"]["source"] == "http" and tools["order"]["requires_approval"] is True
        # approval: ["fail", "b*"] on the server: by tool name or glob.
        assert [n for n, t in tools.items() if t["requires_approval"]] == ["demo__big", "demo__fail", "order"]
        servers = {s["name"]: s for s in listing["mcp_servers"]}
        assert servers["demo"]["transport"] == "http" and servers["demo"]["tool_count"] == len(
            [n for n in tools if n.startswith("demo__")]
        )
        assert servers["local"]["transport"] == "stdio"
        assert servers["down"]["state"] == "error" and "ConnectError" in servers["down"]["error"]
        # A session may name a whole server; an unknown name is a 422 that stores nothing.
        created = await client.post("/v1/sessions", json={"tools": ["demo", "local/*", "down", "calculate"]})
        assert created.status_code == 201, created.text
        refused = await client.post("/v1/sessions", json={"tools": ["demo", "nosuch"]})
        assert refused.status_code == 422 and refused.json()["error"]["details"]["unknown"] == ["nosuch"]
        assert len((await client.get("/v1/sessions")).json()["sessions"]) == 1


async def run_turn(client: httpx.AsyncClient, sid: str, content: str, approve: int = 0) -> EventReader:
    """The turn to its end; `approve`: how many calls the tools file guards, approved once all are asked."""
    async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
        posted = await client.post(f"/v1/sessions/{sid}/messages", json={"content": content})
        assert posted.status_code == 202
        if approve:
            asked = await reader.wait_type("approval_requested", count=approve, timeout=40)
            decisions = [{"tool_call_id": e.data["tool_call_id"], "decision": "approve"} for e in asked]
            approved = await client.post(f"/v1/sessions/{sid}/approvals", json={"decisions": decisions})
            assert approved.status_code == 200, approved.text
        await reader.wait_type("turn_done", timeout=40)
    return reader


async def test_the_model_calls_mcp_tools_over_http_and_stdio(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(
        Script.tool_calls(
            [
                ("call_a", "demo__add", '{"a": 2, "b": 40}'),
                ("call_b", "demo__big", '{"chars": 2000}'),
                ("call_c", "demo__fail", '{"reason": "no such order"}'),
                ("call_d", "local__echo", '{"text": "over stdio"}'),
            ]
        ),
        Script.text("Done."),
    )
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        await connected_listing(client)
        sid = (await client.post("/v1/sessions", json={"tools": ["demo", "local/*"]})).json()["id"]
        # approval: ["fail", "b*"] on `demo` holds for a session that selects the whole server.
        reader = await run_turn(client, sid, "add, big and fail", approve=2)
        history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
    offered = {t["function"]["name"] for t in upstream.requests[0].body["tools"]}
    assert {"demo__add", "demo__big", "local__echo"} <= offered and "calculate" not in offered
    assert [s["source"] for s in reader.of_type("tool_exec_start")] == ["mcp"] * 4
    assert [a["name"] for a in reader.of_type("approval_requested")] == ["demo__big", "demo__fail"]
    ends = {e["tool_result"]["tool_call_id"]: e for e in reader.of_type("tool_exec_end")}
    assert ends["call_a"]["tool_result"]["content"] == "42" and ends["call_a"]["source"] == "mcp"
    assert ends["call_b"]["truncated"] is True and ends["call_a"]["truncated"] is False
    assert "[truncated: the result had 2000 characters" in ends["call_b"]["tool_result"]["content"]
    assert ends["call_c"]["tool_result"]["is_error"] is True
    assert "no such order" in ends["call_c"]["tool_result"]["content"]
    assert ends["call_d"]["tool_result"] == {
        "tool_call_id": "call_d",
        "content": "over stdio",
        "is_error": False,
    }
    rows = {m["tool_call_id"]: m for m in history if m["type"] == "tool_group"}
    assert {(r["source"], r["truncated"]) for r in rows.values()} == {("mcp", False), ("mcp", True)}
    assert rows["call_a"]["result"] == "42"
    second = upstream.requests[1].body["messages"]
    assert next(m["content"] for m in second if m["role"] == "tool") == "42"
    for request in upstream.requests:
        assert validate_history(request.body["messages"]) == []
    assert reader.of_type("turn_done")[0]["status"] == "completed"


@pytest.mark.both_backends
async def test_mcp_output_holding_nul_is_stored_and_restored(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    """U+0000, the JSON escape `\\u0000` and U+FDD0 in what MCP servers give back (over HTTP and stdio)
    reach the stream, the history and the model's next prompt as the server gave them, on both databases
    (issue 31 §2; PostgreSQL stores them through app.storage.pg_text)."""
    odd = "a\x00b \ufdd0 \\u0000 \x00 end"
    arguments = json.dumps({"text": odd})
    upstream.enqueue(
        Script.tool_calls([("call_h", "demo__echo", arguments), ("call_s", "local__echo", arguments)]),
        Script.text("Done."),
    )
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        await connected_listing(client)
        sid = (await client.post("/v1/sessions", json={"tools": ["demo", "local"]})).json()["id"]
        reader = await run_turn(client, sid, "echo it")
        history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
    assert reader.of_type("turn_done")[0]["status"] == "completed"
    ends = {e["tool_result"]["tool_call_id"]: e["tool_result"] for e in reader.of_type("tool_exec_end")}
    assert {call: ends[call]["content"] for call in ("call_h", "call_s")} == {"call_h": odd, "call_s": odd}
    rows = {m["tool_call_id"]: m for m in history if m["type"] == "tool_group"}
    assert {call: (r["arguments"], r["result"]) for call, r in rows.items()} == {
        "call_h": ({"text": odd}, odd),
        "call_s": ({"text": odd}, odd),
    }
    second = upstream.requests[1].body["messages"]
    assert [m["content"] for m in second if m["role"] == "tool"] == [odd, odd]


async def test_stop_during_an_mcp_call_cancels_it_at_the_server(
    server: LiveServer, upstream: FakeUpstream, mcp_http: McpHttpServer
) -> None:
    upstream.enqueue(Script.tool_calls([("call_s", "demo__slow", '{"seconds": 60}')]), Script.text("Next."))
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        await connected_listing(client)
        sid = (await client.post("/v1/sessions", json={"tools": ["demo"]})).json()["id"]
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            await client.post(f"/v1/sessions/{sid}/messages", json={"content": "be slow"})
            await reader.wait_type("tool_exec_start")
            # tool_exec_start precedes the request to the MCP server: stop once the server runs the call,
            # so that there is a call there to cancel (a stop before the request left sends nothing).
            await wait_for(lambda: "started slow" in seen(mcp_http.log), what="the MCP server to start it")
            stopped = await client.post(f"/v1/sessions/{sid}/cancel")
            assert stopped.json()["interrupted_tool_call_ids"] == ["call_s"]
            await reader.wait_type("turn_done")
        await wait_for(
            lambda: "cancelled slow" in seen(mcp_http.log), what="the MCP server to see the cancel"
        )
        assert reader.of_type("turn_done")[0]["status"] == "cancelled"
        # The next turn is one a strict provider accepts, with the interrupted result in it.
        await run_turn(client, sid, "and now?")
    assert validate_history(upstream.requests[-1].body["messages"]) == []


@pytest.mark.processes
def test_no_stdio_server_survives_a_sigterm(
    configured: Settings, upstream: FakeUpstream, tmp_path: Path
) -> None:
    """The stdio server, and a child it started, are gone after the server's SIGTERM (checked in /proc)."""
    env = {
        "PARLEY_DATABASE_URL": configured.database_url,
        "PARLEY_TOOLS_FILE": str(configured.tools_file),
        "PARLEY_MODELS_FILE": str(configured.models_file),
        "PARLEY_DEFAULT_MODEL": MODEL,
        "PYTHONFAULTHANDLER": "1",
    }
    log = tmp_path / "stdio-mcp.log"
    parley = ServerProcess(env, tmp_path / "server.log")
    parley.start(timeout=120)  # ready: the model layer has loaded, which on a busy machine takes a while
    try:
        listing: dict[str, Any] = {}
        for _ in range(400):
            listing = httpx.get(f"{parley.base_url}/v1/tools", timeout=5).json()
            if {s["name"]: s["state"] for s in listing["mcp_servers"]}["local"] == "connected":
                break
            time.sleep(0.05)
        upstream.enqueue(Script.tool_calls([("call_p", "local__spawn", "{}")]), Script.text("Started."))
        sid = httpx.post(f"{parley.base_url}/v1/sessions", json={"tools": ["local"]}, timeout=10).json()["id"]
        done = httpx.post(
            f"{parley.base_url}/v1/sessions/{sid}/messages?wait=true", json={"content": "spawn"}, timeout=60
        )
        assert done.json()["status"] == "completed", done.text
        pids = [int(line.split()[1]) for line in seen(log) if line.split()[0] in ("start", "child")]
        assert len(pids) == 2 and all(alive(pid) for pid in pids)
        assert parley.process is not None
        parley.process.send_signal(signal.SIGTERM)
        try:
            parley.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            # Where it hangs: PYTHONFAULTHANDLER makes SIGABRT print every thread's stack into the log.
            parley.process.send_signal(signal.SIGABRT)
            parley.process.wait(timeout=10)
            pytest.fail(f"no stop within 60 s of the SIGTERM; the server log:\n{parley.log()[-8000:]}")
    finally:
        parley.kill()
    assert not any(alive(pid) for pid in pids), "the stdio MCP server or its child outlived the server"
