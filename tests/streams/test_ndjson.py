"""The event stream as NDJSON (`Accept: application/x-ndjson` or `?format=ndjson`), over a real socket:
the SSE stream's events byte for byte, one per line, resumable the same way, blank heartbeat lines, and the
same slot, shutdown and slow-client rules."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse

from app.api.events import wants_ndjson
from app.settings import Settings
from tests.support.client import BULKY, new_session, resume_reading, stalling_client
from tests.support.server import LiveServer, live_server
from tests.support.slow_tool import SlowTool, build_registry

pytestmark = pytest.mark.anyio

NDJSON = {"format": "ndjson"}
SAFETY = 30.0  # a net under reads that end on an event the test causes; never a timing assertion
KEY = "ndjson-key-0123456789abcdef"


@asynccontextmanager
async def ndjson(
    client: httpx.AsyncClient, sid: str, *, params: dict[str, str] | None = None, **kwargs: Any
) -> AsyncIterator[httpx.Response]:
    async with client.stream(
        "GET", f"/v1/sessions/{sid}/events", params=params if params is not None else NDJSON, **kwargs
    ) as response:
        yield response


class Lines:
    """A response's lines, read in parts: each `read` goes on where the last one stopped."""

    def __init__(self, response: httpx.Response) -> None:
        self._lines = response.aiter_lines()

    async def read(self, until_type: str | None = "turn_done") -> list[str]:
        """Every line as sent (blank ones too), until a line of `until_type` or the end of the stream."""
        lines: list[str] = []
        async with asyncio.timeout(SAFETY):
            async for line in self._lines:
                lines.append(line)
                if until_type is not None and line and json.loads(line)["type"] == until_type:
                    break
        return lines


async def read_lines(response: httpx.Response, until_type: str | None = "turn_done") -> list[str]:
    return await Lines(response).read(until_type)


def events(lines: list[str]) -> list[dict[str, Any]]:
    """What jq sees: each non-blank line is one JSON object."""
    return [json.loads(line) for line in lines if line.strip()]


async def wait_turn(client: httpx.AsyncClient, sid: str, content: str) -> dict[str, Any]:
    posted = await client.post(
        f"/v1/sessions/{sid}/messages", params={"wait": "true"}, json={"content": content}
    )
    assert posted.status_code == 200, posted.text
    turn: dict[str, Any] = posted.json()
    return turn


