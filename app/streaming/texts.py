"""An assistant message's text while it streams: what the write-behind (streaming.writer) persists."""

from __future__ import annotations

import time

from app.storage.tables import ChatMessageRow


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
