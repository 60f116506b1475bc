"""What the storage modules share (app.storage.sql), on a real migrated SQLite file: the driver connection
is the session's own transaction, and the dialect's INSERT is SQLite's. (No PostgreSQL driver is
installed here, so its branch of `dialect_insert` is not exercised.)"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiosqlite
import pytest
from sqlalchemy.dialects import sqlite
from sqlmodel import select

from app.storage.engine import Database
from app.storage.sql import dialect_insert, driver
from app.storage.tables import ChatSessionRow

pytestmark = pytest.mark.anyio

T0 = "2026-02-28T06:30:00.000+00:00"


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    yield database
    await database.dispose()


def session_values(session_id: str) -> dict[str, object]:
    return {"id": session_id, "model": "parley/demo", "tools": [], "created_at": T0, "updated_at": T0}


async def ids(database: Database) -> list[str]:
    async with database.session() as db:
        return list((await db.exec(select(ChatSessionRow.id))).all())


async def test_the_driver_connection_runs_in_the_sessions_transaction(database: Database) -> None:
    async with database.session() as db:
        connection = await driver(db)
        assert isinstance(connection, aiosqlite.Connection)
        await connection.execute(
            "INSERT INTO chat_sessions (id, principal, model, tools, status, created_at, updated_at, "
            "total_tokens, context_used) VALUES ('s_raw', '', 'parley/demo', '[]', 'active', ?, ?, 0, 0)",
            (T0, T0),
        )
        # The ORM sees the driver's write: one transaction, not a second connection.
        assert (await db.exec(select(ChatSessionRow.id))).all() == ["s_raw"]
        await db.rollback()
    assert await ids(database) == []  # and it rolls back with the session


async def test_dialect_insert_is_sqlites_with_on_conflict(database: Database) -> None:
    async with database.session() as db:
        insert = dialect_insert(db)
        assert insert is sqlite.insert
        await db.exec(insert(ChatSessionRow).values(**session_values("s_one")))
        again = insert(ChatSessionRow).values(**session_values("s_one")).on_conflict_do_nothing()
        assert (await db.exec(again)).rowcount == 0
        await db.commit()
    assert await ids(database) == ["s_one"]
