"""CounterSequencer (app.streaming.log.sequencing), the multi-process numbering, on SQLite and PostgreSQL:
numbers come from the session's counter row in the logging transaction. How it proves it: two
write-behinds on two engines (two connection pools, as two replicas have) log events of one session
at once, and the log must hold 1..N, each number once; a batch rolled back returns its numbers; a
database that ran single-process (counter 0, log at 3) goes on from the log; a deleted session's events
are dropped, never logged."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from app.protocol.events import AgentStatus, TextDelta
from app.storage import event_log
from app.storage.engine import Database
from app.streaming.frames import Frame, draft
from app.streaming.log.sequencing import CounterSequencer
from app.streaming.log.write_behind import WriteBehind
from tests.support.rows import add_sessions

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

SID = "s_counted"


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    """SID exists with events 1..3 logged by a single process (its counter still 0)."""
    database = Database(database_url)
    await add_sessions(database, SID)
    async with database.session() as db:
        rows = [{"session_id": SID, "seq": n, "type": "agent_status", "data": "{}"} for n in (1, 2, 3)]
        await event_log.insert_events(db, rows)
        await db.commit()
    yield database
    await database.dispose()


async def test_numbers_go_on_from_the_log_and_a_rollback_returns_them(database: Database) -> None:
    sequencer = CounterSequencer()
    async with database.session() as db:
        assert await sequencer.begin().take(db, SID, 2) == 4
        await db.rollback()
    async with database.session() as db:
        batch = sequencer.begin()
        assert await batch.take(db, SID, 2) == 4  # the rolled-back numbers again
        assert await batch.take(db, SID, 1) == 6
        await db.commit()
        batch.committed()
    async with database.session() as db:
        assert await sequencer.begin().take(db, SID, 1) == 7
        assert await sequencer.begin().take(db, "s_deleted", 1) is None


async def test_two_writers_on_two_engines_never_take_a_number_twice(
    database_url: str, database: Database
) -> None:
    other = Database(database_url)
    writers = [WriteBehind(db, interval=5.0, sequencer=CounterSequencer()) for db in (database, other)]

    async def log_many(writer: WriteBehind) -> None:
        for _ in range(15):
            for _ in range(3):
                writer.add(draft(SID, AgentStatus, status="thinking", turn_id="t_1"))
            await writer.flush()

    try:
        await asyncio.gather(*(log_many(w) for w in writers))
        async with database.session() as db:
            seqs = [e.seq for e in await event_log.events_after(db, SID, 0, 1000)]
    finally:
        await other.dispose()
    assert seqs == list(range(1, 3 + 2 * 15 * 3 + 1))


async def test_the_events_of_a_deleted_session_are_dropped(database: Database) -> None:
    delivered: list[tuple[str, object]] = []
    writer = WriteBehind(database, interval=5.0, sequencer=CounterSequencer(), deliver=delivered.extend)
    writer.add(draft("s_gone", AgentStatus, status="thinking", turn_id="t_1"))
    writer.add(draft(SID, AgentStatus, status="idle", turn_id="t_1"))
    await writer.flush()
    async with database.session() as db:
        assert await event_log.events_after(db, "s_gone", 0, 10) == []
        assert [e.seq for e in await event_log.events_after(db, SID, 0, 10)] == [1, 2, 3, 4]
    assert [sid for sid, _ in delivered] == [SID]


async def test_batches_of_many_sessions_on_two_engines_number_each_session_once_without_deadlock(
    database_url: str, database: Database
) -> None:
    """Each batch numbers all its sessions at once (advance_counters); two writers publishing to the
    same twenty sessions in opposite orders, batch after batch: no deadlock (PostgreSQL would abort one
    batch), and every session's log is 1..N with each number once."""
    sids = [f"s_many_{n:02d}" for n in range(20)]
    await add_sessions(database, *sids)
    other = Database(database_url)
    writers = [WriteBehind(db, interval=5.0, sequencer=CounterSequencer()) for db in (database, other)]

    async def log_many(writer: WriteBehind, order: list[str]) -> None:
        for _ in range(10):
            for sid in order:
                writer.add(draft(sid, AgentStatus, status="thinking", turn_id="t_1"))
                writer.add(draft(sid, AgentStatus, status="idle", turn_id="t_1"))
            await writer.flush()

    try:
        await asyncio.gather(log_many(writers[0], sids), log_many(writers[1], sids[::-1]))
        async with database.session() as db:
            logged = {sid: [e.seq for e in await event_log.events_after(db, sid, 0, 1000)] for sid in sids}
    finally:
        await other.dispose()
    assert logged == {sid: list(range(1, 2 * 2 * 10 + 1)) for sid in sids}


async def test_the_log_holds_each_delivered_frame_byte_for_byte(database: Database) -> None:
    """On PostgreSQL the counters move and the events are logged by one statement, which writes each
    event's data with its number in it (sequencing._CounterBatch.log): the log must hold exactly the
    frames delivered, whatever the text (quotes, backslashes, newlines, non-ASCII), in batches of one
    session and of several."""
    other = "s_counted_other"
    await add_sessions(database, other)
    delivered: list[tuple[str, Frame]] = []
    writer = WriteBehind(database, interval=5.0, sequencer=CounterSequencer(), deliver=delivered.extend)
    texts = ['a "quoted" word', "back\\slash", "line\nbreak", "ünïcødé ✓ 中文", '{"seq":1}', "%s ? %b"]
    for text in texts:
        writer.add(draft(SID, TextDelta, id="m_1", text=text, turn_id="t_1"))
    await writer.flush()  # one session
    for text in texts:
        writer.add(draft(other, TextDelta, id="m_2", text=text, turn_id="t_2"))
        writer.add(draft(SID, TextDelta, id="m_1", text=text, turn_id="t_1"))
    await writer.flush()  # two sessions, interleaved
    async with database.session() as db:
        logged = {
            sid: [(e.seq, e.type, e.data) for e in await event_log.events_after(db, sid, 0, 100)]
            for sid in (SID, other)
        }
    sent = {sid: [(f.seq, f.type, f.data) for s, f in delivered if s == sid] for sid in (SID, other)}
    assert logged[SID][3:] == sent[SID] and logged[other] == sent[other]
    assert [seq for seq, _, _ in sent[SID]] == list(range(4, 4 + 2 * len(texts)))
    assert [json.loads(data)["text"] for _, _, data in sent[other]] == texts
    assert all(json.loads(data)["seq"] == seq for seq, _, data in sent[SID] + sent[other])
