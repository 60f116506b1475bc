"""Shared fixtures: a migrated SQLite file per test (or PostgreSQL database: tests/support/postgres.py)
and a real server on a real socket (and, as plugins, the tests/support/ modules that hold fixtures of
their own)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from app.settings import Settings
from tests.support.server import LiveServer, live_server, migrate

if TYPE_CHECKING:
    from tests.support.postgres import ScratchDatabase

# Fixtures more than one folder uses, each in the support module that holds what it builds.
pytest_plugins = ("tests.support.slow_tool", "tests.support.postgres")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def database_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A migrated, empty database: a SQLite file of the test's own, or (tests marked both_backends, in their
    [postgresql] run) the run's PostgreSQL database, emptied (tests/support/postgres.py)."""
    if backend == "postgresql":
        database: ScratchDatabase = request.getfixturevalue("postgres_database")
        return database.url
    url = f"sqlite+aiosqlite:///{tmp_path / 'parley.db'}"
    migrate(url)
    return url


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, demo_token_delay=0.0, provider_retry_backoff=0.01)


@pytest.fixture
def server(settings: Settings) -> Iterator[LiveServer]:
    with live_server(settings) as running:
        yield running
