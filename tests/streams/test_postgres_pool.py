"""Many open event streams against a small PostgreSQL pool (aegra#423 is the failure this guards against):
no stream holds a database session, so with 200 streams open on a pool of two connections every other
endpoint keeps answering, a turn streams to all of them, and the database never sees more than the pool's
connections from the server.

If a stream held its session, the third stream to open would wait for a connection and fail after the pool
timeout (a 503), and so would every request after it: the test would see streams that never open and 503s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import httpx
import pytest

from app.settings import Settings
from tests.support.client import new_session, post
from tests.support.postgres import ScratchDatabase
from tests.support.server import LiveServer, live_server
from tests.support.stream import Frame, StreamClient

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SESSIONS = 10
STREAMS_PER_SESSION = 20
POOL = 2


@pytest.fixture
def server(postgres_database: ScratchDatabase) -> Iterator[LiveServer]:
    settings = Settings(
        database_url=postgres_database.url,
        demo_token_delay=0.002,
        database_pool_size=POOL,
        database_max_overflow=0,
        max_streams_per_principal=0,
    )
    with live_server(settings) as running:
        yield running


def server_connections(database: ScratchDatabase) -> int:
    with database.connect() as conn:
        found = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (database.name,),
        ).fetchone()
    return int(str(found[0])) if found else 0


def read(
    stream: StreamClient, until: Callable[[Frame], bool], opened: asyncio.Event
) -> Coroutine[Any, Any, str]:
    return stream.read(until, seconds=180, params={"after": "0"}, opened=opened)


async def test_two_hundred_open_streams_on_a_pool_of_two_leave_every_endpoint_answering(
    server: LiveServer, postgres_database: ScratchDatabase
) -> None:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30, limits=limits) as client:
        sids = [await new_session(client) for _ in range(SESSIONS)]
        await post(client, sids[0], "what is 2+3*4?")  # a history to replay
        streams = [StreamClient(client, sid) for sid in sids for _ in range(STREAMS_PER_SESSION)]
        opened = [asyncio.Event() for _ in streams]
        # Every stream replays the log from the start (a database read), then stays open, live.
        reads: list[asyncio.Task[str]] = []
        # They open in waves of one session's watchers (opening is a few short reads each; a burst of 200 at
        # once would queue on two connections, which is the pool's throughput, not what this test is about).
        async with asyncio.timeout(90):
            for wave in range(SESSIONS):
                part = slice(wave * STREAMS_PER_SESSION, (wave + 1) * STREAMS_PER_SESSION)
                for stream, event in zip(streams[part], opened[part], strict=True):
                    done = stream.turns_done(2 if stream.session_id == sids[0] else 1)
                    reads.append(asyncio.create_task(read(stream, done, event)))
                await asyncio.gather(*(o.wait() for o in opened[part]))

        # All 200 open: the other endpoints answer, reading and writing.
        assert (await client.get("/v1/sessions")).status_code == 200
        assert (await client.get(f"/v1/sessions/{sids[0]}/messages")).status_code == 200
        assert (await client.get("/readyz")).status_code == 200
        for sid in sids:  # a turn in every session, streamed to its 20 watchers
            await post(client, sid, "what time is it?")
        assert (await client.post("/v1/sessions", json={})).status_code == 201
        connections = server_connections(postgres_database)
        outcomes = await asyncio.gather(*reads)

    assert outcomes == ["matched"] * len(streams)
    for stream in streams:
        assert stream.types().count("turn_done") == (2 if stream.session_id == sids[0] else 1)
    assert connections <= POOL
