"""The limits counted in Redis: two instances on one prefix stand for two replicas (tests/replicas drives
real replica processes). Each test has a prefix of its own on the machine's Redis; the outage ones point
at a port nothing listens on."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

import pytest
import redis

from app.chat.limits import StreamSlots
from app.chat.redis_limits import RedisMessageRate, RedisStreamSlots, redis_limits
from app.errors import TooManyRequests
from app.observability.hooks import activate
from app.observability.metrics import Metrics
from tests.support.redis import REDIS_URL, redis_prefix
from tests.support.server import free_port

pytestmark = pytest.mark.anyio
__all__ = ["redis_prefix"]  # fixture


def pair(
    prefix: str, per_minute: int = 3, streams: int = 2, lifetime: float = 30.0, url: str = REDIS_URL
) -> list[tuple[RedisMessageRate, RedisStreamSlots]]:
    """Two replicas' limits on one Redis and prefix."""
    return [
        redis_limits(url, prefix, per_minute, streams, lifetime=lifetime, renew_every=lifetime / 3)
        for _ in range(2)
    ]


async def refused(attempt: Awaitable[object]) -> TooManyRequests:
    with pytest.raises(TooManyRequests) as caught:
        await attempt
    return caught.value


async def test_messages_are_counted_across_replicas_with_one_retry_after(redis_prefix: str) -> None:
    (a, a_streams), (b, b_streams) = pair(redis_prefix)
    await a.take("alice")
    await b.take("alice")
    await a.take("alice")
    on_b = await refused(b.take("alice"))
    on_a = await refused(a.take("alice"))
    assert on_a.code == on_b.code == "rate_limited"
    # One bucket, one clock (Redis's): the same wait, 20 s at 3 a minute, unless a second turned between.
    assert on_a.retry_after is not None and on_b.retry_after is not None
    waits = {on_a.retry_after, on_b.retry_after}
    assert waits <= {19, 20} and len(waits) <= 2
    await b.take("bob")  # another principal's own allowance
    for streams in (a_streams, b_streams):
        await streams.close()


async def test_stream_slots_are_counted_across_replicas_and_given_back(redis_prefix: str) -> None:
    (_, a), (_, b) = pair(redis_prefix)
    first = await a.acquire("alice")
    second = await b.acquire("alice")
    error = await refused(a.acquire("alice"))
    assert error.code == "too_many_streams"
    assert await a.open_count("alice") == await b.open_count("alice") == 2
    first.release()
    first.release()  # idempotent
    for _ in range(100):
        if await b.open_count("alice") == 1:
            break
        await asyncio.sleep(0.02)
    assert await b.open_count("alice") == 1
    third = await b.acquire("alice")
    await refused(a.acquire("alice"))
    second.release()
    third.release()
    await a.close()
    await b.close()
    with redis.Redis.from_url(REDIS_URL) as client:
        assert client.zcard(f"{redis_prefix}:limit:streams:alice") == 0


async def test_a_dead_replicas_slots_expire_and_a_live_ones_are_renewed(redis_prefix: str) -> None:
    """The dead replica's keeper ends (as kill -9 would end it) without releasing: its slot stops
    counting after its lifetime, while the live replica's slot, renewed, still counts."""
    (_, dead), (_, live) = pair(redis_prefix, lifetime=2.0)
    await dead.acquire("alice")
    kept = await live.acquire("alice")
    dead._closing = True  # its keeper ends without releasing anything
    dead._wake.set()
    await asyncio.sleep(5)  # the dead slot's 2 s lifetime, with room; the live one renewed meanwhile
    assert await live.open_count("alice") == 1
    await live.acquire("alice")  # the dead one's slot was freed
    await refused(live.acquire("alice"))
    kept.release()
    await live.close()
    await dead._store.client.aclose()


async def test_without_redis_the_limits_count_in_the_process_and_say_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis unreachable: nothing fails with a 5xx; messages and streams are let through up to this
    process's own count (then 429 as a single server gives), each decision counted in the metric, and the
    outage logged once."""
    metrics = Metrics()
    activate(metrics)
    try:
        (rate, streams), _ = pair("parley-test-away", url=f"redis://127.0.0.1:{free_port()}/0")
        with caplog.at_level(logging.WARNING, logger="app.chat.redis_limits"):
            for _ in range(3):
                await rate.take("alice")
            assert (await refused(rate.take("alice"))).code == "rate_limited"
            leases = [await streams.acquire("alice"), await streams.acquire("alice")]
            assert (await refused(streams.acquire("alice"))).code == "too_many_streams"
            assert await streams.open_count("alice") == 2
            for lease in leases:
                lease.release()
        warnings = [r.getMessage() for r in caplog.records if "Redis unreachable" in r.getMessage()]
        assert len(warnings) == 1
        away = "parley_limits_redis_unavailable_total"
        assert metrics.registry.get_sample_value(away, {"limit": "messages"}) == 4
        assert metrics.registry.get_sample_value(away, {"limit": "streams"}) == 3
        await streams.close()
    finally:
        activate(None)


async def test_no_limit_asks_nothing_of_redis() -> None:
    """0 means no limit: a replica with limits off never touches Redis for them (an unreachable one here)."""
    away = f"redis://127.0.0.1:{free_port()}/0"
    (rate, streams), _ = pair("parley-test-off", per_minute=0, streams=0, url=away)
    for _ in range(100):
        await rate.take("alice")
    lease = await streams.acquire("alice")
    assert isinstance(streams._local, StreamSlots) and await streams.open_count("alice") == 1
    lease.release()
    assert not streams._store._down
    await streams.close()
