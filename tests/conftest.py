"""Shared fixtures: a migrated SQLite file per test (a copy of one migrated once per run: a migration costs
0.2-0.6 s, a copy 0.2 ms), or PostgreSQL database (tests/support/postgres.py), and a real server on a real
socket (and, as plugins, the tests/support/ modules that hold fixtures of their own)."""

from __future__ import annotations

import shutil
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

TESTS = Path(__file__).resolve().parent
# What every test of a folder needs (the markers are described in pyproject.toml); a module elsewhere that
# needs one says so with its own `pytestmark`.
FOLDER_MARKS = {
    "browser": ("browser", "slow"),
    "container": ("container", "slow"),
    "replicas": ("processes", "slow"),
    "fanout": ("processes", "slow"),
}
# Longer than pyproject's default (180 s) for what starts processes or builds an image: a replica's model
# layer loads for a minute and more on a busy 2-core machine, and the timeout counts the fixtures' setup.
# The first of these markers a test has sets its timeout; a test's own @pytest.mark.timeout wins.
MARKED_TIMEOUTS = {"container": 1800, "serial": 900, "processes": 600, "browser": 300}


@pytest.hookimpl(tryfirst=True)  # before -m deselects, so that it sees the folders' markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        try:
            folder = item.path.relative_to(TESTS).parts[0]
        except ValueError:
            continue
        for name in FOLDER_MARKS.get(folder, ()):
            item.add_marker(name)
        if item.get_closest_marker("timeout") is None:
            seconds = next((s for name, s in MARKED_TIMEOUTS.items() if item.get_closest_marker(name)), None)
            if seconds is not None:
                item.add_marker(pytest.mark.timeout(seconds))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once per run (per xdist worker), closed: the file every test copies.

    The migration's connection uses the default rollback journal, so once it is closed the file alone
    holds the whole database (no -wal or -journal beside it) and a byte copy is a migrated database."""
    path = tmp_path_factory.mktemp("template") / "parley.db"
    migrate(f"sqlite+aiosqlite:///{path}")
    assert [p.name for p in path.parent.iterdir()] == [path.name], "the template is more than one file"
    return path


@pytest.fixture
def database_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A migrated, empty database: a SQLite file of the test's own (a copy of the run's template), or (tests
    marked both_backends, in their [postgresql] run) the run's PostgreSQL database, emptied
    (tests/support/postgres.py)."""
    if backend == "postgresql":
        database: ScratchDatabase = request.getfixturevalue("postgres_database")
        return database.url
    path = tmp_path / "parley.db"
    shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
    return f"sqlite+aiosqlite:///{path}"


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, demo_token_delay=0.0, provider_retry_backoff=0.01)


@pytest.fixture
def server(settings: Settings) -> Iterator[LiveServer]:
    with live_server(settings) as running:
        yield running
