"""The async engine: SQLite in WAL mode with a busy timeout and foreign keys on every connection."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlmodel.ext.asyncio.session import AsyncSession

# How long a write waits for SQLite's one write lock before it fails with "database is locked".
BUSY_TIMEOUT_MS = 10_000


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


def create_engine(url: str, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> AsyncEngine:
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


class Database:
    """Owns the engine and hands out short-lived database sessions (`db`)."""

    def __init__(self, url: str, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        self.engine = create_engine(url, busy_timeout_ms=busy_timeout_ms)
        self._factory = async_sessionmaker(self.engine, class_=AsyncSession, expire_on_commit=False)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        async with self._factory() as db:
            yield db

    async def dispose(self) -> None:
        await self.engine.dispose()
