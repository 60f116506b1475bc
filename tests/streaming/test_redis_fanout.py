"""The Redis relay (app.streaming.redis.relay) in one process: two replicas' event stacks (write-behind,
broker, relay, wired as app.main wires them) over one migrated SQLite file and a real Redis, the events
written by one and streamed by the other. Multi-process proofs: tests/fanout/."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import redis.asyncio

from app.protocol.events import AgentStatus
from app.runtime import build_event_log
from app.settings import Settings
from app.storage import event_log
from app.storage.engine import Database
from app.streaming.broker import Broker, Subscription
from app.streaming.frames import Frame
from app.streaming.log.write_behind import WriteBehind
from app.streaming.redis.entries import STREAM_TTL, pack, unpack
from app.streaming.redis.relay import RedisRelay
from tests.support.redis import REDIS_URL, RedisServer, own_redis, redis_prefix
from tests.support.rows import add_sessions

pytestmark = pytest.mark.anyio
__all__ = ["own_redis", "redis_prefix"]  # fixtures

SID = "s_relay"


@dataclass
class Replica:
    database: Database
    writer: WriteBehind
    broker: Broker
    relay: RedisRelay | None

    def publish(self, count: int) -> None:
        events = self.writer.publisher(SID)
        for _ in range(count):
            events.emit(AgentStatus, status="thinking")

    async def close(self) -> None:
        await self.writer.stop()
        if self.relay is not None:
            await self.relay.stop()
        self.broker.close_all()
        await self.database.dispose()


async def replica(database_url: str, redis_url: str | None, prefix: str) -> Replica:
    settings = Settings(database_url=database_url, redis_url=redis_url, redis_prefix=prefix)
    database = Database(database_url)
    writer, broker, relay = build_event_log(settings, database)
    writer.start()
    if relay is not None:
        await relay.start()
    return Replica(database, writer, broker, relay)


@pytest.fixture
async def pair(database_url: str, redis_prefix: str) -> AsyncIterator[tuple[Replica, Replica]]:
    a = await replica(database_url, REDIS_URL, redis_prefix)
    b = await replica(database_url, REDIS_URL, redis_prefix)
    await add_sessions(a.database, SID)
    yield a, b
    await a.close()
    await b.close()


class Reader:
    """A subscription's frames so far (its replay first)."""

    def __init__(self, subscription: Subscription) -> None:
        self.subscription = subscription
        self.frames: list[Frame] = list(subscription.replay)

    async def until(self, count: int, within: float = 5.0) -> list[Frame]:
        """The frames once there are `count` of them."""
        async with asyncio.timeout(within):
            while len(self.frames) < count:
                batch = await self.subscription.subscriber.next_batch()
                assert batch is not None, "the stream ended"
                self.frames.extend(batch)
        return list(self.frames)


async def reconnected(relay: RedisRelay, within: float = 5.0) -> None:
    for _ in range(int(within / 0.05)):
        if relay.connected:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the relay did not reconnect within {within} s")


async def logged(database: Database) -> list[tuple[int, str, str, str | None]]:
    async with database.session() as db:
        return await event_log.events_between(db, SID, 0, 1_000_000)


async def test_events_written_on_one_replica_stream_on_another_as_logged(
    pair: tuple[Replica, Replica], redis_prefix: str
) -> None:
    """B writes, A streams: A's subscriber gets every event, contiguous, byte for byte what the log holds;
    one that resumes mid-way on A gets the rest from its position with nothing twice. Each session's
    Redis stream carries the seq as its id and expires (no idle session leaks)."""
    a, b = pair
    live = Reader(await a.broker.subscribe(SID, 0))
    b.publish(30)
    first = await live.until(30)
    resumed = Reader(await a.broker.subscribe(SID, 10))
    b.publish(20)
    rest = await resumed.until(40)
    everything = await live.until(50)
    rows = await logged(b.database)
    assert [(f.seq, f.type, f.data, f.turn) for f in everything] == rows
    assert [f.seq for f in first] == list(range(1, 31))
    assert [(f.seq, f.data) for f in rest] == [(s, d) for s, _, d, _ in rows[10:]]
    client = redis.asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        key = f"{redis_prefix}:events:{SID}"
        entries: list[tuple[str, dict[str, str]]] = await client.xrange(key) or []  # type: ignore[assignment]
        # One entry per run of consecutive events, its id the run's last seq: 50 events, fewer entries.
        unpacked = [f for id_, fields in entries for f in unpack(id_, fields)]
        assert [(f.seq, f.type, f.data, f.turn) for f in unpacked] == rows
        assert [f.seq for f in unpacked] == list(range(1, 51))
        assert len(entries) < 50
        assert 0 < await client.ttl(key) <= STREAM_TTL
    finally:
        await client.aclose()


