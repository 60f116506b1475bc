"""Write-behind persistence for the hot path: the event log and streamed text, in one periodic batch.

Nothing is written per text delta. Every `interval` one short transaction inserts the events published
since the last batch and updates the text of assistant messages still streaming (at most every
`text_interval`). Everything else (user messages, response ends, tool results, turn ends) is written
directly by the turn, because those moments must be durable when they are announced.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

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


class WriteBehind:
    def __init__(self, db: Database, *, interval: float = 0.1, text_interval: float = 1.0) -> None:
        self._db = db
        self._interval = interval
        self._text_interval = text_interval
        self._events: list[dict[str, object]] = []
        self._texts: dict[str, TextBuffer] = {}
        self._forgotten: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.commits = 0

    def sink(self) -> Callable[[str, Frame], None]:
        events = self._events

        def add(session_id: str, frame: Frame) -> None:
            events.append(
                {"session_id": session_id, "seq": frame.seq, "type": frame.type, "data": frame.data}
            )

        return add

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
            events = [e for e in self._events if e["session_id"] not in self._forgotten]
            snapshots = [(b, b.text(), len(b.parts)) for b in texts]
            async with self._db.session() as db:
                if events:
                    await repository.insert_events(db, events)
                for buffer, text, _ in snapshots:
                    await repository.update_message(db, buffer.message_id, {"content": text})
                await db.commit()
            self.commits += 1
            del self._events[:taken]
            for buffer, _, count in snapshots:
                buffer.flushed_len = count
                buffer.flushed_at = now

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.flush()
