"""The stream's framing on the wire: `retry:` first, `id:`/`event:`/`data:` per event, heartbeat comments."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from app.settings import Settings
from tests.support.client import new_session, post
from tests.support.server import LiveServer, live_server

pytestmark = pytest.mark.anyio


@pytest.fixture
def chatty(settings: Settings) -> Iterator[LiveServer]:
    tuned = settings.model_copy(update={"sse_ping_interval": 0.2, "sse_retry_ms": 1234})
    with live_server(tuned) as running:
        yield running


async def test_retry_comes_first_then_events_and_heartbeats(chatty: LiveServer) -> None:
    lines: list[str] = []
    async with httpx.AsyncClient(base_url=chatty.base_url, timeout=30) as client:
        sid = await new_session(client)
        async with client.stream("GET", f"/v1/sessions/{sid}/events") as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            assert response.headers["cache-control"] == "no-store"

            async def read() -> None:
                async for line in response.aiter_lines():
                    lines.append(line)

            reading = asyncio.create_task(read())
            await post(client, sid, "hello")
            await asyncio.sleep(1.0)
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)

    first, *frames = "\n".join(lines).split("\n\n")
    assert first == "retry: 1234"
    # A heartbeat may come before the turn's first event (the beat does not wait for the POST).
    events = [frame.split("\n") for frame in frames if not frame.startswith(": ping")]
    assert events[0][:2] == ["id: 1", "event: turn_start"]
    assert events[0][2].startswith('data: {"type":"turn_start","seq":1,')
    # A comment every 0.2 s, events or not: proxies with idle timeouts keep the connection.
    assert sum(frame.startswith(": ping") for frame in frames) >= 3
