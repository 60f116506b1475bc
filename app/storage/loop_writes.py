"""SQLite: small urgent commits made on the event loop's own thread (engine.Database.in_driver_thread's
`on_loop`, the path of a response's first delta).

A trip to aiosqlite's thread costs the thread's wake-up, which waits for the GIL behind a busy loop, and
the reply's turns of the loop; a pooled connection's checkout costs a greenlet's switch and the pool's
bookkeeping. Here one pooled connection is kept checked out for the loop's commits, with a busy timeout of
0 (a held write lock means "take the trip", which waits for it) and without autocheckpoint (a checkpoint
copies pages back into the database file and syncs it: not on the loop). Each commit fires the pool's
`checkout` event for it, so what listens there sees it as a connection checked out for that commit (the
tests make a full disk that way). Whoever holds the loop's connection sends every LOOP_COMMITS_PER_TRIP-th
commit through a trip instead, whose commit checkpoints the WAL once it has grown.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import greenlet_spawn

T = TypeVar("T")

# At most this many commits made on the loop between two trips to a driver's thread.
LOOP_COMMITS_PER_TRIP = 64

# SQLite's default autocheckpoint, in pages (the engine never sets another).
AUTOCHECKPOINT = 1000

_SQLITE_BUSY = 5


def committed(sqlite: sqlite3.Connection, work: Callable[[sqlite3.Connection], T]) -> T:
    """`work` with the sqlite3 connection, committed, or rolled back if it raises (on the loop's thread
    here, in aiosqlite's for engine.Database.in_driver_thread's trip)."""
    try:
        result = work(sqlite)
        sqlite.commit()
    except BaseException:
        sqlite.rollback()
        raise
    return result


class LoopConnection:
    """The pooled connection the loop's commits are made on, checked out at the first of them."""

    def __init__(self, engine: AsyncEngine, busy_timeout_ms: int) -> None:
        self._engine = engine
        self._busy_timeout_ms = busy_timeout_ms
        self._pooled: Any = None
        # Held while the pool's checkout listeners use the connection (they may await), and the commit.
        self._listened = asyncio.Lock()
        # Commits made here since the last trip (Database.in_driver_thread resets it).
        self.commits_since_trip = 0

    @property
    def due_for_a_trip(self) -> bool:
        return self.commits_since_trip >= LOOP_COMMITS_PER_TRIP

    async def commit(self, work: Callable[[sqlite3.Connection], T]) -> tuple[T] | None:
        """`work` and its commit, (its result,), if SQLite's write lock is free at once; else None with
        nothing written. Any other failure is raised, rolled back. Awaits only for the connection's
        checkout, the first time, and for the pool's checkout listeners where there are any (tests)."""
        pooled = self._pooled or await self._checkout()
        checkout = self._engine.sync_engine.pool.dispatch.checkout
        if checkout:  # listeners (none in production): in a greenlet, they may use the connection
            async with self._listened:
                await greenlet_spawn(checkout, pooled.dbapi_connection, pooled._connection_record, pooled)
                return self._commit(pooled, work)
        return self._commit(pooled, work)

    def _commit(self, pooled: Any, work: Callable[[sqlite3.Connection], T]) -> tuple[T] | None:
        sqlite: sqlite3.Connection = pooled.driver_connection._conn
        if sqlite.in_transaction:  # nobody leaves one open; if one is, the trip
            return None
        try:
            result = committed(sqlite, work)
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorcode", -1) & 0xFF == _SQLITE_BUSY:
                return None
            raise
        self.commits_since_trip += 1
        return (result,)

    async def _checkout(self) -> Any:
        pooled: Any = await self._engine.raw_connection()
        if self._pooled is not None:  # another commit checked one out meanwhile
            await greenlet_spawn(pooled.close)
            return self._pooled
        sqlite = pooled.driver_connection._conn
        sqlite.execute("PRAGMA busy_timeout=0")
        sqlite.execute("PRAGMA wal_autocheckpoint=0")
        self._pooled = pooled
        return pooled

    async def close(self) -> None:
        """Back to the pool, as any other pooled connection is (before the engine's dispose). In a greenlet:
        a pool that is full closes the connection it takes back, which awaits aiosqlite's close."""
        pooled: Any = self._pooled
        self._pooled = None
        if pooled is None:
            return
        sqlite = pooled.driver_connection._conn
        sqlite.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_ms)}")
        sqlite.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT}")
        await greenlet_spawn(pooled.close)
