"""Real replica processes on one PostgreSQL database (one per test module), the fake upstream as their
model, leases of LEASE_SECONDS: what tests/replicas drives over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.upstream import FakeUpstream
from tests.interrupt.conftest import MODEL, write_models_file
from tests.support.postgres import ScratchDatabase, require_postgres
from tests.support.process import ServerProcess
from tests.support.redis import new_prefix, remove_keys
from tests.support.server import migrate

LEASE_SECONDS = 3.0
# The model layer loads in each replica before /readyz says ready: long on a busy 2-core machine.
STARTUP_SECONDS = 120.0
# The leases need only its presence; the limits count in it, under the test's own prefix.
REDIS_URL = "redis://127.0.0.1:6379/15"


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


# n, then settings of these replicas' own (PARLEY_... variables).
Replicas = Callable[..., Awaitable[list[ServerProcess]]]


@pytest.fixture
async def replicas(pg: ScratchDatabase, upstream: FakeUpstream, tmp_path: Path) -> AsyncIterator[Replicas]:
    """Starts n replicas (tests.support.slow_app: the built-in tools and `slow`), under a Redis key prefix
    of the test's own: the limits count there, and tests running at once must not share counts."""
    started: list[ServerProcess] = []
    models = write_models_file(tmp_path, upstream.base_url)
    prefix = new_prefix()
    env = {
        "PARLEY_DATABASE_URL": pg.url,
        "PARLEY_REDIS_URL": REDIS_URL,
        "PARLEY_REDIS_PREFIX": prefix,
        "PARLEY_LEASE_SECONDS": str(LEASE_SECONDS),
        "PARLEY_MODELS_FILE": str(models),
        "PARLEY_DEFAULT_MODEL": MODEL,
        "PARLEY_PROVIDER_RETRIES": "0",
    }

    async def start(n: int, **settings: str) -> list[ServerProcess]:
        new = [
            ServerProcess(
                env | settings, tmp_path / f"replica{len(started) + i}.log", app="tests.support.slow_app:app"
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
