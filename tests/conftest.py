"""Shared fixtures: a migrated SQLite file per test and a real server on a real socket (and, as plugins,
the tests/support/ modules that hold fixtures of their own)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.settings import Settings
from tests.support.server import LiveServer, live_server, migrate

# Fixtures more than one folder uses, each in the support module that holds what it builds.
pytest_plugins = ("tests.support.slow_tool",)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def database_url(tmp_path: Path) -> str:
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
