"""Redis killed and restarted (empty) in the middle of a turn, under two replica processes: a redis-server
of the test's own on a free port, kill -9 and a fresh start on the same port. PostgreSQL is the truth,
so streams lose nothing: while Redis is away the replica that does not run the turn polls the log, and
once Redis is back it reads the streams again (its metric says so) without any client doing anything
but the normal reconnect."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fakes.directive import bench_content
from tests.fakes.upstream import FakeUpstream
from tests.fanout.conftest import STARTUP_SECONDS, Cluster, replica_env
from tests.support.client import new_session, post
from tests.support.postgres import ScratchDatabase
from tests.support.process import ServerProcess
from tests.support.redis import RedisServer, own_redis
from tests.support.stream import StreamClient, assert_contiguous

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
__all__ = ["own_redis"]  # fixture


@pytest.fixture
def cluster(
    fanout_database: ScratchDatabase, fanout_upstream: FakeUpstream, own_redis: RedisServer, tmp_path: Path
) -> Iterator[Cluster]:
    env = replica_env(tmp_path, fanout_database.url, own_redis.url, "outage", fanout_upstream)
    env["PARLEY_METRICS"] = "1"
    a, b = ServerProcess(env, tmp_path / "a.log"), ServerProcess(env, tmp_path / "b.log")
    try:
        # The model layer loads in each (seconds on a busy 2-core machine) before /readyz says ready.
        a.start(timeout=STARTUP_SECONDS)
        b.start(timeout=STARTUP_SECONDS)
        yield Cluster(fanout_database, fanout_upstream, a, b, own_redis.url, "outage")
    finally:
        a.kill()
        b.kill()


async def redis_gauge(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    line = next(x for x in text.splitlines() if x.startswith("parley_fanout_redis_connected "))
    return float(line.split()[1])


async def test_redis_killed_and_restarted_mid_turn_loses_nothing(
    cluster: Cluster, own_redis: RedisServer
) -> None:
    """The turn runs on B; one stream stays on A, another hops from B to A while Redis is down. Both keep
    receiving during the outage (from the log), both end with exactly the log's frames, A's gauge goes
    0 then back to 1, and a turn after the restart streams to A live again."""
    a, b = (httpx.AsyncClient(base_url=r.base_url, timeout=30) for r in (cluster.a, cluster.b))
    async with a, b:
        sid = await new_session(b)
        staying, hopping = StreamClient(a, sid), StreamClient(b, sid)
        opened = [asyncio.Event(), asyncio.Event()]
        stay = asyncio.create_task(staying.read(staying.turns_done(2), seconds=90, opened=opened[0]))
        first_hop = asyncio.create_task(hopping.read(seconds=60, opened=opened[1]))
        for event in opened:
            await event.wait()
        assert await redis_gauge(a) == 1
        await post(b, sid, bench_content("outage", chunks=400, delay_ms=10))
        await staying.wait(lambda frames: sum(f.event == "text_delta" for f in frames) >= 20)
        await asyncio.to_thread(own_redis.stop)
        before_outage = len(staying.frames)
        first_hop.cancel()
        await asyncio.gather(first_hop, return_exceptions=True)
        hopping.client = a  # its normal reconnect, with Last-Event-ID, to the other replica
        hop = asyncio.create_task(hopping.read(hopping.turns_done(2), seconds=90))
        await staying.wait(lambda frames: len(frames) >= before_outage + 30, seconds=10)
        assert await redis_gauge(a) == 0
        await asyncio.to_thread(own_redis.start)
        await staying.wait(lambda frames: any(f.event == "turn_done" for f in frames), seconds=30)
        for _ in range(100):
            if await redis_gauge(a) == 1:
                break
            await asyncio.sleep(0.1)
        assert await redis_gauge(a) == 1
        await post(b, sid, bench_content("after", chunks=20, delay_ms=10))
        assert await stay == "matched"
        assert await hop == "matched"
    log = [(f.id, f.event, f.data) for f in staying.frames]
    assert_contiguous(staying.frames, first=staying.frames[0].id)
    assert log == cluster.logged(sid)[staying.frames[0].id - 1 :]
    assert_contiguous(hopping.frames, first=hopping.frames[0].id)
    assert [(f.id, f.event, f.data) for f in hopping.frames] == cluster.logged(sid)[
        hopping.frames[0].id - 1 :
    ]
    assert hopping.connects == 2


async def test_a_replica_stops_promptly_on_sigterm_with_redis_away(
    cluster: Cluster, own_redis: RedisServer
) -> None:
    """SIGTERM with a stream open and Redis killed: the replica's stream ends, its last publish and its
    Redis connections give up at once instead of hanging the exit, and it exits cleanly well within its
    shutdown time (5 s) plus a margin; the other replica is untouched and keeps serving."""
    a, b = (httpx.AsyncClient(base_url=r.base_url, timeout=30) for r in (cluster.a, cluster.b))
    async with a, b:
        sid = await new_session(a)
        watcher = StreamClient(a, sid)
        opened = asyncio.Event()
        reading = asyncio.create_task(watcher.read(seconds=60, opened=opened))
        await opened.wait()
        await asyncio.to_thread(own_redis.stop)
        seconds = await asyncio.to_thread(cluster.a.terminate)
        assert await reading in ("ended", "broken")
        assert (await b.get(f"/v1/sessions/{sid}")).status_code == 200
    assert cluster.a.returncode in (0, -15), cluster.a.log()[-2000:]  # uvicorn re-raises SIGTERM
    assert seconds < 10
