"""The async engine, chosen by URL: SQLite (the embedded default) in WAL mode with a busy timeout and
foreign keys on every connection, or PostgreSQL through psycopg 3 with a bounded pool, a statement
timeout and an idle-in-transaction timeout, and optionally no server-side prepared statements (for
PgBouncer in transaction mode)."""

from __future__ import annotations

import asyncio
import select
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeout
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlmodel.ext.asyncio.session import AsyncSession

from app.storage import pg_text
from app.storage.sql import load_json

if TYPE_CHECKING:
    from app.settings import Settings

# How long a write waits for SQLite's one write lock before it fails with "database is locked".
BUSY_TIMEOUT_MS = 10_000

# PostgreSQL: replicas that start at once (the image migrates at every start) take turns on this advisory
# lock, held to each migration's commit (migrations/env.py); the next one then finds the database at head.
MIGRATION_LOCK = 0x7061726C6579  # "parley"


@dataclass(frozen=True)
class PoolOptions:
    """PostgreSQL's connection handling (SQLite's one file needs none of it)."""

    size: int = 10
    max_overflow: int = 10
    # Seconds a session waits for a free connection before the request gets a 503.
    timeout: float = 10.0
    statement_timeout_ms: int = 30_000
    # A transaction left idle this long is ended by the server, its locks released: a process paused in
    # one (a GC stall, a frozen VM, SIGSTOP) holds up no other process for longer (0: never).
    idle_in_transaction_timeout_ms: int = 0
    connect_timeout: int = 5
    # PgBouncer in transaction mode hands each transaction another server connection: no statement may
    # be prepared on the server (psycopg prepares one after five runs unless prepare_threshold is None).
    pgbouncer: bool = False


def pool_options(settings: Settings) -> PoolOptions:
    return PoolOptions(
        size=settings.database_pool_size,
        max_overflow=settings.database_max_overflow,
        timeout=settings.database_pool_timeout,
        statement_timeout_ms=settings.database_statement_timeout_ms,
        idle_in_transaction_timeout_ms=settings.idle_in_transaction_timeout_ms,
        pgbouncer=settings.database_pgbouncer,
    )


def _pragmas(busy_timeout_ms: int) -> Callable[[Any, Any], None]:
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    return on_connect


def ensure_sqlite_dir(url: str) -> None:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)


def async_url(url: str) -> str:
    """The URL with its async driver: `postgresql://` and `postgres://` mean psycopg 3, `sqlite://`
    aiosqlite."""
    parsed = make_url(url)
    driver = {"postgresql": "postgresql+psycopg", "sqlite": "sqlite+aiosqlite"}
    name = parsed.get_backend_name()
    if name == "postgres":
        name = "postgresql"
    if parsed.drivername in ("postgresql", "postgres", "sqlite"):
        parsed = parsed.set(drivername=driver[name])
    return parsed.render_as_string(hide_password=False)


def sync_url(url: str) -> str:
    """The same database for tools that need a synchronous driver (alembic): psycopg 3 is both."""
    return async_url(url).replace("+aiosqlite", "")


def is_postgres(url: str) -> bool:
    return make_url(url).get_backend_name() in ("postgresql", "postgres")


def create_engine(
    url: str, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS, pool: PoolOptions | None = None
) -> AsyncEngine:
    url = async_url(url)
    if is_postgres(url):
        return _postgres_engine(url, pool or PoolOptions())
    ensure_sqlite_dir(url)
    engine = create_async_engine(
        url,
        connect_args={"timeout": busy_timeout_ms / 1000},
        # A session that closes rolls back its own open transaction (SQLAlchemy runs that close to
        # completion, also when the task is cancelled); the pool's rollback on top of it was one more trip
        # to the driver's thread per session, for nothing.
        pool_reset_on_return=None,
    )
    event.listen(engine.sync_engine, "connect", _pragmas(busy_timeout_ms))
    return engine


