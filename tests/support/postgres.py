"""PostgreSQL for the tests that prove the dialect-specific parts: one database per test run
(`parley_test_<pid>_<random>`), migrated once and dropped at the end, emptied before each test that uses it.

The server is PARLEY_TEST_POSTGRES_URL (default postgresql://postgres@127.0.0.1:5432/test, trust
authentication, as on the developers' and CI machines). Where it is unreachable the PostgreSQL variants skip
with one line saying how to enable them; under CI=true that skip is a failure instead, so CI never passes
without having run them.

A test opts in with the `both_backends` marker: it then runs once per backend (`[sqlite]`, `[postgresql]`)
through the `backend` parameter that tests/conftest.py's `database_url` reads.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import make_url
from sqlmodel import SQLModel

import app.storage.tables  # noqa: F401  (registers the models' tables)
from tests.support.server import migrate

ADMIN_URL = os.environ.get("PARLEY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
BACKENDS = ("sqlite", "postgresql")
# Every table of the models (a table a later migration adds is emptied too, with no list to keep up).
APP_TABLES = tuple(table.name for table in SQLModel.metadata.sorted_tables)


def _dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def unreachable_reason() -> str | None:
    try:
        with psycopg.connect(_dsn(ADMIN_URL), connect_timeout=3):
            return None
    except psycopg.Error as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


def require_postgres() -> None:
    """Skips (fails under CI=true) when no PostgreSQL is reachable."""
    reason = unreachable_reason()
    if reason is None:
        return
    message = (
        f"PostgreSQL not reachable at {ADMIN_URL} ({reason}); start one (docs/deployment.md) or set "
        "PARLEY_TEST_POSTGRES_URL to run the PostgreSQL variants"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true requires PostgreSQL: {message}", pytrace=False)
    pytest.skip(message)


@dataclass
class ScratchDatabase:
    """A database created on the test server, by name, for the length of a run or a test."""

    name: str

    @property
    def url(self) -> str:
        """The async URL the service takes (PARLEY_DATABASE_URL)."""
        admin = make_url(ADMIN_URL).set(drivername="postgresql+psycopg", database=self.name)
        return admin.render_as_string(hide_password=False)

    @classmethod
    def create(cls, tag: str = "") -> ScratchDatabase:
        name = f"parley_test_{os.getpid()}_{secrets.token_hex(4)}{tag}"
        with psycopg.connect(_dsn(ADMIN_URL), autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return cls(name)

    def drop(self) -> None:
        with psycopg.connect(_dsn(ADMIN_URL), autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name))
            )

    def connect(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(_dsn(self.url), autocommit=True)

    def empty(self) -> None:
        """Every app table emptied, its sequences restarted: as a fresh migrated database."""
        with self.connect() as conn:
            conn.execute(f"TRUNCATE {', '.join(APP_TABLES)} RESTART IDENTITY CASCADE")

    def terminate_backends(self) -> int:
        """Cuts every connection to this database (as a restart of the server would): how many."""
        with psycopg.connect(_dsn(ADMIN_URL), autocommit=True) as admin:
            found = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (self.name,),
            ).fetchone()
        return int(str(found[0])) if found else 0


@pytest.fixture(scope="session")
def postgres_run_database() -> Iterator[ScratchDatabase]:
    """The run's migrated database (created at the first test that needs it, dropped at the end)."""
    require_postgres()
    database = ScratchDatabase.create()
    try:
        migrate(database.url)
        yield database
    finally:
        database.drop()


@pytest.fixture
def postgres_database(postgres_run_database: ScratchDatabase) -> ScratchDatabase:
    """The run's database, empty: what a test gets instead of a fresh SQLite file."""
    postgres_run_database.empty()
    return postgres_run_database


@pytest.fixture
def empty_postgres_database() -> Iterator[ScratchDatabase]:
    """A database of the test's own with no tables at all (migration tests)."""
    require_postgres()
    database = ScratchDatabase.create("_m")
    try:
        yield database
    finally:
        database.drop()


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """ "sqlite" unless the test is marked both_backends (then each in turn)."""
    return str(getattr(request, "param", "sqlite"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "both_backends: runs on SQLite and on PostgreSQL (tests/support/postgres.py)"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames and metafunc.definition.get_closest_marker("both_backends"):
        metafunc.parametrize("backend", BACKENDS, indirect=True)
