"""The database engine (app.storage.engine): the pragmas every app connection gets, and WAL kept in the
file."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from app.storage.engine import BUSY_TIMEOUT_MS, Database

pytestmark = pytest.mark.anyio


async def test_app_connections_use_wal_busy_timeout_and_foreign_keys(database_url: str) -> None:
    database = Database(database_url)
    try:
        async with database.engine.connect() as connection:
            journal = (await connection.exec_driver_sql("PRAGMA journal_mode")).scalar()
            busy = (await connection.exec_driver_sql("PRAGMA busy_timeout")).scalar()
            foreign_keys = (await connection.exec_driver_sql("PRAGMA foreign_keys")).scalar()
        async with database.session() as db:
            through_session = (await db.connection()).exec_driver_sql("PRAGMA foreign_keys")
            assert (await through_session).scalar() == 1
    finally:
        await database.dispose()
    assert str(journal).lower() == "wal"
    assert isinstance(busy, int)
    assert busy > 0
    assert busy == BUSY_TIMEOUT_MS
    assert foreign_keys == 1


async def test_wal_mode_persists_in_the_file(database_url: str) -> None:
    database = Database(database_url)
    try:
        async with database.engine.connect() as connection:
            await connection.execute(text("SELECT 1"))
    finally:
        await database.dispose()
    plain = create_engine(database_url.replace("+aiosqlite", ""))
    try:
        with plain.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        plain.dispose()