async def test_a_hole_in_what_redis_brings_is_filled_from_the_log(
    database_url: str, pair: tuple[Replica, Replica]
) -> None:
    """Events committed by a writer that never published them (as when Redis was away at its publish)
    and then events that were published: the reader sees a hole before the first published one, holds
    it, fills the hole from the log and delivers all in order, long before its periodic sweep (5 s)."""
    a, b = pair
    live = Reader(await a.broker.subscribe(SID, None))
    silent = await replica(database_url, None, "unused")
    try:
        silent.publish(7)
        await silent.writer.flush()
    finally:
        await silent.close()
    b.publish(3)
    frames = await live.until(10, within=2.0)
    assert [f.seq for f in frames] == list(range(1, 11))
    assert [(f.seq, f.type, f.data, f.turn) for f in frames] == await logged(a.database)


async def test_a_slow_sweep_of_the_log_holds_up_no_live_frame(database_url: str, redis_prefix: str) -> None:
    """The periodic sweep (every watched channel against the log's head) reads the log beside the reader,
    not in its loop: while a sweep's read takes a second, frames published meanwhile still arrive at
    once (in the reader's loop they waited for the sweep: every five seconds, 20-70 ms at load)."""
    settings = Settings(database_url=database_url, redis_url=REDIS_URL, redis_prefix=redis_prefix)
    database = Database(database_url)
    writer, broker, relay = build_event_log(settings, database)
    assert relay is not None
    sweeping, sweeps = asyncio.Event(), [0]
    load_heads = relay._load_heads

    async def slow_heads(session_ids: list[str]) -> dict[str, int]:
        sweeps[0] += 1
        sweeping.set()
        await asyncio.sleep(1.0)
        return await load_heads(session_ids)

    relay._load_heads, relay._sweep_interval = slow_heads, 0.05
    writer.start()
    await relay.start()
    a = Replica(database, writer, broker, relay)
    b = await replica(database_url, REDIS_URL, redis_prefix)
    try:
        await add_sessions(a.database, SID)
        live = Reader(await a.broker.subscribe(SID, None))
        await asyncio.wait_for(sweeping.wait(), 2.0)
        during = sweeps[0]
        b.publish(5)
        frames = await live.until(5, within=0.5)
        assert sweeps[0] == during  # no other sweep began: the first one is still reading
        assert [f.seq for f in frames] == [1, 2, 3, 4, 5]
    finally:
        await b.close()
        await a.close()


async def test_without_redis_streams_poll_the_log_and_recover(
    database_url: str, own_redis: RedisServer
) -> None:
    """Redis killed (its data lost) while B writes: A's stream still gets every event, from the log, and
    once Redis is back (empty) live delivery resumes; nothing missing, nothing twice."""
    a = await replica(database_url, own_redis.url, "p")
    b = await replica(database_url, own_redis.url, "p")
    try:
        await add_sessions(a.database, SID)
        live = Reader(await a.broker.subscribe(SID, None))
        b.publish(5)
        await live.until(5)
        await asyncio.to_thread(own_redis.stop)
        b.publish(5)
        await live.until(10, within=5.0)
        assert a.relay is not None and not a.relay.connected
        await asyncio.to_thread(own_redis.start)
        await reconnected(a.relay)
        b.publish(5)
        frames = await live.until(15, within=5.0)
        assert [f.seq for f in frames] == list(range(1, 16))
        assert [(f.seq, f.type, f.data, f.turn) for f in frames] == await logged(a.database)
    finally:
        await a.close()
        await b.close()


def test_a_batch_packs_into_one_entry_per_run_of_consecutive_events() -> None:
    """Runs split where a seq is skipped (another replica logged it) and around a frame whose data holds
    a newline; each entry's id is its run's last seq, and unpacking gives back every frame as it was."""
    delta = [Frame(seq, "text_delta", f'{{"n":{seq}}}') for seq in (3, 4, 5, 7, 8)]
    assert [seq for seq, _ in pack(delta)] == [5, 8]
    frames = [*delta[:3], Frame(6, "other", "a\nb"), *delta[3:], Frame(9, "turn_done", "{}")]
    entries = list(pack(frames))
    assert [seq for seq, _ in entries] == [5, 6, 9]
    assert [f for seq, fields in entries for f in unpack(f"{seq}-0", fields)] == frames


def test_a_turns_edges_keep_their_turn_through_an_entry() -> None:
    """A turn_start or turn_done keeps its `turn` through Redis, alone or within a run (the other frames
    of the run keep None); a run without an edge carries no turn field at all (text deltas pay nothing),
    and an entry written without one (an older replica) unpacks with no turn."""
    frames = [
        Frame(1, "turn_start", '{"a":1}', "t_1"),
        Frame(2, "text_delta", '{"b":2}'),
        Frame(3, "turn_done", '{"c":3}', "t_1"),
        Frame(4, "other", "x\ny"),
        Frame(5, "turn_start", '{"d":5}', "t_2"),
        Frame(7, "text_delta", '{"e":7}'),
    ]
    entries = list(pack(frames))
    assert [f for seq, fields in entries for f in unpack(f"{seq}-0", fields)] == frames
    assert [("u" in fields) for _, fields in entries] == [True, False, True, False]
    assert unpack("3-0", {"t": "turn_start\nturn_done", "d": "{}\n{}"}) == [
        Frame(2, "turn_start", "{}"),
        Frame(3, "turn_done", "{}"),
    ]