def _postgres_engine(url: str, pool: PoolOptions) -> AsyncEngine:
    connect_args: dict[str, Any] = {
        "connect_timeout": pool.connect_timeout,
        "options": f"-c statement_timeout={int(pool.statement_timeout_ms)}"
        f" -c idle_in_transaction_session_timeout={int(pool.idle_in_transaction_timeout_ms)}",
    }
    if pool.pgbouncer:
        connect_args["prepare_threshold"] = None
    engine = create_async_engine(
        url,
        connect_args=connect_args,
        pool_size=pool.size,
        max_overflow=pool.max_overflow,
        pool_timeout=pool.timeout,
        json_serializer=pg_text.dumps_json,
        json_deserializer=_load_stored_json,
    )
    # Text PostgreSQL cannot hold (U+0000), stored and read back faithfully: app.storage.pg_text.
    event.listen(engine.sync_engine, "connect", install_pg_text)
    # A connection the server (or a proxy) closed is replaced at checkout, so the service recovers by
    # itself once the database is back: by a look at its socket (_check_alive), not by pool_pre_ping's
    # round trip before every transaction.
    event.listen(engine.sync_engine, "checkout", _check_alive)
    return engine


def _load_stored_json(stored: str | bytes) -> Any:
    return load_json(pg_text.restored_json(stored))


def install_pg_text(_dbapi_connection: Any, record: Any) -> None:
    pg_text.install(record.driver_connection)


def _check_alive(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """Raises DisconnectionError (the pool then opens a new connection in its place) for a pooled
    connection that is dead: psycopg saw it break, or its socket has something to read.

    A connection idle in the pool is owed nothing by the server: whatever arrives on it is the server
    closing it (a restart, pg_terminate_backend, idle_session_timeout: an error message, then EOF) or a
    proxy resetting it, both seen as a readable socket without a round trip. (A server message that is
    harmless, a parameter change after a configuration reload, costs a reconnect, no error.) The hot
    path's raw statements bypass SQLAlchemy's own detection of a dead connection; psycopg marks the
    connection broken or closed, and the next checkout replaces it."""
    connection = dbapi_connection.driver_connection
    if connection.closed or connection.broken:
        raise DisconnectionError("the connection is closed")
    poller = select.poll()
    poller.register(connection.pgconn.socket, select.POLLIN | select.POLLPRI)
    if poller.poll(0):
        raise DisconnectionError("the server closed the connection, or sent on it while idle")


class Database:
    """Owns the engine and hands out short-lived database sessions (`db`)."""

    def __init__(
        self, url: str, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS, pool: PoolOptions | None = None
    ) -> None:
        self.engine = create_engine(url, busy_timeout_ms=busy_timeout_ms, pool=pool)
        self.dialect = self.engine.dialect.name
        self._factory = async_sessionmaker(self.engine, class_=AsyncSession, expire_on_commit=False)
        # PostgreSQL's reads in autocommit: the same snapshots as in a transaction (READ COMMITTED takes one
        # per statement either way), without its BEGIN and ROLLBACK round trips, and without the
        # DEALLOCATE ALL that psycopg sends after a ROLLBACK, forgetting the statements it had prepared.
        reads = self.engine
        if self.dialect == "postgresql":
            reads = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        self._read_factory = async_sessionmaker(reads, class_=AsyncSession, expire_on_commit=False)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        async with self._factory() as db:
            yield db

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        """A session that only reads: every statement sees what was committed before it began. Nothing
        written in it is atomic (on PostgreSQL each statement commits by itself): writes go in
        `session()`. On SQLite the same as `session()`."""
        async with self._read_factory() as db:
            yield db

    async def ping(self, timeout: float = 2.0) -> bool:
        """Whether a statement runs within `timeout` seconds (a pooled connection, or a new one)."""
        try:
            async with asyncio.timeout(timeout), self.engine.connect() as connection:
                await connection.exec_driver_sql("SELECT 1")
        except (TimeoutError, DBAPIError, SQLAlchemyTimeout, OSError):
            return False
        return True

    async def dispose(self) -> None:
        await self.engine.dispose()
