"""The database engine (app.storage.engine): the pragmas every SQLite connection gets and WAL kept in the
file; PostgreSQL's bounded pool, statement timeout and PgBouncer mode."""

from __future__ import annotations

import asyncio
import contextlib

import psycopg
import pytest
import sqlalchemy.exc
from sqlalchemy import create_engine, text

from app.storage.engine import BUSY_TIMEOUT_MS, Database, PoolOptions
from app.storage.sql import driver, raw
from tests.support.postgres import ScratchDatabase
from tests.support.rows import add_sessions

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


async def test_postgres_connections_get_the_pool_bounds_and_statement_timeout(
    postgres_database: ScratchDatabase,
) -> None:
    database = Database(
        postgres_database.url,
        pool=PoolOptions(size=3, max_overflow=1, timeout=0.2, statement_timeout_ms=1234),
    )
    try:
        async with database.session() as db:
            timeout = (await db.exec(text("SHOW statement_timeout"))).scalar()  # type: ignore[call-overload]
            threshold = (await driver(db)).prepare_threshold
        async with contextlib.AsyncExitStack() as held:
            for _ in range(3 + 1):  # the pool's size and its one overflow connection
                await held.enter_async_context(database.engine.connect())
            with pytest.raises(sqlalchemy.exc.TimeoutError):
                await database.engine.connect().start()
    finally:
        await database.dispose()
    assert timeout == "1234ms"
    assert threshold == 5  # psycopg's default: statements run five times are prepared on the server


async def test_postgres_ends_a_transaction_its_client_left_idle(postgres_database: ScratchDatabase) -> None:
    """Issue 31 §3: a process paused inside a transaction (a GC stall, a frozen VM, SIGSTOP) holds its
    locks only until idle_in_transaction_session_timeout: then PostgreSQL ends the transaction, another
    connection's wait for its lock ends, and the paused client's next statement fails (nothing it wrote
    commits), as does its rollback on the connection the server closed."""
    paused = Database(postgres_database.url, pool=PoolOptions(idle_in_transaction_timeout_ms=300))
    other = Database(postgres_database.url)
    await add_sessions(other, "s_1")
    seen: dict[str, str] = {}
    try:
        with pytest.raises(sqlalchemy.exc.DBAPIError, match="connection is lost"):
            await _lock_and_leave_idle(paused, other, seen)
    finally:
        await paused.dispose()
        await other.dispose()
    assert seen["timeout"] == "300ms"
    assert "idle-in-transaction" in seen["failed"]


async def _lock_and_leave_idle(paused: Database, other: Database, seen: dict[str, str]) -> None:
    """Locks a row in `paused`, leaves the transaction idle until `other` got the lock, then uses it."""
    lock = "SELECT id FROM chat_sessions WHERE id = ? FOR UPDATE"
    async with paused.session() as held:
        seen["timeout"] = (await held.exec(text("SHOW idle_in_transaction_session_timeout"))).scalar()  # type: ignore[call-overload]
        assert await (await raw(held)).fetchall(lock, ("s_1",)) == [("s_1",)]
        async with asyncio.timeout(10), other.session() as db:
            assert await (await raw(db)).fetchall(lock, ("s_1",)) == [("s_1",)]  # once `held` was ended
            await db.rollback()
        try:
            await (await raw(held)).fetchall("SELECT 1")
        except psycopg.Error as exc:
            seen["failed"] = str(exc)


async def test_behind_pgbouncer_no_statement_is_prepared_on_the_server(
    postgres_database: ScratchDatabase,
) -> None:
    """PgBouncer in transaction mode gives each transaction another server connection, where a prepared
    statement does not exist: with `pgbouncer` psycopg prepares none, however often a statement runs."""
    database = Database(postgres_database.url, pool=PoolOptions(pgbouncer=True))
    try:
        async with database.session() as db:
            for _ in range(10):
                await (await raw(db)).fetchall("SELECT count(*) FROM chat_sessions WHERE id = ?", ("s",))
            conn = await driver(db)
            prepared = await (await raw(db)).fetchall("SELECT count(*) FROM pg_prepared_statements")
    finally:
        await database.dispose()
    assert conn.prepare_threshold is None
    assert prepared == [(0,)]


