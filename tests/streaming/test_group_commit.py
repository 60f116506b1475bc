"""app.streaming.group_commit's `opened`: a response's first delta committed by its turn's own task when
no batch is under way, left to the write-behind's task when one is, and left pending (and retried by
that task) when storage refuses it. Against a real migrated SQLite file, as tests/streaming/test_writer.py."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator

import pytest

from app.storage import repository
from app.storage.engine import Database
from app.streaming.frames import Draft
from app.streaming.group_commit import GroupCommit
from app.streaming.writer import WriteBehind
from tests.streaming.test_writer import Delivered, first_text, wait_for
from tests.support.rows import add_sessions

pytestmark = pytest.mark.anyio


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    db = Database(database_url)
    await add_sessions(db, "s_a", "s_b")
    yield db
    await db.dispose()


def open_message(writer: WriteBehind, session_id: str, message_id: str) -> None:
    """What the turn's recorder does at a response's first text: the row's buffer, its first delta."""
    writer.track(first_text(session_id, message_id))
    writer.add(Draft(session_id, "text_delta", f',"id":"{message_id}","text":"Hi"}}'))


async def paced(writer: WriteBehind) -> None:
    """An interval batch commits now (another session's event): the next is `interval` (60 s) away, so
    only urgent work can commit before a test's deadline."""
    writer.add(Draft("s_b", "agent_status", ',"status":"idle"}'))
    await writer.flush(force_text=False)


async def stored(database: Database, session_id: str) -> list[str]:
    async with database.session() as db:
        return [r.id for r in await repository.list_messages(db, session_id)]


async def test_a_first_delta_is_committed_by_the_task_that_opened_it(database: Database) -> None:
    """No batch under way: `opened` returns with the row and the delta committed and delivered, and the
    write-behind's task, woken by the same work, finds nothing left to commit."""
    delivered = Delivered()
    writer = WriteBehind(database, interval=60.0, deliver=delivered)
    writer.start()
    try:
        open_message(writer, "s_a", "m_a")
        await writer.opened("s_a")
        assert delivered.seqs == [("s_a", 1)]
        assert await stored(database, "s_a") == ["m_a"]
        assert writer.urgent_commits == 1
        await asyncio.sleep(0.2)
        assert writer.urgent_commits == 1  # the write-behind's task committed nothing more
    finally:
        await writer.stop()


async def test_while_a_batch_is_under_way_the_first_delta_goes_with_the_next_urgent_batch(
    database: Database,
) -> None:
    delivered = Delivered()
    writer = WriteBehind(database, interval=60.0, deliver=delivered)
    writer.start()
    try:
        async with writer._batches:  # a batch under way
            open_message(writer, "s_a", "m_a")
            open_message(writer, "s_b", "m_b")
            await writer.opened("s_a")  # returns at once: nothing committed yet
            await writer.opened("s_b")
            assert delivered.seqs == [] and writer.urgent_commits == 0
        # Both in the one urgent batch that follows (the group commit).
        await wait_for(lambda: len(delivered.seqs) == 2)
        assert sorted(delivered.seqs) == [("s_a", 1), ("s_b", 1)]
        assert writer.urgent_commits == 1
        assert (await stored(database, "s_a"), await stored(database, "s_b")) == (["m_a"], ["m_b"])
    finally:
        await writer.stop()


async def test_a_first_delta_storage_refuses_stays_pending_for_the_write_behind(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn's task gets no error (the turn reads `failure` at its next chunk, as when a batch of the
    write-behind's task fails); the work stays pending and urgent, and that task commits it once storage
    takes writes again."""
    delivered = Delivered()
    writer = WriteBehind(database, interval=60.0, deliver=delivered)
    flush = writer.flush
    refusals = 1

    async def refusing(**kwargs: object) -> None:
        nonlocal refusals
        if refusals:
            refusals -= 1
            raise sqlite3.OperationalError("database or disk is full")
        await flush(**kwargs)  # type: ignore[arg-type]

    await paced(writer)
    monkeypatch.setattr(writer, "flush", refusing)
    open_message(writer, "s_a", "m_a")
    await writer.opened("s_a")
    assert delivered.seqs == [("s_b", 1)]
    assert writer.failure is not None and writer.failure.code == "storage_full"
    writer.start()
    try:
        await wait_for(lambda: ("s_a", 1) in delivered.seqs)
        await wait_for(lambda: writer.failure is None)
        assert await stored(database, "s_a") == ["m_a"]
    finally:
        await writer.stop()


async def test_a_turn_cancelled_before_its_first_delta_commits_leaves_it_to_the_write_behind(
    database: Database,
) -> None:
    delivered = Delivered()
    writer = WriteBehind(database, interval=60.0, deliver=delivered)
    await paced(writer)
    open_message(writer, "s_a", "m_a")
    async with writer._lanes.exclusive():  # another write holds SQLite's lane: opened waits for it
        opening = asyncio.create_task(GroupCommit.opened(writer, "s_a"))
        await asyncio.sleep(0.05)
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
    assert delivered.seqs == [("s_b", 1)]
    writer.start()
    try:
        await wait_for(lambda: delivered.seqs == [("s_b", 1), ("s_a", 1)])
        assert await stored(database, "s_a") == ["m_a"]
    finally:
        await writer.stop()
