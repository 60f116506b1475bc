"""The control channel (app.streaming.redis.control_bus) between three replicas in one process, over a real
Redis:
a request is answered by the one replica that can act on it, a notice reaches every other one, and a
request nobody can act on (or that cannot be sent) returns None rather than hanging."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.streaming.redis.control_bus import ControlBus
from tests.support.redis import REDIS_URL, RedisServer, own_redis, redis_prefix

pytestmark = pytest.mark.anyio
__all__ = ["own_redis", "redis_prefix"]  # fixtures


class Replica:
    """A bus whose handler acts only for the sessions it "runs", and notes everything it heard."""

    def __init__(self, url: str, prefix: str, runs: set[str]) -> None:
        self.runs = runs
        self.heard: list[tuple[str, str]] = []
        self.bus = ControlBus(url, prefix, self.handle)

    async def handle(self, op: str, session_id: str, args: dict[str, Any]) -> dict[str, Any] | None:
        self.heard.append((op, session_id))
        if op == "cancel" and session_id in self.runs:
            return {"stopped_by": self.bus.replica_id, **args}
        return None


@pytest.fixture
async def replicas(redis_prefix: str) -> AsyncIterator[list[Replica]]:
    found = [Replica(REDIS_URL, redis_prefix, runs) for runs in ({"s_a"}, {"s_b"}, set())]
    for replica in found:
        await replica.bus.start()
    yield found
    for replica in found:
        await replica.bus.stop()


async def test_a_request_is_answered_by_the_replica_that_runs_the_session(replicas: list[Replica]) -> None:
    """The third replica asks for a cancel of s_b: only the second runs it and answers (its answer comes
    back whole, within milliseconds); every other replica heard the request, the asker did not."""
    a, b, asker = replicas
    started = time.monotonic()
    answer = await asker.bus.request("cancel", "s_b", {"clear_queue": True}, timeout=5)
    assert time.monotonic() - started < 1.0
    assert answer == {"stopped_by": b.bus.replica_id, "clear_queue": True}
    assert ("cancel", "s_b") in a.heard and ("cancel", "s_b") in b.heard
    assert asker.heard == []


async def test_a_notice_reaches_every_other_replica(replicas: list[Replica]) -> None:
    a, b, teller = replicas
    await teller.bus.notify("deleted", "s_x", {})
    async with asyncio.timeout(2):
        while ("deleted", "s_x") not in a.heard or ("deleted", "s_x") not in b.heard:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert teller.heard == []


async def test_a_request_nobody_acts_on_returns_none_after_its_timeout(replicas: list[Replica]) -> None:
    asker = replicas[2]
    started = time.monotonic()
    assert await asker.bus.request("cancel", "s_nobody", {}, timeout=0.3) is None
    assert 0.3 <= time.monotonic() - started < 2.0


async def test_without_redis_a_request_returns_none_at_once_and_listening_resumes(
    own_redis: RedisServer,
) -> None:
    """Redis gone: a request is not sent and returns None without waiting for its timeout; once Redis is
    back each replica subscribes again by itself and requests are answered."""
    owner, asker = Replica(own_redis.url, "p", {"s_a"}), Replica(own_redis.url, "p", set())
    await owner.bus.start()
    await asker.bus.start()
    try:
        await asyncio.to_thread(own_redis.stop)
        started = time.monotonic()
        assert await asker.bus.request("cancel", "s_a", {}, timeout=5) is None
        assert time.monotonic() - started < 2.0
        await asyncio.to_thread(own_redis.start)
        answer = None
        for _ in range(40):
            answer = await asker.bus.request("cancel", "s_a", {}, timeout=0.25)
            if answer is not None:
                break
        assert answer == {"stopped_by": owner.bus.replica_id}
    finally:
        await owner.bus.stop()
        await asker.bus.stop()
