"""What the storage modules share: the driver connection under a session, and the dialect's SQL pieces.

The hot path's statements skip SQLAlchemy's per-statement work (compile-cache lookups, parameter
processing) and go to the driver under the session's own transaction through `raw(db)`: one small
interface over aiosqlite (SQLite) and psycopg 3 (PostgreSQL). Statements are written once, with `?`
placeholders and SQL both dialects read; `RawPostgres` turns the placeholders into psycopg's `%s`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Protocol

from sqlalchemy import ColumnElement, cast, func
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel.ext.asyncio.session import AsyncSession


class Raw(Protocol):
    """The driver connection of a session's transaction. Errors are the driver's own (sqlite3's or
    psycopg's), not SQLAlchemy's wrappers of them."""

    dialect: str

    async def fetchall(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    async def execute(self, statement: str, params: Sequence[Any] = ()) -> int:
        """Runs one statement; returns its row count."""
        ...

    async def executemany(self, statement: str, params: Sequence[Sequence[Any]]) -> int:
        """Runs one statement per parameter tuple; returns the total row count."""
        ...


class RawSqlite:
    dialect = "sqlite"

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    async def fetchall(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return list(await self.connection.execute_fetchall(statement, params))

    async def execute(self, statement: str, params: Sequence[Any] = ()) -> int:
        cursor = await self.connection.execute(statement, params)
        return int(cursor.rowcount)

    async def executemany(self, statement: str, params: Sequence[Sequence[Any]]) -> int:
        cursor = await self.connection.executemany(statement, params)
        return int(cursor.rowcount)


@lru_cache(maxsize=256)
def _pyformat(statement: str, placeholder: str = "%s") -> str:
    """`?` placeholders as psycopg's `%s` (or `%b`, binary; a literal `%` doubled). The storage modules'
    statements hold no `?` or `%` inside string literals."""
    return statement.replace("%", "%%").replace("?", placeholder)


class RawPostgres:
    dialect = "postgresql"

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    async def fetchall(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        async with self.connection.cursor() as cursor:
            await cursor.execute(_pyformat(statement), params)
            return list(await cursor.fetchall())

    async def execute(self, statement: str, params: Sequence[Any] = ()) -> int:
        async with self.connection.cursor() as cursor:
            await cursor.execute(_pyformat(statement), params)
            return int(cursor.rowcount)

    async def execute_columns(self, statement: str, columns: Sequence[list[Any]]) -> int:
        """Runs one statement whose parameters are whole columns (arrays, for unnest); returns its row
        count. They go in binary format: in the text format psycopg escapes each quote of each element
        with a regular expression in Python, which for the event log's JSON was 50 us per row (measured:
        12.6 ms of CPU for a batch of 250 events, 1 ms in binary)."""
        async with self.connection.cursor() as cursor:
            await cursor.execute(_pyformat(statement, "%b"), columns)
            return int(cursor.rowcount)

    async def fetch_columns(self, statement: str, columns: Sequence[list[Any]]) -> list[tuple[Any, ...]]:
        """`execute_columns` for a statement that returns rows."""
        async with self.connection.cursor() as cursor:
            await cursor.execute(_pyformat(statement, "%b"), columns)
            return list(await cursor.fetchall())

    async def executemany(self, statement: str, params: Sequence[Sequence[Any]]) -> int:
        if not params:
            return 0
        async with self.connection.cursor() as cursor:
            # psycopg 3 sums the row counts of an executemany (and pipelines its statements).
            await cursor.executemany(_pyformat(statement), params)
            return int(cursor.rowcount)


async def driver(db: AsyncSession) -> Any:
    """The driver's own connection under the session's transaction (aiosqlite's or psycopg's)."""
    connection = await db.connection()
    found = (await connection.get_raw_connection()).driver_connection
    assert found is not None
    return found


async def raw(db: AsyncSession) -> Raw:
    """The session's transaction as a `Raw` of its dialect."""
    connection = await driver(db)
    if dialect_name(db) == "postgresql":
        return RawPostgres(connection)
    return RawSqlite(connection)


def load_json(stored: str | bytes) -> Any:
    """A JSON column's stored text as Python, for both drivers (psycopg hands bytes). Most stored values
    are `null` (a message without arguments or client tools): those skip the parser. Bytes are decoded
    first, since json.loads would otherwise sniff their encoding byte by byte (measured: a third of the
    JSON cost of a history page on PostgreSQL)."""
    if stored == b"null" or stored == "null":
        return None
    return json.loads(stored.decode() if isinstance(stored, bytes) else stored)


def dialect_name(db: AsyncSession) -> str:
    return db.get_bind().dialect.name


def dialect_insert(db: AsyncSession) -> Any:
    """The dialect's INSERT, which has ON CONFLICT (SQLite and PostgreSQL alike)."""
    return postgresql.insert if dialect_name(db) == "postgresql" else sqlite.insert


def json_text_field(db: AsyncSession, column: Any, key: str) -> ColumnElement[Any]:
    """The text of `key` in the JSON object that the text `column` holds (`column` is not a JSON column)."""
    if dialect_name(db) == "postgresql":
        return cast(column, postgresql.JSON).op("->>")(key)
    return func.json_extract(column, f"$.{key}")


def json_text_sql(dialect: str, expression: str, key: str) -> str:
    """The same as `json_text_field`, as SQL text for hand-written statements."""
    if dialect == "postgresql":
        return f"(CAST({expression} AS json) ->> '{key}')"
    return f"json_extract({expression}, '$.{key}')"
