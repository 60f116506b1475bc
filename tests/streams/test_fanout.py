"""Many subscribers: each gets every event in order; one that reads nothing is cut off, never waited for."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from httpx_sse import EventSource

from app.api import events as events_api
from app.settings import Settings
from tests.support.client import (
    BULKY,
    LONG,
    SOCKET_BUFFER,
    new_session,
    post,
    resume_reading,
    stalling_client,
)
from tests.support.server import LiveServer, live_server
from tests.support.stream import Frame, StreamClient, assert_contiguous

pytestmark = pytest.mark.anyio


async def wait_ready(client: httpx.AsyncClient) -> None:
    """The model layer loaded: turn durations then measure the agent, not the first import."""
    for _ in range(600):
        if (await client.get("/readyz")).status_code == 200:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("the model layer did not load")


def durations(stream: StreamClient) -> list[float]:
    return [float(done["duration_seconds"]) for done in stream.of_type("turn_done")]


async def test_a_subscriber_that_reads_nothing_slows_nobody_and_resumes(small_queues: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=small_queues.base_url, timeout=30) as client:
        await wait_ready(client)
        sid = await new_session(client)
        # One turn with nobody stalled: the pace to compare with.
        alone = StreamClient(client, sid)
        opened = asyncio.Event()
        reading = asyncio.create_task(alone.read_until_type("turn_done", opened=opened))
        await opened.wait()
        await post(client, sid, LONG)
        await reading
        head = alone.last_id
        assert head is not None

        async with (
            stalling_client(small_queues) as slow,
            slow.stream("GET", f"/v1/sessions/{sid}/events") as stalled,
        ):
            assert stalled.status_code == 200
            reader = StreamClient(client, sid)
            opened = asyncio.Event()
            reading = asyncio.create_task(reader.read(reader.turns_done(2), seconds=30, opened=opened))
            await opened.wait()
            await post(client, sid, BULKY)
            await reader.wait(lambda frames: any(f.event == "text_delta" for f in frames))
            session = (await client.get(f"/v1/sessions/{sid}")).json()
            await post(client, sid, BULKY)  # runs as a second turn
            assert await reading == "matched"
            # Only now does the stalled client read: what was buffered for it, then the end of its stream.
            resume_reading(stalled)
            received: list[Frame] = []
            async with asyncio.timeout(10):
                async for sse in EventSource(stalled).aiter_sse():
                    if sse.data:
                        received.append(Frame(int(sse.id), sse.event, sse.data))

        # While the first bulky turn ran, the session said so.
        assert session["agent_status"] in ("thinking", "tool_calling")
        assert session["running_turn_id"] == reader.of_type("turn_start")[0]["turn_id"]
        # The reading client got every event, in order, of both turns.
        assert_contiguous(reader.frames, head + 1)
        assert reader.types().count("turn_done") == 2
        # The agent kept its pace with a client that read nothing.
        baseline = durations(alone)[0]
        assert all(d < baseline * 1.5 + 0.5 for d in durations(reader)), (baseline, durations(reader))
        # The stalled client got a gap-free beginning, then its stream ended before the end...
        assert received == reader.frames[: len(received)]
        assert 0 < len(received) < len(reader.frames)
        # ...and resuming from its last id gives it exactly the rest.
        resumed = StreamClient(client, sid, frames=list(received))
        assert await resumed.read(seconds=1.0) == "timeout"
        assert resumed.frames == reader.frames
        assert resumed.connects == 1


@pytest.mark.both_backends
async def test_every_subscriber_gets_every_event_in_order(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = await new_session(client)
        readers = [StreamClient(client, sid) for _ in range(5)]
        events = [asyncio.Event() for _ in readers]
        reading = [
            asyncio.create_task(r.read(r.turns_done(2), seconds=30, opened=e))
            for r, e in zip(readers, events, strict=True)
        ]
        for e in events:
            await e.wait()
        await post(client, sid, "what time is it? and 2+3*4")
        await readers[0].wait(lambda frames: any(f.event == "turn_done" for f in frames))
        await post(client, sid, "thanks")
        assert await asyncio.gather(*reading) == ["matched"] * len(readers)
    assert_contiguous(readers[0].frames)
    for other in readers[1:]:
        assert other.frames == readers[0].frames


async def test_a_client_that_stops_reading_is_cut_after_the_send_timeout(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """How the send timeout is proven: the principal may hold one stream; a stalled client holds it until
    the server gives up on a send it cannot finish, then the slot is free again and a new stream opens."""
    monkeypatch.setattr(events_api, "SEND_TIMEOUT", 0.5)
    tuned = settings.model_copy(update={"demo_token_delay": 0.002, "max_streams_per_principal": 1})
    with live_server(tuned, send_buffer=SOCKET_BUFFER) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            await wait_ready(client)
            sid = await new_session(client)
            async with (
                stalling_client(server) as slow,
                slow.stream("GET", f"/v1/sessions/{sid}/events") as stalled,
            ):
                assert stalled.status_code == 200
                assert (await client.get(f"/v1/sessions/{sid}/events")).status_code == 429  # slot held
                await post(client, sid, BULKY)  # far more than the socket buffers hold
                freed = False
                for _ in range(200):
                    await asyncio.sleep(0.1)
                    async with client.stream("GET", f"/v1/sessions/{sid}/events") as attempt:
                        if attempt.status_code == 200:
                            freed = True
                            break
                        assert attempt.status_code == 429
                assert freed, "the stalled stream kept its slot for 20 s"
