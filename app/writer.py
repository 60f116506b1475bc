"""Write-behind persistence for the hot path: the event log and streamed text, in one periodic batch.

Nothing is written per text delta. One short transaction inserts the events published since the last
batch, trims each of their sessions' logs to the newest `retention` events, and updates the text of
assistant messages still streaming (at most every `text_interval`). Only after that commit are the events
handed to the broker for delivery: a client never sees an event the log could lose.

Batches are rate limited, not clocked: the first event after a quiet spell is committed at once (on the
next turn of the loop, so a burst published together shares the commit), and while events keep coming
commits are at least `interval` apart. So a lone client sees its first token without waiting for a
tick, and under load the process makes at most one batch commit per `interval`.

Everything else (user messages, response ends, tool results, turn ends) is written by the turn itself,
because those moments must be durable when they are announced. It writes them in `transaction()`, which
also commits that session's pending events (the ones it just announced included) and delivers them right
after the commit: an event and the row it announces are durable together, and a stop or the end of a turn
reaches clients without waiting for the next batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress

from sqlmodel.ext.asyncio.session import AsyncSession

from app import repository
from app.broker import Frame
from app.db import Database

log = logging.getLogger(__name__)


class TextBuffer:
    """An assistant message's text while it streams; the writer persists its current content."""

    __slots__ = ("flushed_at", "flushed_len", "message_id", "parts", "session_id")

    def __init__(self, session_id: str, message_id: str, first: str) -> None:
        self.session_id = session_id
        self.message_id = message_id
        self.parts: list[str] = [first]
        self.flushed_len = len(self.parts)
        self.flushed_at = time.monotonic()

    def text(self) -> str:
        return "".join(self.parts)


Deliver = Callable[[Sequence[tuple[str, Frame]]], None]


class WriteBehind:
    def __init__(
        self,
        db: Database,
        *,
        interval: float = 0.1,
        text_interval: float = 1.0,
        retention: int | None = None,
        deliver: Deliver | None = None,
    ) -> None:
        self._db = db
        self._interval = interval
        self._text_interval = text_interval
        self._retention = retention
        self._deliver = deliver
        self._events: list[tuple[str, Frame]] = []
        self._texts: dict[str, TextBuffer] = {}
        self._forgotten: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._pending = asyncio.Event()
        self._last_commit = 0.0
        # Batch commits (the periodic flush), and turn writes that carried pending events with them.
        self.batch_commits = 0
        self.turn_commits = 0

    def sink(self) -> Callable[[str, Frame], None]:
        events = self._events
        pending = self._pending

        def add(session_id: str, frame: Frame) -> None:
            events.append((session_id, frame))
            if not pending.is_set():
                pending.set()

        return add

    def deliver_to(self, deliver: Deliver) -> None:
        """Where committed events go (the broker); set once, after both exist."""
        self._deliver = deliver

    def track(self, buffer: TextBuffer) -> None:
        self._texts[buffer.message_id] = buffer

    def untrack(self, buffer: TextBuffer) -> None:
        self._texts.pop(buffer.message_id, None)

    def forget_session(self, session_id: str) -> None:
        """The session was deleted: its pending rows would only violate foreign keys."""
        self._forgotten.add(session_id)
        for key in [k for k, b in self._texts.items() if b.session_id == session_id]:
            del self._texts[key]

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="write-behind")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # Streamed text needs a flush every text_interval even when no event comes.
            with suppress(TimeoutError):
                await asyncio.wait_for(self._pending.wait(), timeout=self._text_interval)
            wait = self._last_commit + self._interval - loop.time()
            # After a quiet spell: one turn of the loop, so events published together share the commit.
            await asyncio.sleep(wait if wait > 0 else 0)
            self._pending.clear()
            try:
                await self.flush(force_text=False)
            except Exception:
                log.exception("write-behind flush failed; will retry")
                self._pending.set()
                await asyncio.sleep(self._interval)

    async def flush(self, *, force_text: bool = True) -> None:
        async with self._lock:
            now = time.monotonic()
            texts = [
                b
                for b in self._texts.values()
                if len(b.parts) != b.flushed_len and (force_text or now - b.flushed_at >= self._text_interval)
            ]
            if not self._events and not texts:
                return
            taken = len(self._events)
            events = [(sid, frame) for sid, frame in self._events[:taken] if sid not in self._forgotten]
            snapshots = [(b, b.text(), len(b.parts)) for b in texts]
            async with self._db.session() as db:
                await self._log(db, events)
                for buffer, text, _ in snapshots:
                    await repository.update_message(db, buffer.message_id, {"content": text})
                await db.commit()
            self.batch_commits += 1
            self._last_commit = asyncio.get_running_loop().time()
            del self._events[:taken]
            for buffer, _, count in snapshots:
                buffer.flushed_len = count
                buffer.flushed_at = now
            if events and self._deliver is not None:
                self._deliver(events)

    @asynccontextmanager
    async def transaction(self, session_id: str) -> AsyncIterator[AsyncSession]:
        """A turn's own write: commits with it the session's pending events, then delivers them.

        Events published inside the block are part of the commit. Batches of other sessions wait for the
        block (it holds the writer's lock), so this session's frames are still delivered in order.
        If the block or its commit fails, its events stay pending for the next batch.
        """
        async with self._lock:
            async with self._db.session() as db:
                yield db
                mine = [item for item in self._events if item[0] == session_id]
                await self._log(db, [item for item in mine if session_id not in self._forgotten])
                await db.commit()
            if mine:
                self.turn_commits += 1
                taken = {id(item) for item in mine}
                self._events[:] = [item for item in self._events if id(item) not in taken]
        if mine and self._deliver is not None and session_id not in self._forgotten:
            self._deliver(mine)

    async def _log(self, db: AsyncSession, events: list[tuple[str, Frame]]) -> None:
        if events:
            await repository.insert_events(db, [_row(sid, frame) for sid, frame in events])
            await self._prune(db, events)

    async def _prune(self, db: AsyncSession, events: list[tuple[str, Frame]]) -> None:
        """Once per batch and session: keep the newest `retention` events."""
        if self._retention is None:
            return
        heads: dict[str, int] = {}
        for session_id, frame in events:
            heads[session_id] = frame.seq
        for session_id, head in heads.items():
            if head > self._retention:
                await repository.prune_events(db, session_id, keep_after=head - self._retention)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.flush()


def _row(session_id: str, frame: Frame) -> dict[str, object]:
    return {"session_id": session_id, "seq": frame.seq, "type": frame.type, "data": frame.data}
