"""The fan-out's publisher (app.streaming.redis.publish) against the machine's Redis: batches are written
without waiting for earlier replies, land in order, survive duplicates, and a killed connection costs
only what was in flight (the log has it; readers fill holes, tests/streaming/test_redis_fanout.py)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import redis.asyncio
from redis.exceptions import RedisError

from app.streaming.redis.publish import RedisPublisher, xadd
from tests.support.redis import REDIS_URL, redis_prefix

pytestmark = pytest.mark.anyio
__all__ = ["redis_prefix"]  # fixture


def batch(key: str, seqs: range) -> list[tuple[object, ...]]:
    return [xadd(key, seq, {"t": "e", "d": str(seq)}, 1000) for seq in seqs]


async def ids(client: redis.asyncio.Redis, key: str) -> list[int]:
    entries: list[tuple[str, dict[str, str]]] = await client.xrange(key) or []  # type: ignore[assignment]
    return [int(entry_id.partition("-")[0]) for entry_id, _ in entries]


async def test_batches_go_out_before_earlier_replies_and_land_in_order(redis_prefix: str) -> None:
    """With Redis paused no reply can come, yet every send returns and all ten batches are owed; once it
    resumes they are applied in the order sent. A duplicate's error reply is skipped, not taken for the
    next batch's."""
    key = f"{redis_prefix}:events:s_pub"
    publisher = RedisPublisher(REDIS_URL, f"{redis_prefix}:fanout-publish")
    client = redis.asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        await publisher.connect()
        await client.client_pause(1000, all=True)
        for n in range(10):
            await publisher.send(batch(key, range(10 * n + 1, 10 * n + 11)))
        owed = sum(count for _, count in publisher._owed)
        await client.client_unpause()
        await asyncio.wait_for(publisher.drained(), 10)
        await publisher.send(batch(key, range(95, 105)))  # 95..100 are duplicates, refused
        await publisher.send(batch(key, range(105, 111)))
        await asyncio.wait_for(publisher.drained(), 10)
        assert await ids(client, key) == list(range(1, 111))
    finally:
        await client.client_unpause()
        await publisher.close()
        await client.aclose()
    assert owed == 100
    assert publisher.failures == 0


async def test_a_killed_connection_costs_only_what_was_in_flight(redis_prefix: str) -> None:
    """The publisher's connection killed by the server between batches: the next batch may be lost with
    it (the log has its frames), the one after goes out on a new connection, in order."""
    key = f"{redis_prefix}:events:s_kill"
    name = f"{redis_prefix}:fanout-publish"
    publisher = RedisPublisher(REDIS_URL, name)
    client = redis.asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        await publisher.send(batch(key, range(1, 11)))
        await asyncio.wait_for(publisher.drained(), 10)
        (mine,) = [c for c in await client.client_list() if c["name"] == name]
        await client.client_kill_filter(_id=mine["id"])
        for n in range(1, 50):  # until the publisher notices: its write or the reply to it fails
            with contextlib.suppress(RedisError, OSError):
                await publisher.send(batch(key, range(10 * n + 1, 10 * n + 11)))
            await asyncio.sleep(0.01)
            if publisher.failures:
                break
        await publisher.send(batch(key, range(1001, 1011)))
        await asyncio.wait_for(publisher.drained(), 10)
        logged = await ids(client, key)
        names = [c["name"] for c in await client.client_list()]
    finally:
        await publisher.close()
        await client.aclose()
    assert publisher.failures >= 1
    assert logged[:10] == list(range(1, 11)) and logged[-10:] == list(range(1001, 1011))
    assert logged == sorted(set(logged))  # in order, nothing twice
    assert names.count(name) == 1  # the dropped connection is gone, one new one in its place
