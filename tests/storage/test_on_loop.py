"""SQLite's small urgent commits on the event loop's own thread (engine.Database.in_driver_thread's
`on_loop`, the path of a response's first delta): no trip to the driver's thread when the write lock is
free; the trip, waiting for the lock, when it is held; storage's failures raised as on the trip, nothing
written; the connection handed back with its busy timeout and autocheckpoint; and the WAL kept bounded
although the loop's commits never checkpoint it."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

from app.storage.engine import BUSY_TIMEOUT_MS, LOOP_COMMITS_PER_TRIP, Database
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
    """The calls queued to aiosqlite's threads, and the threads `work` ran in."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.threads: list[int] = []
        original: Any = aiosqlite.Connection._execute

        async def counted(connection: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return await original(connection, fn, *args, **kwargs)

        monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)

    def insert(self, n: int, size: int = 10) -> Any:
        def work(connection: sqlite3.Connection) -> int:
            self.threads.append(threading.get_ident())
            connection.execute("INSERT INTO t VALUES (?, ?)", (n, b"x" * size))
            return n

        return work


def _rows(database: Database) -> list[int]:
    with sqlite3.connect(_path(database)) as plain:
        return [n for (n,) in plain.execute("SELECT n FROM t ORDER BY n")]


async def _settings_after(database: Database) -> tuple[int, int]:
    """The busy timeout and autocheckpoint of the pooled connection, as the next user finds them."""

    def read(connection: sqlite3.Connection) -> tuple[int, int]:
        busy = connection.execute("PRAGMA busy_timeout").fetchone()[0]
        return busy, connection.execute("PRAGMA wal_autocheckpoint").fetchone()[0]

    return await database.in_driver_thread(read)


async def test_a_small_commit_on_the_loop_makes_no_trip_and_is_durable(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    trips = Trips(monkeypatch)
    assert await database.in_driver_thread(trips.insert(1), on_loop=True) == 1
    assert (trips.count, trips.threads) == (0, [threading.get_ident()])
    assert _rows(database) == [1]  # committed: another connection reads it
    assert database.loop_commits_since_trip == 1
    assert await _settings_after(database) == (BUSY_TIMEOUT_MS, 1000)


async def test_a_held_write_lock_sends_the_commit_to_the_driver_thread_which_waits_for_it(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another connection holds the write lock for 0.3 s: the loop does not wait for it (its busy timeout
    is 0 there), nothing is written twice, and the trip commits once the lock is free."""
    holder = sqlite3.connect(_path(database), check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.3, holder.commit)
    release.start()
    trips = Trips(monkeypatch)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        assert await database.in_driver_thread(trips.insert(2), on_loop=True) == 2
    finally:
        release.join()
        holder.close()
    assert loop.time() - started >= 0.25
    assert trips.count == 1
    assert len(trips.threads) == 2  # tried on the loop (rolled back), then run in the driver's thread
    assert trips.threads[0] == threading.get_ident() != trips.threads[1]
    assert _rows(database) == [2]
    assert database.loop_commits_since_trip == 0
    assert await _settings_after(database) == (BUSY_TIMEOUT_MS, 1000)


async def test_a_failure_on_the_loop_raises_writes_nothing_and_restores_the_connection(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk (max_page_count at the file's size, as tests/interrupt/test_storage_failure makes it)
    answers SQLITE_FULL on the loop as in the driver's thread: raised, rolled back, no trip."""

    def cap(connection: sqlite3.Connection) -> None:
        connection.execute("PRAGMA max_page_count = 1")  # never below the current size: no page more

    await database.in_driver_thread(cap)
    trips = Trips(monkeypatch)
    with pytest.raises(sqlite3.OperationalError, match="full") as raised:
        await database.in_driver_thread(trips.insert(3, size=100_000), on_loop=True)
    assert raised.value.sqlite_errorcode & 0xFF == sqlite3.SQLITE_FULL
    assert trips.count == 0
    assert _rows(database) == []
    assert await _settings_after(database) == (BUSY_TIMEOUT_MS, 1000)


async def test_every_nth_commit_takes_the_trip_so_the_wal_is_checkpointed(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's commits never checkpoint (a checkpoint copies pages back and syncs the file): one in
    every LOOP_COMMITS_PER_TRIP is a trip, whose commit does (SQLite's autocheckpoint at 1000 pages). 640
    commits of 16 KB each (about 3,000 pages of WAL) leave the WAL at most one checkpoint interval long:
    1000 pages and what the loop committed after the last trip."""
    trips = Trips(monkeypatch)
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
