"""The write-behind's batch on SQLite when this process numbers the events: numbered here, then written
and committed in one trip to the driver's thread (storage.one_trip), or, for an urgent batch that is
small, on the event loop's own thread when the write lock is free (storage.loop_writes): the path of
every response's first token (streaming.writer)."""

from __future__ import annotations

from app.storage.engine import Database
from app.storage.one_trip import BatchWrites, write_batch
from app.streaming.commit import in_caller
from app.streaming.frames import Draft, Frame
from app.streaming.retention import Retention
from app.streaming.sequencing import LocalBatch
from app.streaming.texts import TextBuffer, texts_to_write


async def write_in_one_trip(
    database: Database,
    numbers: LocalBatch,
    drafts: list[Draft],
    texts: list[TextBuffer],
    retention: Retention | None,
    kind: str,
) -> tuple[list[tuple[str, Frame]], list[tuple[TextBuffer, int]]] | None:
    """Commits the batch; returns its frames and what `texts.mark_written` notes, or None, with nothing
    written, when it must take the long way: a session whose last number this process does not know yet
    (its first events since the start), or a new row whose id another row holds (insert_messages
    renames it). Returns right after the commit (no await: the caller delivers before a cancellation
    can come, see storage's Database.in_driver_thread)."""
    frames = numbers.number_known(drafts)
    if frames is None:
        return None
    rows, updates, written = texts_to_write(texts)
    cutoffs = retention.cutoffs(frames, exact=False) if retention is not None else []
    writes = BatchWrites(rows, updates, [(sid, f.seq, f.type, f.data) for sid, f in frames], cutoffs)
    # An urgent batch (a response's first delta) is tried on the loop's thread when it is small.
    if not await in_caller(write_batch(database, writes, on_loop=kind == "urgent"), kind):
        return None
    return frames, written
