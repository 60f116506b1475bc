"""The stream's framing on the wire: `retry:` first, `id:`/`event:`/`data:` per event, heartbeat comments."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from app.settings import Settings
from tests.streams.conftest import new_session, post
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

    assert lines[:2] == ["retry: 1234", ""]
    assert lines[2:5] == ["id: 1", "event: turn_start", lines[4]]
    assert lines[4].startswith('data: {"type":"turn_start","seq":1,')
    # A comment every 0.2 s, events or not: proxies with idle timeouts keep the connection.
    assert sum(line.startswith(": ping") for line in lines) >= 3
