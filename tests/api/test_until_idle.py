"""`?until_idle=true`: the event stream ends once the session is idle and the stream has caught up, so that
a client that reads a stream to its end (a script, schemathesis's stateful phase) stops. Over a real
socket; each test proves that nothing is cut off: the stream's last event is the history's last event
(`last_event_id`), read after the stream ended."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from app.settings import Settings
from tests.support.server import LiveServer, live_server

pytestmark = pytest.mark.anyio


async def _read_to_end(client: httpx.AsyncClient, url: str, **params: str) -> list[dict[str, object]]:
    """Every NDJSON event until the server ends the stream (a 30 s read timeout fails a stream that hangs)."""
    events: list[dict[str, object]] = []
    query = {"format": "ndjson", "until_idle": "true", **params}
    async with client.stream("GET", url, params=query, timeout=30) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line:
                events.append(json.loads(line))
    return events


async def _last_event_id(client: httpx.AsyncClient, sid: str) -> int:
    page = (await client.get(f"/v1/sessions/{sid}/messages")).json()
    return int(page["last_event_id"])


async def test_an_idle_session_ends_at_once_and_a_replay_ends_after_its_last_event(
    server: LiveServer,
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        url = f"/v1/sessions/{sid}/events"
        assert await _read_to_end(client, url) == []
        posted = await client.post(
            f"/v1/sessions/{sid}/messages", params={"wait": "true"}, json={"content": "hi"}
        )
        assert posted.status_code == 200
        replayed = await _read_to_end(client, url, after="0")
        assert [event["seq"] for event in replayed] == list(range(1, await _last_event_id(client, sid) + 1))
        assert "turn_done" in {event["type"] for event in replayed}
        assert await _read_to_end(client, url, after=str(replayed[-1]["seq"])) == []


async def test_a_stream_opened_during_a_turn_ends_after_its_turn_done(settings: Settings) -> None:
    """The live status turns idle just before the turn_done commits: the stream must still send it."""
    slow = settings.model_copy(update={"demo_token_delay": 0.003})
    with live_server(slow) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            sid = (await client.post("/v1/sessions", json={})).json()["id"]
            url = f"/v1/sessions/{sid}/events"
            for _ in range(3):
                posted = await client.post(f"/v1/sessions/{sid}/messages", json={"content": "[long] a story"})
                assert posted.status_code == 202
                await asyncio.sleep(0.05)
                events = await _read_to_end(client, url)
                types = [event["type"] for event in events]
                assert "turn_done" in types, types
                assert events[-1]["seq"] == await _last_event_id(client, sid)
                turn_ids = {event.get("turn_id") for event in events if event["type"] == "turn_done"}
                assert posted.json()["turn_id"] in turn_ids
