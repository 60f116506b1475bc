"""Two real replica processes (`python -m uvicorn app.main:app` on free ports) over one PostgreSQL
database of the module's own and one Redis under a key prefix of the module's own, with the fake
OpenAI-compatible upstream as their model. Each session's messages go to one replica at a time (racing
posts across replicas are the lease's part of issue 16)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest
import redis

from tests.fakes.upstream import FakeUpstream
from tests.support.postgres import ScratchDatabase, require_postgres
from tests.support.process import ServerProcess
from tests.support.redis import REDIS_URL, new_prefix, remove_keys, require_redis
from tests.support.server import migrate

MODEL = "openai/fake-model"
UPSTREAM_KEY = "sk-fanout-test"
STARTUP_SECONDS = 120


@dataclass
class Cluster:
    database: ScratchDatabase
    upstream: FakeUpstream
    a: ServerProcess
    b: ServerProcess
    redis_url: str
    prefix: str

    def clients(self) -> tuple[httpx.AsyncClient, httpx.AsyncClient]:
        """An HTTP client of each replica (the caller closes them)."""
        return (
            httpx.AsyncClient(base_url=self.a.base_url, timeout=30),
            httpx.AsyncClient(base_url=self.b.base_url, timeout=30),
        )

    def redis_connections(self) -> list[str]:
        """The names of the replicas' open Redis connections (each relay and bus names its own)."""
        with redis.Redis.from_url(self.redis_url) as client:
            clients = client.client_list()
        return sorted(c["name"] for c in clients if c["name"].startswith(f"{self.prefix}:"))

    def logged(self, session_id: str) -> list[tuple[int, str, str]]:
        """The session's event log as the database holds it: (seq, type, data)."""
        with psycopg.connect(self.database.url.replace("postgresql+psycopg://", "postgresql://")) as conn:
            rows = conn.execute(
                "SELECT seq, type, data FROM events WHERE session_id = %s ORDER BY seq", (session_id,)
            ).fetchall()
        return [(int(seq), str(type_), str(data)) for seq, type_, data in rows]


def replica_env(
    tmp: Path, database_url: str, redis_url: str, prefix: str, upstream: FakeUpstream
) -> dict[str, str]:
    models = tmp / "models.json"
    provider = {"api_base": upstream.base_url, "api_key_env": "PARLEY_TEST_FAKE_KEY", "models": [MODEL]}
    models.write_text(json.dumps({"providers": {"fake": provider}}))
    return {
        "PARLEY_DATABASE_URL": database_url,
        "PARLEY_REDIS_URL": redis_url,
        "PARLEY_REDIS_PREFIX": prefix,
        "PARLEY_MODELS_FILE": str(models),
        "PARLEY_DEFAULT_MODEL": MODEL,
        "PARLEY_TEST_FAKE_KEY": UPSTREAM_KEY,
        "PARLEY_MESSAGES_PER_MINUTE": "0",
        "PARLEY_MAX_STREAMS_PER_PRINCIPAL": "0",
    }


@pytest.fixture(scope="module")
def fanout_database() -> Iterator[ScratchDatabase]:
    require_postgres()
    database = ScratchDatabase.create("_fanout")
    try:
        migrate(database.url)
        yield database
    finally:
        database.drop()


@pytest.fixture(scope="module")
def fanout_upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(api_key=UPSTREAM_KEY) as running:
        yield running


@pytest.fixture(scope="module")
def cluster(
    fanout_database: ScratchDatabase, fanout_upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """Replicas A and B on the machine's Redis (skips with one line when PostgreSQL or Redis is away)."""
    require_redis()
    tmp = tmp_path_factory.mktemp("fanout")
    prefix = new_prefix()
    env = replica_env(tmp, fanout_database.url, REDIS_URL, prefix, fanout_upstream)
    a, b = ServerProcess(env, tmp / "a.log"), ServerProcess(env, tmp / "b.log")
    try:
        # The model layer loads in each (seconds on a busy 2-core machine) before /readyz says ready.
        a.start(timeout=STARTUP_SECONDS)
        b.start(timeout=STARTUP_SECONDS)
        yield Cluster(fanout_database, fanout_upstream, a, b, REDIS_URL, prefix)
    finally:
        a.kill()
        b.kill()
        remove_keys(REDIS_URL, prefix)
