"""Whose turn it is to write: one write at a time per session, different sessions' writes at once.

The write-behind (streaming.log.write_behind) writes a session's events and rows in order: a turn's
transaction
waits for a batch that took its session, and a batch leaves out the sessions whose turn write is open.
Different sessions' writes need no order between them, so on PostgreSQL each goes on its own pooled
connection at once. SQLite takes one writer at a time: there every write also takes the one lock
(`exclusive`), in the process, instead of waiting out busy timeouts in the database.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager, nullcontext


class WriteOrder:
    def __init__(self, *, serial: bool) -> None:
        # Sessions with a write under way, each with the future that write's end resolves.
        self._busy: dict[str, asyncio.Future[None]] = {}
        self._serial = asyncio.Lock() if serial else None

    def busy(self, session_id: str) -> bool:
        return session_id in self._busy

    def exclusive(self) -> AbstractAsyncContextManager[object]:
        """The whole database to one writer (SQLite); nothing otherwise."""
        return self._serial if self._serial is not None else nullcontext()

    @contextmanager
    def holding(self, sessions: Iterable[str]) -> Iterator[None]:
        """Marks `sessions`, none of them busy, busy until the block ends (a batch takes only free ones)."""
        held = list(sessions)
        done = asyncio.get_running_loop().create_future()
        for session_id in held:
            self._busy[session_id] = done
        try:
            yield
        finally:
            for session_id in held:
                if self._busy.get(session_id) is done:
                    del self._busy[session_id]
            done.set_result(None)

    @asynccontextmanager
    async def session(self, session_id: str) -> AsyncIterator[None]:
        """The session's turn to write: after its writes under way (a batch's, another transaction's)."""
        while (busy := self._busy.get(session_id)) is not None:
            # Shielded: a waiter's cancellation must not cancel the write it waits for.
            await asyncio.shield(busy)
        with self.holding((session_id,)):
            yield
