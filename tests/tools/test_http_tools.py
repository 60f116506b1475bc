"""HTTP tools (app/tools/http_tools.py) against a real local receiver on a free port that checks the
signature the way docs/tools.md tells receivers to; and the SSRF refusals, proven by the receiver never
being reached (its request count) and the refusal's reason in the result the model reads.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from app.settings import Settings
from app.tools.config import HttpToolConfig
from app.tools.context import ToolContext
from app.tools.http_tools import HttpTools
from app.tools.registry import ToolRegistry, build_default_registry
from tests.support.server import free_port, live_server
from tests.support.sse import EventReader

pytestmark = pytest.mark.anyio
SECRET = "s3cret-s3cret-s3cret"
CTX = ToolContext(session_id="s", turn_id="t", tool_call_id="call-42")
# A NUL byte, the JSON escape PostgreSQL's JSON refuses, and the character the storage escapes with.
NUL_BODY = "a\x00b \\u0000 \ufdd0 end".encode()
SCHEMA = {"type": "object", "properties": {"number": {"type": "string"}}, "required": ["number"]}
# A JSON document of 224,011 bytes, sent in 64 KB pieces.
BIG_JSON = json.dumps({"rows": [f"row {n:06d} " + "x" * 40 for n in range(3_900)]}).encode()
BIG_JSON += b" " * (224_011 - len(BIG_JSON))


@dataclass
class Receiver:
    port: int
    requests: list[dict[str, Any]] = field(default_factory=list)

    def url(self, path: str = "/tool", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


@asynccontextmanager
async def receiver() -> AsyncIterator[Receiver]:  # noqa: C901 (a fake tool server: one handler per behaviour)
    got = Receiver(free_port())

    async def tool(request: web.Request) -> web.Response:
        body = await request.read()
        stamp = request.headers["X-Parley-Timestamp"]
        expected = hmac.new(SECRET.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(request.headers["X-Parley-Signature"], f"sha256={expected}"):
            return web.Response(status=401, text="bad signature")
        assert abs(time.time() - int(stamp)) < 60
        got.requests.append({"id": request.headers["X-Parley-Tool-Call-Id"], "body": json.loads(body)})
        return web.json_response({"order": json.loads(body)["number"], "status": "shipped"})

    async def big(request: web.Request) -> web.Response:
        got.requests.append({})
        return web.Response(text="y" * 5000)

    async def nul(request: web.Request) -> web.Response:
        got.requests.append({})
        return web.Response(body=NUL_BODY, content_type="application/octet-stream")

    async def redirect(request: web.Request) -> web.Response:
        got.requests.append({})
        raise web.HTTPFound("http://10.0.0.1/internal")

    async def pieces(request: web.Request) -> web.StreamResponse:
        # Each piece is flushed on its own, so the client receives the body in four reads.
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        for n, piece in enumerate([b"part1 ", b"part2 ", b"part3 ", b"END"]):
            if n:
                await asyncio.sleep(0.05)
            await response.write(piece)
        await response.write_eof()
        return response

    async def json_pieces(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for start in range(0, len(BIG_JSON), 65_536):
            await response.write(BIG_JSON[start : start + 65_536])
            await asyncio.sleep(0.01)
        await response.write_eof()
        return response

    async def endless(request: web.Request) -> web.StreamResponse:
        # A body that never ends: one byte every 50 ms (slow) or 4 KB at a time (a flood).
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        while True:
            await response.write(b"e" if request.query.get("flood") is None else b"f" * 4096)
            await asyncio.sleep(0.05 if request.query.get("flood") is None else 0)

    app = web.Application()
    app.add_routes(
        [
            web.post("/tool", tool),
            web.post("/big", big),
            web.post("/redirect", redirect),
            web.post("/pieces", pieces),
            web.post("/json-pieces", json_pieces),
            web.post("/endless", endless),
            web.post("/nul", nul),
        ]
    )
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", got.port).start()
    try:
        yield got
    finally:
        await runner.cleanup()


def tool(url: str, **options: Any) -> HttpToolConfig:
    return HttpToolConfig.model_validate(
        {"url": url, "description": "Look an order up.", "parameters": SCHEMA, "secret": SECRET, **options}
    )


@asynccontextmanager
async def registry_with(tools: HttpTools) -> AsyncIterator[ToolRegistry]:
    registry = build_default_registry()
    registry.add_provider(tools)
    tools.start()
    try:
        yield registry
    finally:
        await tools.stop()


async def run(registry: ToolRegistry, name: str, arguments: object) -> tuple[str, bool, bool]:
    outcome = await registry.execute(name, json.dumps(arguments), CTX, default_timeout=30)
    return outcome.content, outcome.is_error, outcome.truncated


async def test_signed_call_reaches_an_allow_listed_receiver() -> None:
    async with receiver() as got:
        tools = HttpTools({"order": tool(got.url()), "wrong": tool(got.url())}, ["127.0.0.1"])
        async with registry_with(tools) as registry:
            assert registry.source_of("order") == "http"
            content, is_error, _ = await run(registry, "order", {"number": "A-1"})
            assert not is_error and json.loads(content) == {"order": "A-1", "status": "shipped"}
            assert got.requests == [{"id": "call-42", "body": {"number": "A-1"}}]
            # Arguments that do not match the schema are never sent.
            content, is_error, _ = await run(registry, "order", {"number": 7})
            assert is_error and "is not of type 'string'" in content and len(got.requests) == 1


async def test_a_wrong_secret_is_refused_by_the_receiver() -> None:
    async with receiver() as got:
        config = tool(got.url(), secret="another-secret-entirely")
        async with registry_with(HttpTools({"order": config}, ["127.0.0.1"])) as registry:
            content, is_error, _ = await run(registry, "order", {"number": "A-1"})
            assert is_error and "answered 401: bad signature" in content and got.requests == []


async def test_response_cap_and_redirect_not_followed() -> None:
    async with receiver() as got:
        configs = {
            "big": tool(got.url("/big"), max_response_bytes=1000),
            "moved": tool(got.url("/redirect")),
        }
        async with registry_with(HttpTools(configs, ["127.0.0.1"])) as registry:
            content, is_error, truncated = await run(registry, "big", {"number": "1"})
            assert not is_error and truncated and content.startswith("y" * 1000)
            assert "[truncated: the response was longer than 1000 bytes]" in content
            content, is_error, _ = await run(registry, "moved", {"number": "1"})
            assert is_error and "redirect (302): not followed" in content


async def test_a_body_in_pieces_is_read_whole() -> None:
    """The result is the whole body, however many reads it takes: not the first piece received."""
    assert len(BIG_JSON) == 224_011
    async with receiver() as got:
        configs = {
            "pieces": tool(got.url("/pieces")),
            "document": tool(got.url("/json-pieces"), max_response_bytes=300_000),
            "capped": tool(got.url("/json-pieces"), max_response_bytes=100_000),
        }
        async with registry_with(HttpTools(configs, ["127.0.0.1"])) as registry:
            assert await run(registry, "pieces", {"number": "1"}) == ("part1 part2 part3 END", False, False)
            content, is_error, truncated = await run(registry, "document", {"number": "1"})
            assert not is_error and not truncated and content.encode() == BIG_JSON
            content, is_error, truncated = await run(registry, "capped", {"number": "1"})
            assert not is_error and truncated
            assert content == BIG_JSON[:100_000].decode() + (
                "\n[truncated: the response was longer than 100000 bytes]"
            )


async def test_an_endless_body_is_a_timeout_or_a_cut_never_a_partial_answer() -> None:
    """A body that never ends is a timeout error within the tool's timeout; one that floods past the cap is
    cut with the marker. A first piece is never taken for the whole answer."""
    async with receiver() as got:
        configs = {
            "slow": tool(got.url("/endless"), timeout=1.0),
            "flood": tool(got.url("/endless?flood=1"), max_response_bytes=50_000, timeout=10.0),
        }
        async with registry_with(HttpTools(configs, ["127.0.0.1"])) as registry:
            started = time.monotonic()
            content, is_error, _ = await run(registry, "slow", {"number": "1"})
            assert is_error and "timed out after 1.0 s" in content, content
            assert 0.9 < time.monotonic() - started < 5
            content, is_error, truncated = await run(registry, "flood", {"number": "1"})
            assert not is_error and truncated
            assert content == "f" * 50_000 + "\n[truncated: the response was longer than 50000 bytes]"


async def test_loopback_without_allow_list_is_refused() -> None:
    async with receiver() as got:
        configs = {"literal": tool(got.url()), "named": tool(got.url(host="localhost"))}
        async with registry_with(HttpTools(configs, [])) as registry:
            content, is_error, _ = await run(registry, "literal", {"number": "1"})
            assert is_error and "127.0.0.1 is a loopback address" in content
            content, is_error, _ = await run(registry, "named", {"number": "1"})
            assert is_error and "localhost resolves to a loopback address" in content
        assert got.requests == []


async def test_metadata_and_private_names_are_refused() -> None:
    async def resolve(host: str, port: int) -> list[str]:
        return {"internal.example": ["10.1.2.3"], "mixed.example": ["93.184.215.14", "192.168.0.1"]}[host]

    configs = {
        "metadata": tool("https://169.254.169.254/latest/meta-data"),
        "private": tool("https://internal.example/tool"),
        "mixed": tool("https://mixed.example/tool"),
        "v6": tool("https://[::ffff:127.0.0.1]/tool"),
    }
    async with registry_with(HttpTools(configs, [], resolve=resolve)) as registry:
        content, is_error, _ = await run(registry, "metadata", {"number": "1"})
        assert is_error and "169.254.169.254 is a link-local (cloud metadata) address" in content
        content, is_error, _ = await run(registry, "private", {"number": "1"})
        assert is_error and "internal.example resolves to a private address" in content
        content, is_error, _ = await run(registry, "mixed", {"number": "1"})
        assert is_error and "mixed.example resolves to a private address" in content
        content, is_error, _ = await run(registry, "v6", {"number": "1"})
        assert is_error and "loopback" in content


async def test_unreachable_receiver_is_an_error_result() -> None:
    config = tool(f"http://127.0.0.1:{free_port()}/tool")
    async with registry_with(HttpTools({"gone": config}, ["127.0.0.1"])) as registry:
        content, is_error, _ = await run(registry, "gone", {"number": "1"})
        assert is_error and content.startswith("HTTP tool 'gone' failed")


async def test_through_a_real_server_the_stream_says_http(settings: Settings, tmp_path: Path) -> None:
    """The model (the demo, by its [call:...] trigger) calls the HTTP tool through a real uvicorn server:
    the history's tool row says source http, and the receiver got exactly one signed call with its id."""
    async with receiver() as got:
        tools = tmp_path / "tools.json"
        entry = {"url": got.url(), "description": "Order.", "parameters": SCHEMA, "secret": SECRET}
        tools.write_text(json.dumps({"http_tools": {"order": entry}, "allow_private_hosts": ["127.0.0.1"]}))
        with live_server(settings.model_copy(update={"tools_file": tools})) as server:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
                sid = (await client.post("/v1/sessions", json={"tools": ["order"]})).json()["id"]
                content = '[call:order {"number": "A-7"}]'
                done = await client.post(
                    f"/v1/sessions/{sid}/messages", params={"wait": "true"}, json={"content": content}
                )
                assert done.json()["status"] == "completed"
                history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
        [row] = [m for m in history if m["type"] == "tool_group"]
        assert row["source"] == "http" and row["is_error"] is False
        assert json.loads(row["result"]) == {"order": "A-7", "status": "shipped"}
        assert got.requests == [{"id": row["tool_call_id"], "body": {"number": "A-7"}}]


