"""SQLite's small urgent commits on the event loop's own thread (storage.loop_writes, through
engine.Database.in_driver_thread's `on_loop`, the path of a response's first delta): no trip to the
driver's thread when the write lock is free; the trip, waiting for the lock, when it is held; storage's
failures raised as on the trip, nothing written; the pool's `checkout` event fired for each commit (where
the tests inject a full disk); the connection handed back to the pool with its busy timeout and
autocheckpoint; and the WAL kept bounded although the loop's commits never checkpoint it."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.pool import Pool
from sqlalchemy.util import greenlet_spawn

from app.storage.engine import BUSY_TIMEOUT_MS, Database
from app.storage.loop_writes import LOOP_COMMITS_PER_TRIP
from app.storage.one_trip import ON_LOOP_LIMIT, BatchWrites, small
from app.storage.tables import ChatMessageRow

pytestmark = pytest.mark.anyio


@pytest.fixture
async def database(tmp_path: Path) -> AsyncIterator[Database]:
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'loop.db'}")
    await db.in_driver_thread(lambda c: c.execute("CREATE TABLE t (n INTEGER, data BLOB)"))
    yield db
    await db.dispose()


def _path(database: Database) -> str:
    return str(database.engine.url.database)


class Trips:
    """Where each `work` ran: on the loop's thread, or in a driver's (a trip)."""

    def __init__(self) -> None:
        self.loop = threading.get_ident()
        self.threads: list[int] = []

    @property
    def count(self) -> int:
        return sum(thread != self.loop for thread in self.threads)

    def insert(self, n: int, size: int = 10) -> Any:
        def work(connection: sqlite3.Connection) -> int:
            self.threads.append(threading.get_ident())
            connection.execute("INSERT INTO t VALUES (?, ?)", (n, b"x" * size))
            return n

        return work


def _rows(database: Database) -> list[int]:
    with sqlite3.connect(_path(database)) as plain:
        return [n for (n,) in plain.execute("SELECT n FROM t ORDER BY n")]


def _settings(connection: sqlite3.Connection) -> tuple[int, int]:
    busy = connection.execute("PRAGMA busy_timeout").fetchone()[0]
    return busy, connection.execute("PRAGMA wal_autocheckpoint").fetchone()[0]


async def _settings_in_the_pool(database: Database) -> set[tuple[int, int]]:
    """The busy timeout and autocheckpoint of every connection the pool holds, as its next user finds them."""
    pool: Any = database.engine.sync_engine.pool
    held: list[Any] = [await database.engine.raw_connection() for _ in range(max(1, pool.checkedin()))]
    try:
        return {_settings(pooled.driver_connection._conn) for pooled in held}
    finally:
        for pooled in held:
            await greenlet_spawn(pooled.close)


async def test_a_small_commit_on_the_loop_makes_no_trip_and_is_durable(
    database: Database,
) -> None:
    trips = Trips()
    assert await database.in_driver_thread(trips.insert(1), on_loop=True) == 1
    assert trips.threads == [trips.loop]
    assert _rows(database) == [1]  # committed: another connection reads it
    assert database.loop_connection.commits_since_trip == 1
    # The loop's own connection: no busy wait, no checkpoint; back in the pool with the engine's settings.
    pooled: Any = database.loop_connection._pooled
    loop_sqlite = pooled.driver_connection._conn
    assert _settings(loop_sqlite) == (0, 0)
    assert await _settings_in_the_pool(database) == {(BUSY_TIMEOUT_MS, 1000)}
    await database.loop_connection.close()
    assert _settings(loop_sqlite) == (BUSY_TIMEOUT_MS, 1000)
    assert await database.in_driver_thread(trips.insert(2), on_loop=True) == 2  # a new one, checked out
    assert (trips.count, _rows(database)) == (0, [1, 2])


async def test_each_commit_on_the_loop_is_a_checkout_for_the_pools_listeners(
    database: Database,
) -> None:
    """The seam the storage-fault tests use (tests/interrupt/test_storage_failure.py): what listens to the
    pool's checkout sees each commit's connection, though the loop keeps one checked out."""
    seen: list[Any] = []

    def listener(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        seen.append(dbapi_connection)

    trips = Trips()
    event.listen(Pool, "checkout", listener)
    try:
        for n in range(3):
            await database.in_driver_thread(trips.insert(n), on_loop=True)
    finally:
        event.remove(Pool, "checkout", listener)
    assert trips.count == 0
    assert len(seen) == 3 + 1  # the first commit checked the connection out, then one for each commit
    assert len({id(connection) for connection in seen}) == 1


async def test_a_held_write_lock_sends_the_commit_to_the_driver_thread_which_waits_for_it(
    database: Database,
) -> None:
    """Another connection holds the write lock for 0.3 s: the loop does not wait for it (its busy timeout
    is 0 there), nothing is written twice, and the trip commits once the lock is free."""
    holder = sqlite3.connect(_path(database), check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.3, holder.commit)
    release.start()
    trips = Trips()
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        assert await database.in_driver_thread(trips.insert(2), on_loop=True) == 2
    finally:
        release.join()
        holder.close()
    assert loop.time() - started >= 0.25
    # Tried on the loop (rolled back), then run in the driver's thread.
    assert len(trips.threads) == 2
    assert trips.threads[0] == trips.loop != trips.threads[1]
    assert _rows(database) == [2]
    assert database.loop_connection.commits_since_trip == 0
    assert await _settings_in_the_pool(database) == {(BUSY_TIMEOUT_MS, 1000)}


async def test_a_failure_on_the_loop_raises_writes_nothing_and_restores_the_connection(
    database: Database,
) -> None:
    """A full disk (max_page_count at the file's size, as tests/interrupt/test_storage_failure makes it)
    answers SQLITE_FULL on the loop as in the driver's thread: raised, rolled back, no trip."""

    def cap(connection: sqlite3.Connection) -> None:
        connection.execute("PRAGMA max_page_count = 1")  # never below the current size: no page more

    await database.in_driver_thread(cap)
    trips = Trips()
    with pytest.raises(sqlite3.OperationalError, match="full") as raised:
        await database.in_driver_thread(trips.insert(3, size=100_000), on_loop=True)
    assert raised.value.sqlite_errorcode & 0xFF == sqlite3.SQLITE_FULL
    assert trips.count == 0
    assert _rows(database) == []


async def test_every_nth_commit_takes_the_trip_so_the_wal_is_checkpointed(
    database: Database,
) -> None:
    """The loop's commits never checkpoint (a checkpoint copies pages back and syncs the file): one in
    every LOOP_COMMITS_PER_TRIP is a trip, whose commit does (SQLite's autocheckpoint at 1000 pages). 640
    commits of 16 KB each (about 3,000 pages of WAL) leave the WAL at most one checkpoint interval long:
    1000 pages and what the loop committed after the last trip."""
    trips = Trips()
    commits = 10 * LOOP_COMMITS_PER_TRIP
    for n in range(commits):
        await database.in_driver_thread(trips.insert(n, size=16_384), on_loop=True)
    assert trips.count == commits // (LOOP_COMMITS_PER_TRIP + 1)
    with sqlite3.connect(_path(database)) as plain:
        _busy, wal_frames, _done = plain.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    pages_per_commit = 6  # a 16 KB row over 4 KB pages, its table's and the commit's own
    assert wal_frames <= 1000 + (LOOP_COMMITS_PER_TRIP + 1) * pages_per_commit
    assert len(_rows(database)) == commits


def _row(content: str) -> ChatMessageRow:
    return ChatMessageRow(
        id="m_1",
        session_id="s_1",
        turn_id="t_1",
        type="message",
        role="assistant",
        content=content,
        timestamp="2026-11-24T10:00:00Z",
    )


def test_only_small_batches_without_a_trim_go_on_the_loop() -> None:
    event = ("s_1", 1, "text_delta", ',"text":"Hi"}')
    assert small(BatchWrites([_row("Hi")], [], [event], []))
    assert not small(BatchWrites([_row("x" * ON_LOOP_LIMIT)], [], [event], []))
    assert not small(BatchWrites([], [("m_1", "x" * ON_LOOP_LIMIT)], [event], []))
    assert not small(BatchWrites([], [], [event] * (ON_LOOP_LIMIT // 10), []))
    assert not small(BatchWrites([_row("Hi")], [], [event], [("s_1", 0)]))
