"""The event log across restarts: resume from the database, retention, and resync when a position is gone."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence

import httpx
import pytest

from app.settings import Settings
from app.streaming.frames import Frame
from app.streaming.log.retention import Retention
from tests.support.client import LONG, new_session, post
from tests.support.server import live_server
from tests.support.stream import StreamClient, assert_contiguous

pytestmark = pytest.mark.anyio

RETENTION = 40


def logged_seqs(settings: Settings, session_id: str) -> list[int]:
    path = settings.database_url.split("///", 1)[1]
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT seq FROM events WHERE session_id = ? ORDER BY seq", (session_id,))
        return [int(seq) for (seq,) in rows]


async def first_turn(client: httpx.AsyncClient, sid: str, content: str) -> StreamClient:
    stream = StreamClient(client, sid)
    opened = asyncio.Event()
    reading = asyncio.create_task(stream.read_until_type("turn_done", opened=opened))
    await opened.wait()
    await post(client, sid, content)
    await reading
    return stream


async def test_a_stream_resumes_from_the_log_after_a_restart(settings: Settings) -> None:
    with live_server(settings) as first:
        async with httpx.AsyncClient(base_url=first.base_url, timeout=30) as client:
            sid = await new_session(client)
            full = await first_turn(client, sid, "what time is it? and 2+3*4")
            # A client still connected when the server stops sees its stream end, not break.
            lingering = StreamClient(client, sid)
            opened = asyncio.Event()
            lingering_read = asyncio.create_task(lingering.read(seconds=30, opened=opened))
            await opened.wait()
            first.drain()
            assert await lingering_read == "ended"
            # Until the process is gone, a new stream is refused (the client retries elsewhere).
            refused = await client.get(f"/v1/sessions/{sid}/events")
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "shutting_down"

    with live_server(settings) as second:
        async with httpx.AsyncClient(base_url=second.base_url, timeout=30) as client:
            resumed = StreamClient(client, sid, frames=full.frames[:5])
            opened = asyncio.Event()
            reading = asyncio.create_task(resumed.read(resumed.turns_done(2), seconds=30, opened=opened))
            await opened.wait()
            await post(client, sid, "thanks")
            assert await reading == "matched"
    assert resumed.frames[: len(full.frames)] == full.frames  # replayed from the database, byte for byte
    assert_contiguous(resumed.frames)
    assert resumed.types()[len(full.frames)] == "turn_start"


async def test_the_log_keeps_the_newest_events_and_older_positions_resync(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    tuned = settings.model_copy(update={"event_retention": RETENTION})
    trims: list[list[tuple[str, int]]] = []
    cutoffs = Retention.cutoffs

    def counted(
        self: Retention, events: Sequence[tuple[str, Frame]], *, exact: bool
    ) -> list[tuple[str, int]]:
        found = cutoffs(self, events, exact=exact)
        if found:
            trims.append(found)
        return found

    # The server runs in this process (a thread): every commit that logs events asks the patched method
    # what to trim (a turn's own write, a batch on either path of streaming.log.write_behind).
    monkeypatch.setattr(Retention, "cutoffs", counted)
    with live_server(tuned) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            sid = await new_session(client)
            full = await first_turn(client, sid, LONG)
            head = full.last_id
            assert head is not None and head > 10 * RETENTION
            # Trimmed in batches once a tenth more than the retention piled up (and exactly by the
            # turn's own writes), never once per event.
            assert 1 <= len(trims) < head / (RETENTION // 10)
            assert all(keep_after <= head - RETENTION for batch in trims for _, keep_after in batch)
            # At the turn's end the log holds exactly the newest RETENTION events.
            assert logged_seqs(tuned, sid) == list(range(head - RETENTION + 1, head + 1))

            oldest_kept = head - RETENTION  # the oldest position that can still be replayed
            from_memory = StreamClient(client, sid)
            # Read until the head arrives, not for a fixed time: a busy machine may take a while.
            outcome = await from_memory.read(
                lambda f: f.id == head, seconds=20, params={"after": str(oldest_kept)}
            )
            assert outcome == "matched"
            assert from_memory.frames == full.frames[-RETENTION:]

            gone = StreamClient(client, sid)
            opened = asyncio.Event()
            reading = asyncio.create_task(
                gone.read_until_type("turn_done", params={"after": str(oldest_kept - 1)}, opened=opened)
            )
            await opened.wait()
            await post(client, sid, "hello again")
            await reading

    resync, *live = gone.frames
    assert (resync.event, resync.id) == ("resync", head)
    assert resync.payload["last_event_id"] == head
    assert resync.payload["reason"] == "expired"
    assert_contiguous(live, head + 1)

    # After a restart the ring is empty: the same positions are answered from the log alone.
    known = full.frames + live
    assert_contiguous(known)
    new_head = known[-1].id
    with live_server(tuned) as again:
        async with httpx.AsyncClient(base_url=again.base_url, timeout=30) as client:
            from_log = StreamClient(client, sid)
            outcome = await from_log.read(
                lambda f: f.id == new_head, seconds=20, params={"after": str(new_head - RETENTION)}
            )
            assert outcome == "matched"
            assert from_log.frames == known[-RETENTION:]
            expired = StreamClient(client, sid)
            outcome = await expired.read(
                lambda f: f.event == "resync", seconds=20, params={"after": str(new_head - RETENTION - 1)}
            )
            assert outcome == "matched"
            assert [(f.event, f.id) for f in expired.frames] == [("resync", new_head)]