async def test_a_session_that_waits_for_a_full_pool_times_out(postgres_database: ScratchDatabase) -> None:
    """The pool is bounded: past size + overflow a session waits `timeout` seconds, then fails (the request
    gets 503: tests/api/test_postgres_outage.py), instead of opening connections without end."""
    database = Database(postgres_database.url, pool=PoolOptions(size=1, max_overflow=0, timeout=0.2))
    try:
        async with database.session() as held:
            await held.connection()
            async with database.session() as db:
                with pytest.raises(sqlalchemy.exc.TimeoutError):
                    await db.connection()
    finally:
        await database.dispose()


async def test_pooled_connections_the_server_closed_are_replaced_at_checkout(
    postgres_database: ScratchDatabase,
) -> None:
    """A restart of PostgreSQL (here: every backend of the database terminated) while the pool holds idle
    connections: the sessions that come next each get a live connection, none fails. Without the check at
    checkout the first of them fails on its dead connection (tried: the statement raises
    OperationalError), and the pool pings no connection before use any more, so this is what proves that
    a dead one is still noticed."""
    database = Database(postgres_database.url, pool=PoolOptions(size=3, max_overflow=0))

    async def read() -> int:
        async with database.session() as db:
            found = await (await raw(db)).fetchall("SELECT count(*) FROM chat_sessions")
            await asyncio.sleep(0.05)  # held together, so the pool opens all three connections
            return int(found[0][0])

    try:
        assert list(await asyncio.gather(read(), read(), read())) == [0, 0, 0]
        assert database.engine.pool.checkedin() == 3  # type: ignore[attr-defined]
        assert postgres_database.terminate_backends() == 3
        await asyncio.sleep(0.2)  # the server's goodbye reaches the idle sockets
        assert list(await asyncio.gather(read(), read(), read())) == [0, 0, 0]
        assert [await read() for _ in range(3)] == [0, 0, 0]
    finally:
        await database.dispose()


@pytest.mark.both_backends
async def test_a_read_session_sees_what_is_committed_and_leaves_its_connection_transactional(
    database_url: str,
) -> None:
    """`read()` runs its statements outside a transaction on PostgreSQL (no BEGIN and ROLLBACK around
    them: psycopg reports no open transaction after its SELECT) and sees every commit made before each
    statement. Its connection goes back to the pool transactional again: on a pool of one connection a
    write session that follows it and rolls back leaves nothing behind (were autocommit left on, the
    row would be stored)."""
    database = Database(database_url, pool=PoolOptions(size=1, max_overflow=0))
    count = "SELECT count(*) FROM chat_sessions"
    insert = (
        "INSERT INTO chat_sessions (id, principal, model, tools, status, created_at, updated_at,"
        " total_tokens, context_used) VALUES (?, 'p', 'm', '[]', 'idle', 't', 't', 0, 0)"
    )
    try:
        async with database.read() as db:
            assert await (await raw(db)).fetchall(count) == [(0,)]
            if database.dialect == "postgresql":
                status = (await driver(db)).pgconn.transaction_status
                assert status == psycopg.pq.TransactionStatus.IDLE
        async with database.session() as db:
            await (await raw(db)).execute(insert, ("s_kept",))
            await db.commit()
        async with database.read() as db:
            assert await (await raw(db)).fetchall(count) == [(1,)]
        async with database.session() as db:
            await (await raw(db)).execute(insert, ("s_dropped",))
            if database.dialect == "postgresql":
                status = (await driver(db)).pgconn.transaction_status
                assert status == psycopg.pq.TransactionStatus.INTRANS
            await db.rollback()
        async with database.read() as db:
            found = await (await raw(db)).fetchall("SELECT id FROM chat_sessions")
    finally:
        await database.dispose()
    assert found == [("s_kept",)]


async def test_statements_prepared_on_the_server_outlive_read_sessions(
    postgres_database: ScratchDatabase,
) -> None:
    """psycopg prepares a statement on the server once it has run five times on a connection, and forgets
    them all at a ROLLBACK (with a DEALLOCATE ALL round trip). A read session ends without one, so the
    history read that every request makes stays prepared from one request to the next."""
    database = Database(postgres_database.url, pool=PoolOptions(size=1, max_overflow=0))
    try:
        for _ in range(7):
            async with database.read() as db:
                await (await raw(db)).fetchall(
                    "SELECT count(*) FROM chat_messages WHERE session_id = ?", ("s",)
                )
        async with database.read() as db:
            prepared = await (await raw(db)).fetchall(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%chat_messages%'"
            )
    finally:
        await database.dispose()
    assert prepared == [(1,)]
