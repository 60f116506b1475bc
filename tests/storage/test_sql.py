"""What the storage modules share (app.storage.sql), on a real migrated SQLite file and PostgreSQL
database: the driver connection is the session's own transaction, the raw statements (`?` placeholders)
run on both drivers with their row counts, and the dialect's INSERT has ON CONFLICT on both."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiosqlite
import pytest
from sqlalchemy import literal
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import col, select

from app.storage.engine import Database
from app.storage.sql import RawPostgres, RawSqlite, dialect_insert, driver, json_text_field, raw
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


@pytest.mark.both_backends
async def test_raw_statements_run_in_the_sessions_transaction_on_both_drivers(
    database: Database, backend: str
) -> None:
    async with database.session() as db:
        conn = await raw(db)
        assert isinstance(conn, RawPostgres if backend == "postgresql" else RawSqlite)
        params = [(f"s_{n}", "", "parley/demo", "[]", "active", T0, T0) for n in range(3)]
        statement = (
            "INSERT INTO chat_sessions (id, principal, model, tools, status, created_at, updated_at, "
            "total_tokens, context_used) VALUES (?, ?, ?, ?, ?, ?, ?, 0, 0) ON CONFLICT (id) DO NOTHING"
        )
        # Row counts are what the id-collision handling relies on: a taken id is not counted.
        assert await conn.executemany(statement, params) == 3
        assert await conn.executemany(statement, [params[0], ("s_9", *params[0][1:])]) == 1
        assert await conn.execute("UPDATE chat_sessions SET title = ? WHERE id <> ?", ("t", "s_9")) == 3
        found = await conn.fetchall(
            "SELECT id, tools FROM chat_sessions WHERE id LIKE ? ORDER BY id", ("s_%",)
        )
        # The ORM sees the driver's writes: one transaction, not a second connection.
        assert sorted((await db.exec(select(ChatSessionRow.id))).all()) == ["s_0", "s_1", "s_2", "s_9"]
        await db.rollback()
    assert [row[0] for row in found] == ["s_0", "s_1", "s_2", "s_9"]
    assert await ids(database) == []


@pytest.mark.both_backends
async def test_dialect_insert_and_json_fields_follow_the_dialect(database: Database, backend: str) -> None:
    async with database.session() as db:
        insert = dialect_insert(db)
        assert insert is (postgresql.insert if backend == "postgresql" else sqlite.insert)
        await db.exec(insert(ChatSessionRow).values(**session_values("s_one")))
        again = insert(ChatSessionRow).values(**session_values("s_one")).on_conflict_do_nothing()
        assert (await db.exec(again.returning(col(ChatSessionRow.id)))).first() is None
        field = json_text_field(db, literal('{"id": "m_1", "n": 2}'), "id")
        assert (await db.exec(select(field))).one() == "m_1"
        await db.commit()
    assert await ids(database) == ["s_one"]
