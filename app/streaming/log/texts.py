"""An assistant message's text while it streams: what the write-behind (streaming.log.write_behind)
persists."""

from __future__ import annotations

import time
from collections.abc import Iterable

from sqlmodel.ext.asyncio.session import AsyncSession

from app.protocol.ids import new_message_id
from app.storage import repository
from app.storage.tables import ChatMessageRow
from app.streaming.frames import json_string
from app.streaming.log.pending_events import PendingEvents


class TextBuffer:
    """An assistant message's text while it streams; the writer persists its current content.

    `row` is the message's row until the first commit inserts it (with the text so far): the first delta
    of a response costs no transaction of its own, and its event goes out with that commit.
    """

    __slots__ = ("flushed_at", "flushed_len", "message_id", "parts", "row", "session_id")

    def __init__(self, row: ChatMessageRow) -> None:
        self.session_id = row.session_id
        self.message_id = row.id
        self.parts: list[str] = [row.content or ""]
        self.row: ChatMessageRow | None = row
        self.flushed_len = 0
        self.flushed_at = time.monotonic()

    def text(self) -> str:
        return "".join(self.parts)

    def snapshot(self) -> tuple[str, int]:
        parts = self.parts
        if len(parts) > 1:
            # Joined once here instead of at every later flush and at the end.
            parts[:] = ["".join(parts)]
        return parts[0], len(parts)


def due_texts(
    buffers: Iterable[TextBuffer], *, now: float, force: bool, interval: float, scope: set[str] | None
) -> list[TextBuffer]:
    """The buffers a batch writes: rows to insert, and texts changed since the last write and due (every
    `interval`, or at once with `force`); with a `scope`, only its sessions' buffers."""
    return [
        b
        for b in buffers
        if (scope is None or b.session_id in scope)
        and (
            b.row is not None or (len(b.parts) != b.flushed_len and (force or now - b.flushed_at >= interval))
        )
    ]


def rename(texts: dict[str, TextBuffer], events: PendingEvents, renamed: dict[str, str]) -> None:
    """Streamed messages whose id another message held got fresh ids on insert: their buffers (in the
    writer's `texts`) and their events not committed yet (all of them: the first delta's event commits
    with the row) take the new id, so clients only ever see it."""
    for old, new in renamed.items():
        buffer = texts.pop(old, None)
        if buffer is None:
            continue
        buffer.message_id = new
        texts[new] = buffer
        mark, fresh = f',"id":{json_string(old)},', f',"id":{json_string(new)},'
        drafts = events.session(buffer.session_id)
        for i, draft in enumerate(drafts):
            if draft.type in ("text_delta", "reasoning_delta"):
                drafts[i] = draft._replace(rest=draft.rest.replace(mark, fresh, 1))


def texts_to_write(
    buffers: list[TextBuffer],
) -> tuple[list[ChatMessageRow], list[tuple[str, str]], list[tuple[TextBuffer, int]]]:
    """What a commit writes of these buffers: the rows not inserted yet (with their text so far), the
    (message id, text) of the others, and what `mark_written` notes once it committed."""
    rows: list[ChatMessageRow] = []
    updates: list[tuple[str, str]] = []
    written: list[tuple[TextBuffer, int]] = []
    for buffer in buffers:
        text, count = buffer.snapshot()
        row = buffer.row
        if row is not None:
            # Into the dict, not through SQLAlchemy's instrumentation (16 us): a row not inserted yet is
            # read from there, by the plain-SQL insert (repository.message_params).
            row.__dict__["content"] = text
            rows.append(row)
        else:
            updates.append((buffer.message_id, text))
        written.append((buffer, count))
    return rows, updates, written


async def write_texts(
    db: AsyncSession, buffers: list[TextBuffer], texts: dict[str, TextBuffer], events: PendingEvents
) -> list[tuple[TextBuffer, int]]:
    """Inserts the rows of buffers that have none yet and updates the others' text in `db`'s transaction
    (a renamed row renames its buffer in `texts` and its drafts in `events`); returns what was written,
    for `mark_written` once the commit succeeded."""
    rows, updates, written = texts_to_write(buffers)
    renamed = await repository.insert_messages(db, rows, new_message_id)
    if renamed:
        rename(texts, events, renamed)
    await repository.set_message_texts(db, updates)
    return written


def mark_written(written: list[tuple[TextBuffer, int]], now: float) -> None:
    for buffer, count in written:
        buffer.row = None
        buffer.flushed_len = count
        buffer.flushed_at = now