async def test_the_lines_are_the_sse_data_byte_for_byte(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
        sid = await new_session(client)
        sse_data: list[str] = []
        opened = asyncio.Event()

        async def read_sse() -> None:
            async with aconnect_sse(client, "GET", f"/v1/sessions/{sid}/events") as source:
                opened.set()
                async for sse in source.aiter_sse():
                    if sse.data:
                        sse_data.append(sse.data)
                        if sse.event == "turn_done":
                            return

        sse = asyncio.create_task(read_sse())
        async with ndjson(client, sid) as response:
            assert response.headers["content-type"] == "application/x-ndjson"
            assert response.headers["cache-control"] == "no-store"
            await opened.wait()
            reading = asyncio.create_task(read_lines(response))
            await wait_turn(client, sid, "what time is it?")
            lines = await reading
        await asyncio.wait_for(sse, SAFETY)

    assert [line for line in lines if line] == sse_data
    seen = events(lines)
    assert [e["seq"] for e in seen] == list(range(1, len(seen) + 1))
    assert {"turn_start", "text_delta", "tool_exec_start", "tool_exec_end", "turn_done"} <= {
        e["type"] for e in seen
    }


async def test_the_accept_header_asks_for_it_and_resumes_like_sse(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
        sid = await new_session(client)
        await wait_turn(client, sid, "what is 2+3*4?")
        accept = {"Accept": "application/x-ndjson"}
        async with ndjson(client, sid, params={"after": "3"}, headers=accept) as response:
            assert response.headers["content-type"] == "application/x-ndjson"
            after = events(await read_lines(response))
        # The header wins over `after`, as a reconnecting EventSource needs it to.
        header = {**accept, "Last-Event-ID": "5"}
        async with ndjson(client, sid, params={"after": "1"}, headers=header) as response:
            resumed = events(await read_lines(response))
        history = (await client.get(f"/v1/sessions/{sid}/messages")).json()

    last = history["last_event_id"]
    assert [e["seq"] for e in after] == list(range(4, last + 1))
    assert [e["seq"] for e in resumed] == list(range(6, last + 1))
    assert resumed == after[2:]


async def test_a_position_it_cannot_replay_starts_with_a_resync_line(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
        sid = await new_session(client)
        await wait_turn(client, sid, "hello")
        last = (await client.get(f"/v1/sessions/{sid}/messages")).json()["last_event_id"]
        async with ndjson(client, sid, params={**NDJSON, "after": str(last + 1000)}) as response:
            reading = asyncio.create_task(read_lines(response))
            await wait_turn(client, sid, "again")
            seen = events(await reading)

    resync, *live = seen
    assert resync == {
        "type": "resync",
        "seq": last,
        "session_id": sid,
        "last_event_id": last,
        "reason": "unknown",
    }
    assert [e["seq"] for e in live] == list(range(last + 1, last + 1 + len(live)))
    assert live[0]["type"] == "turn_start" and live[-1]["type"] == "turn_done"


@pytest.fixture
def pinging(settings: Settings) -> Iterator[LiveServer]:
    with live_server(settings.model_copy(update={"sse_ping_interval": 0.1})) as running:
        yield running


async def test_the_heartbeat_is_a_blank_line_between_event_lines(pinging: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=pinging.base_url, timeout=SAFETY) as client:
        sid = await new_session(client)
        chunks: list[bytes] = []
        async with ndjson(client, sid) as response:

            async def read() -> None:
                async for chunk in response.aiter_raw():
                    chunks.append(chunk)
                    if b'"type":"turn_done"' in chunk:
                        return

            reading = asyncio.create_task(read())
            async with asyncio.timeout(SAFETY):
                while True:  # nothing happens in the session: only heartbeats can come
                    if chunks:
                        break
                    await asyncio.sleep(0.02)
            await wait_turn(client, sid, "hello")
            await asyncio.wait_for(reading, SAFETY)

    assert set(chunks[0]) == {ord("\n")}, chunks[0]
    body = b"".join(chunks).decode()
    assert body.endswith("\n")
    lines = body.split("\n")[:-1]
    # Blank lines and events, nothing else: each non-blank line is one event for jq.
    assert [e["type"] for e in events(lines)][-1] == "turn_done"
    assert all(line == "" or isinstance(json.loads(line)["seq"], int) for line in lines)


@pytest.fixture
def one_stream(settings: Settings) -> Iterator[LiveServer]:
    update = {"max_streams_per_principal": 1, "api_keys": f"alice:{KEY}"}
    with live_server(settings.model_copy(update=update)) as running:
        yield running


async def test_it_takes_the_key_as_access_token_and_holds_a_stream_slot_until_it_ends(
    one_stream: LiveServer,
) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=one_stream.base_url, timeout=SAFETY, headers=auth) as client:
        sid = await new_session(client)
        async with httpx.AsyncClient(base_url=one_stream.base_url, timeout=SAFETY) as anonymous:
            refused = await anonymous.get(f"/v1/sessions/{sid}/events", params=NDJSON)
            async with ndjson(anonymous, sid, params={**NDJSON, "access_token": KEY}) as held:
                assert held.status_code == 200
                second = await client.get(f"/v1/sessions/{sid}/events", params=NDJSON)
        # Closed by the client: the slot comes back (the server notices the disconnect).
        async with asyncio.timeout(SAFETY):
            while True:
                async with ndjson(client, sid) as again:
                    if again.status_code == 200:
                        break
                await asyncio.sleep(0.05)

    assert refused.status_code == 401
    assert second.status_code == 429 and second.json()["error"]["code"] == "too_many_streams"


@pytest.fixture
def gated(settings: Settings) -> Iterator[tuple[LiveServer, SlowTool]]:
    """The `slow` tool waits on a gate nobody opens: a turn that runs until something stops it."""
    tool = SlowTool()
    with live_server(settings, tools=build_registry(tool)) as running:
        yield running, tool
    tool.release_all()


async def test_at_shutdown_the_stream_ends_after_its_last_lines(gated: tuple[LiveServer, SlowTool]) -> None:
    server, _ = gated
    async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
        sid = await new_session(client)
        async with ndjson(client, sid) as response:
            lines = Lines(response)
            await client.post(f"/v1/sessions/{sid}/messages", json={"content": '[call:slow {"gate": "g"}]'})
            before = events(await lines.read(until_type="tool_exec_start"))
            reading = asyncio.create_task(lines.read(until_type=None))
            await asyncio.to_thread(server.drain)  # what SIGTERM starts
            seen = before + events(await reading)

    assert seen[0]["type"] == "turn_start"
    assert seen[-1]["type"] == "turn_done" and seen[-1]["status"] == "interrupted"


async def test_a_client_that_reads_nothing_is_cut_off_and_resumes_from_its_last_line(
    small_queues: LiveServer,
) -> None:
    async with httpx.AsyncClient(base_url=small_queues.base_url, timeout=SAFETY) as client:
        sid = await new_session(client)
        async with stalling_client(small_queues) as slow, ndjson(slow, sid) as stalled:
            assert stalled.status_code == 200
            await wait_turn(client, sid, BULKY)
            await wait_turn(client, sid, BULKY)
            # Only now does it read: what was buffered for it, then the end of its stream.
            resume_reading(stalled)
            received = events(await read_lines(stalled, until_type=None))
        last = (await client.get(f"/v1/sessions/{sid}/messages")).json()["last_event_id"]
        async with ndjson(client, sid, params={**NDJSON, "after": str(received[-1]["seq"])}) as rest:
            lines = Lines(rest)
            resumed: list[dict[str, Any]] = []
            while not resumed or resumed[-1]["seq"] < last:
                resumed += events(await lines.read())

    # A gap-free beginning, cut off before the end; resuming from its last line gives exactly the rest.
    assert [e["seq"] for e in received] == list(range(1, len(received) + 1))
    assert len(received) < last
    assert [e["seq"] for e in received + resumed] == list(range(1, last + 1))


@pytest.mark.parametrize(
    ("format", "accept", "expected"),
    [
        (None, None, False),
        (None, "*/*", False),
        (None, "text/event-stream", False),
        (None, "application/json, */*;q=0.5", False),  # httpie's default
        (None, "application/x-ndjson", True),
        (None, "Application/X-NDJSON; charset=utf-8", True),
        (None, "text/event-stream;q=0.5, application/x-ndjson", True),
        (None, "application/x-ndjson;q=0.4, text/event-stream", False),
        (None, "application/x-ndjson;q=0", False),
        (None, "application/x-ndjson;q=oops", False),
        ("ndjson", None, True),
        ("ndjson", "text/event-stream", True),
        ("sse", "application/x-ndjson", False),
    ],
)
def test_format_wins_then_the_accept_header_decides(format: Any, accept: str | None, expected: bool) -> None:
    assert wants_ndjson(format, accept) is expected
