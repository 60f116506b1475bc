"""Real replica processes on one PostgreSQL database (one per test module), the fake upstream as their
model, leases of LEASE_SECONDS: what tests/replicas drives over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest
import redis

from tests.fakes.upstream import FakeUpstream
from tests.interrupt.conftest import MODEL, write_models_file
from tests.support.postgres import ScratchDatabase, require_postgres
from tests.support.process import ServerProcess
from tests.support.redis import new_prefix, remove_keys
from tests.support.server import migrate

LEASE_SECONDS = 3.0
# The model layer loads in each replica: seconds, or a minute and more on a busy 2-core machine.
STARTUP_SECONDS = 150.0
# Its presence turns multi-replica mode on; the control channel (cancels, steer and interrupt notices)
# runs through it and the limits count in it, under a prefix of the test's own.
REDIS_URL = "redis://127.0.0.1:6379/15"
# Where no Redis listens (the discard port): a replica given it runs with Redis unreachable.
UNREACHABLE_REDIS_URL = "redis://127.0.0.1:9/15"


@pytest.fixture(scope="module")
def replica_database() -> Iterator[ScratchDatabase]:
    require_postgres()
    database = ScratchDatabase.create("_r")
    try:
        migrate(database.url)
        yield database
    finally:
        database.drop()


@pytest.fixture
def pg(replica_database: ScratchDatabase) -> ScratchDatabase:
    replica_database.empty()
    return replica_database


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(strict=True) as running:
        yield running


# The app every replica runs unless a test names another: the built-in tools and `slow`.
SLOW_APP = "tests.support.slow_app:app"


class Replicas(Protocol):
    def __call__(self, n: int, *, app: str = SLOW_APP, **env: str) -> Awaitable[list[ServerProcess]]: ...


@pytest.fixture
async def replicas(pg: ScratchDatabase, upstream: FakeUpstream, tmp_path: Path) -> AsyncIterator[Replicas]:
    """Starts n replicas (tests.support.slow_app: the built-in tools and `slow`, or `app`), each with the
    common environment updated by `env`, under a Redis key prefix of the test's own: the limits count
    there, and tests running at once must not share counts or control channels."""
    started: list[ServerProcess] = []
    prefix = new_prefix()
    models = write_models_file(tmp_path, upstream.base_url)
    env = {
        "PARLEY_DATABASE_URL": pg.url,
        "PARLEY_REDIS_URL": REDIS_URL,
        "PARLEY_REDIS_PREFIX": prefix,
        "PARLEY_LEASE_SECONDS": str(LEASE_SECONDS),
        "PARLEY_MODELS_FILE": str(models),
        "PARLEY_DEFAULT_MODEL": MODEL,
        "PARLEY_PROVIDER_RETRIES": "0",
    }

    async def start(n: int, *, app: str = SLOW_APP, **extra: str) -> list[ServerProcess]:
        new = [
            ServerProcess(
                {**env, **extra},
                tmp_path / f"replica{len(started) + i}.log",
                app=app,
            )
            for i in range(n)
        ]
        started.extend(new)
        await asyncio.gather(*(asyncio.to_thread(s.start, STARTUP_SECONDS) for s in new))
        return new

    try:
        yield start
    finally:
        for server in started:
            server.resume()
            server.kill()
            # Shown by pytest only when the test failed: what each replica logged, for the post-mortem.
            print(f"--- {server.log_path.name} (last 6000 characters)\n{server.log()[-6000:]}")
        with suppress(redis.RedisError, OSError):  # the tests do not need Redis to be there
            remove_keys(REDIS_URL, prefix)


@asynccontextmanager
async def clients(*servers: ServerProcess) -> AsyncIterator[list[httpx.AsyncClient]]:
    opened = [httpx.AsyncClient(base_url=s.base_url, timeout=60) for s in servers]
    try:
        yield opened
    finally:
        for client in opened:
            await client.aclose()


async def until(check: Callable[[], Awaitable[Any]], seconds: float = 30.0) -> Any:
    """Polls `check` until it returns something truthy; fails after `seconds`."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        found = await check()
        if found:
            return found
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


def rows(pg: ScratchDatabase, sql: str, *params: object) -> list[tuple[Any, ...]]:
    with pg.connect() as conn:
        return list(conn.execute(sql, params).fetchall())