@pytest.mark.both_backends
async def test_a_body_with_a_nul_byte_is_the_result_on_both_databases(
    settings: Settings, tmp_path: Path
) -> None:
    """The receiver answers a NUL byte: the turn completes, and the stream and the history hold the body."""
    async with receiver() as got:
        tools = tmp_path / "tools.json"
        entry = {"url": got.url("/nul"), "description": "Odd.", "parameters": SCHEMA, "secret": SECRET}
        tools.write_text(json.dumps({"http_tools": {"odd": entry}, "allow_private_hosts": ["127.0.0.1"]}))
        with live_server(settings.model_copy(update={"tools_file": tools})) as server:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
                sid = (await client.post("/v1/sessions", json={"tools": ["odd"]})).json()["id"]
                content = '[call:odd {"number": "A-7"}]'
                done = await client.post(
                    f"/v1/sessions/{sid}/messages", params={"wait": "true"}, json={"content": content}
                )
                assert done.json()["status"] == "completed", done.text
                history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
                async with EventReader(client, f"/v1/sessions/{sid}/events?after=0") as reader:
                    [end] = await reader.wait_type("tool_exec_end")
    [row] = [m for m in history if m["type"] == "tool_group"]
    assert (row["result"], row["is_error"]) == (NUL_BODY.decode(), False)
    assert end.data["tool_result"]["content"] == NUL_BODY.decode()
    assert len(got.requests) == 1
