"""LocalSequencer (app.streaming.log.sequencing) on a real migrated SQLite file: where its counters start,
what a
batch that never commits leaves behind, and what `forget` drops. The write-behind that uses it:
test_writer.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from app.storage import event_log
from app.storage.engine import Database
from app.streaming.log.sequencing import LocalSequencer

pytestmark = pytest.mark.anyio

LOGGED, EMPTY = "s_logged", "s_empty"


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    """The log holds events 1..3 of LOGGED and none of EMPTY."""
    database = Database(database_url)
    async with database.session() as db:
        rows = [{"session_id": LOGGED, "seq": n, "type": "agent_status", "data": "{}"} for n in (1, 2, 3)]
        await event_log.insert_events(db, rows)
        await db.commit()
    yield database
    await database.dispose()


async def test_numbers_continue_from_the_log_for_a_session_never_seen(database: Database) -> None:
    batch = LocalSequencer().begin()
    async with database.session() as db:
        assert await batch.take(db, LOGGED, 2) == 4
        assert await batch.take(db, LOGGED, 1) == 6  # after the 2 just taken in the same batch
        assert await batch.take(db, EMPTY, 1) == 1


async def test_two_sessions_in_one_batch_are_numbered_independently(database: Database) -> None:
    batch = LocalSequencer().begin()
    async with database.session() as db:
        taken = [
            await batch.take(db, LOGGED, 1),
            await batch.take(db, EMPTY, 2),
            await batch.take(db, LOGGED, 1),
            await batch.take(db, EMPTY, 1),
        ]
    assert taken == [4, 1, 5, 3]


async def test_numbers_of_a_batch_that_never_committed_are_handed_out_again(database: Database) -> None:
    sequencer = LocalSequencer()
    async with database.session() as db:
        assert await sequencer.begin().take(db, LOGGED, 5) == 4  # rolled back: never committed()
        again = sequencer.begin()
        assert await again.take(db, LOGGED, 2) == 4
        again.committed()
        # Committed numbers are kept in memory: the next batch goes on from 5 though nothing was logged.
        assert await sequencer.begin().take(db, LOGGED, 1) == 6


async def test_forget_makes_the_sequencer_read_the_log_again(database: Database) -> None:
    sequencer = LocalSequencer()
    async with database.session() as db:
        batch = sequencer.begin()
        await batch.take(db, LOGGED, 10)
        batch.committed()
        assert await sequencer.begin().take(db, LOGGED, 1) == 14
        sequencer.forget(LOGGED)
        sequencer.forget("s_never_seen")  # nothing to drop: no error
        assert await sequencer.begin().take(db, LOGGED, 1) == 4  # the log still ends at 3
