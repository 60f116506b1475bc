"""SQLite: a write-behind batch and its commit in one trip to the driver's thread.

aiosqlite runs each call in its connection's own thread: the call is queued, the thread wakes and runs
it, and the result comes back through the event loop, where it waits its turn behind whatever else is
ready. A batch of the write-behind (the rows of responses that started streaming, the texts of those
still streaming, the numbered events, the log's trim) was a trip for each and one for its commit, on the
path of every response's first token (streaming.writer). Here the statements and the commit are one
function run in that thread (engine.Database.in_driver_thread); a small urgent batch (a response's first
delta) runs it on the event loop's own thread when SQLite's write lock is free (storage.loop_writes).

The new rows go in with ON CONFLICT DO NOTHING: when the id of one of them is held (48 random bits
collide, rarely), nothing of the batch is written and the caller writes it the long way, where
repository.insert_messages gives the row a fresh id.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from functools import partial
from typing import Any

from app.storage.engine import Database
from app.storage.event_log import INSERT_EVENTS, PRUNE_EVENTS
from app.storage.repository import INSERT_NEW_MESSAGE, SET_MESSAGE_TEXT, message_params
from app.storage.tables import ChatMessageRow


@dataclass(frozen=True, slots=True)
class BatchWrites:
    """What one batch writes, in this order."""

    # Rows of streamed messages not inserted yet (their text so far in `content`).
    messages: list[ChatMessageRow]
    # (message id, content) of streamed messages inserted already.
    texts: list[tuple[str, str]]
    # (session_id, seq, type, data): the numbered events.
    events: list[tuple[str, int, str, str]]
    # (session_id, keep_after): each session's events with seq <= keep_after go.
    cutoffs: list[tuple[str, int]]


class _IdHeld(Exception):
    """A new row's id is held by another row: the batch is rolled back."""


# An urgent batch up to this size (its texts and events, in characters) is first tried on the event loop's
# thread (engine.Database.in_driver_thread's `on_loop`): a response's first delta is some hundreds.
ON_LOOP_LIMIT = 8_192


def small(writes: BatchWrites) -> bool:
    """Whether the batch is small enough to be written on the event loop's own thread: a trim of the log
    (some tenth of a session's retention deleted) is not."""
    size = sum(len(row.content or "") for row in writes.messages)
    size += sum(len(text) for _, text in writes.texts) + sum(len(event[3]) for event in writes.events)
    return size <= ON_LOOP_LIMIT and not writes.cutoffs


async def write_batch(database: Database, writes: BatchWrites, *, on_loop: bool = False) -> bool:
    """Writes and commits the batch in one trip (`on_loop`: see Database.in_driver_thread); False
    (nothing written) when a new row's id is held. Storage's errors are sqlite3's own
    (errors.storage_refusal reads them)."""
    rows = [message_params(row) for row in writes.messages]
    texts = [(text, message_id) for message_id, text in writes.texts]
    work = partial(_write, rows, texts, writes.events, writes.cutoffs)
    try:
        await database.in_driver_thread(work, on_loop=on_loop and small(writes))
    except _IdHeld:
        return False
    return True


def _write(
    rows: list[tuple[Any, ...]],
    texts: list[tuple[str, str]],
    events: list[tuple[str, int, str, str]],
    cutoffs: list[tuple[str, int]],
    connection: sqlite3.Connection,
) -> None:
    """In the driver's thread, inside the transaction it commits."""
    if rows and connection.executemany(INSERT_NEW_MESSAGE, rows).rowcount != len(rows):
        raise _IdHeld
    if texts:
        connection.executemany(SET_MESSAGE_TEXT, texts)
    if events:
        connection.executemany(INSERT_EVENTS, events)
    if cutoffs:
        connection.executemany(PRUNE_EVENTS, cutoffs)
