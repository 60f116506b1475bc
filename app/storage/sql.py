"""What the storage modules share: the driver connection under a session, and the dialect's INSERT."""

from __future__ import annotations

from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel.ext.asyncio.session import AsyncSession


async def driver(db: AsyncSession) -> Any:
    """The aiosqlite connection under the session's transaction: the hot path's statements skip
    SQLAlchemy's per-statement work (compile-cache lookups, parameter processing, a cursor per call)."""
    connection = await db.connection()
    driver = (await connection.get_raw_connection()).driver_connection
    assert driver is not None
    return driver


def dialect_insert(db: AsyncSession) -> Any:
    """The dialect's INSERT, which has ON CONFLICT (SQLite and PostgreSQL alike)."""
    bind = db.get_bind()
    return postgresql.insert if bind.dialect.name == "postgresql" else sqlite.insert
