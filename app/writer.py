"""Write-behind persistence for the hot path: the event log and streamed text, in one periodic batch.

Nothing is written per text delta. Every `interval` one short transaction inserts the events published
since the last batch, trims each of their sessions' logs to the newest `retention` events, and updates the
text of assistant messages still streaming (at most every `text_interval`). Only after that commit are
the events handed to the broker for delivery: a client never sees an event the log could lose.
Everything else (user messages, response ends, tool results, turn ends) is written directly by the turn,
because those moments must be durable when they are announced.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

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
        interval: float = 0.05,
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
        self.commits = 0

    def sink(self) -> Callable[[str, Frame], None]:
        events = self._events

        def add(session_id: str, frame: Frame) -> None:
            events.append((session_id, frame))

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
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.flush(force_text=False)
            except Exception:
                log.exception("write-behind flush failed; will retry")

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
                if events:
                    await repository.insert_events(db, [_row(sid, frame) for sid, frame in events])
                    await self._prune(db, events)
                for buffer, text, _ in snapshots:
                    await repository.update_message(db, buffer.message_id, {"content": text})
                await db.commit()
            self.commits += 1
            del self._events[:taken]
            for buffer, _, count in snapshots:
                buffer.flushed_len = count
                buffer.flushed_at = now
            if events and self._deliver is not None:
                self._deliver(events)

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
