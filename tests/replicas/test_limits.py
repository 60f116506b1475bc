"""The per-principal limits across real replica processes (issue 16: "limits hold across replicas"):
messages a minute and open streams count every replica's together in Redis; a killed replica's stream
slots free themselves; with Redis away the limits fall back on each process's own count, never a 5xx.

Each replica is started with its own limits (keyless: every request is the one open principal)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import httpx
import pytest

from tests.replicas.conftest import Replicas, clients
from tests.replicas.test_ownership import new_session
from tests.support.redis import RedisServer, own_redis

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
__all__ = ["own_redis"]  # fixture

SLOT_SECONDS = 10


async def post_status(client: httpx.AsyncClient, sid: str) -> httpx.Response:
    return await client.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"})


@asynccontextmanager
async def stream(client: httpx.AsyncClient, sid: str) -> AsyncIterator[httpx.Response]:
    """An event stream held open (its headers arrived) until the block ends."""
    async with client.stream("GET", f"/v1/sessions/{sid}/events") as response:
        yield response


async def test_messages_a_minute_count_every_replica_with_one_retry_after(replicas: Replicas) -> None:
    """3 a minute: three posts spread over A and B are accepted, the fourth is refused on either, with
    the same Retry-After (one bucket on one clock). Counted per process, B would accept its second."""
    a_server, b_server = await replicas(2, PARLEY_MESSAGES_PER_MINUTE="3")
    async with clients(a_server, b_server) as (a, b):
        sids = [await new_session(a) for _ in range(3)]
        for client, sid in zip((a, b, a), sids, strict=True):
            response = await post_status(client, sid)
            assert response.status_code == 202, response.text
        refused = [await post_status(b, sids[1]), await post_status(a, sids[0])]
    assert [r.status_code for r in refused] == [429, 429], [r.text for r in refused]
    assert {r.json()["error"]["code"] for r in refused} == {"rate_limited"}
    waits = [int(r.headers["Retry-After"]) for r in refused]
    assert set(waits) <= {19, 20} and max(waits) - min(waits) <= 1, waits


async def test_streams_per_principal_count_every_replica_and_a_killed_ones_free_themselves(
    replicas: Replicas,
) -> None:
    """2 streams: one open on A and one on B leave no room on either; closing one makes room elsewhere;
    a stream held by a kill -9'd replica stops counting within the slot's lifetime (the lease's)."""
    # Slots (and leases) of 10 s: room for a few requests on a busy machine before the dead one's expires.
    a_server, b_server = await replicas(
        2, PARLEY_MAX_STREAMS_PER_PRINCIPAL="2", PARLEY_LEASE_SECONDS=str(SLOT_SECONDS)
    )
    async with clients(a_server, b_server) as (a, b):
        sid = await new_session(a)
        async with AsyncExitStack() as held:
            on_a = await held.enter_async_context(stream(a, sid))
            on_b = await held.enter_async_context(stream(b, sid))
            assert (on_a.status_code, on_b.status_code) == (200, 200)
            for client in (a, b):
                async with stream(client, sid) as third:
                    assert third.status_code == 429
                    await third.aread()
                    assert third.json()["error"]["code"] == "too_many_streams"
                    assert third.headers["Retry-After"]
        # Both closed: their slots are given back (a release is sent at once, not left to expire).
        async with stream(a, sid) as first, stream(b, sid) as second:
            assert (first.status_code, second.status_code) == (200, 200)
        async with stream(a, sid) as doomed:
            assert doomed.status_code == 200
            await asyncio.to_thread(a_server.kill)
            async with stream(b, sid) as one:
                assert one.status_code == 200
                async with stream(b, sid) as refused:
                    assert refused.status_code == 429  # the dead replica's slot still counts
                deadline = asyncio.get_running_loop().time() + SLOT_SECONDS * 3
                while True:
                    async with stream(b, sid) as retry:
                        if retry.status_code == 200:
                            break
                    assert asyncio.get_running_loop().time() < deadline, "the dead replica's slot stayed"
                    await asyncio.sleep(0.2)


async def test_with_redis_away_the_limits_count_per_process_and_never_fail(
    replicas: Replicas, own_redis: RedisServer
) -> None:
    """Redis stopped: posts and streams still answer (202, 200, or 429 at a process's own count, never a
    5xx); each replica logs the outage once and counts its decisions in
    parley_limits_redis_unavailable_total."""
    a_server, b_server = await replicas(
        2,
        PARLEY_REDIS_URL=own_redis.url,
        PARLEY_MESSAGES_PER_MINUTE="3",
        PARLEY_MAX_STREAMS_PER_PRINCIPAL="2",
        PARLEY_METRICS="1",
    )
    async with clients(a_server, b_server) as (a, b):
        sids = [await new_session(a) for _ in range(4)]
        await asyncio.to_thread(own_redis.stop)
        statuses = [(await post_status(a, sid)).status_code for sid in sids]
        assert statuses == [202, 202, 202, 429]  # A's own count: 3 a minute
        assert (await post_status(b, sids[0])).status_code == 202  # B counts its own
        async with stream(b, sids[1]) as on_b:
            assert on_b.status_code == 200
        for client in (a, b):
            text = (await client.get("/metrics")).text
            counted = [
                float(line.split()[1])
                for line in text.splitlines()
                if line.startswith("parley_limits_redis_unavailable_total{")
            ]
            assert sum(counted) > 0, text
    for server in (a_server, b_server):
        assert server.log().count("limits: Redis unreachable") == 1, server.log()[-3000:]
