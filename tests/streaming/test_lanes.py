"""Whose turn it is to write (app.streaming.log.write_order), in the write-behind on SQLite and PostgreSQL: a
session's writes go one at a time and in order; on PostgreSQL another session's turn write and a batch
commit while one session's turn write is still open (proven by holding that write open until they are
delivered), and on SQLite they wait for it (one writer at a time)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from app.storage.engine import Database
from app.streaming.frames import Draft
from app.streaming.log.write_behind import WriteBehind
from app.streaming.log.write_order import WriteOrder
from tests.streaming.test_writer import Delivered, delta, frame, logged
from tests.support.rows import add_sessions

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    db = Database(database_url)
    await add_sessions(db, "s_a", "s_b", "s_c")
    yield db
    await db.dispose()


def publish(writer: WriteBehind, session_id: str, draft: Draft) -> None:
    writer.add(Draft(session_id, draft.type, draft.rest))


async def test_other_sessions_commit_while_one_sessions_write_is_open(database: Database) -> None:
    delivered = Delivered()
    writer = WriteBehind(database, interval=60.0, deliver=delivered)
    publish(writer, "s_a", delta(1))  # pending when s_a's write opens: it commits with that write
    publish(writer, "s_c", delta(1))  # another session's streamed text: the batch's
    opened, release = asyncio.Event(), asyncio.Event()

    async def long_write() -> None:
        async with writer.transaction("s_a"):
            publish(writer, "s_a", frame(2))
            opened.set()
            await release.wait()

    async def other_write() -> None:
        async with writer.transaction("s_b"):
            publish(writer, "s_b", frame(1))

    held = asyncio.create_task(long_write())
    await opened.wait()
    other = asyncio.create_task(other_write())
    batch = asyncio.create_task(writer.flush())
    concurrent = database.dialect == "postgresql"
    if concurrent:
        await asyncio.wait_for(asyncio.gather(other, batch), 10)
        # Committed and delivered while s_a's write is still open; the batch left s_a's delta to it.
        assert sorted(delivered.seqs) == [("s_b", 1), ("s_c", 1)]
        assert not held.done()
    else:
        await asyncio.sleep(0.2)
        assert delivered.seqs == [] and not other.done() and not batch.done()
    release.set()
    await asyncio.wait_for(asyncio.gather(held, other, batch), 10)
    assert [seq for sid, seq in delivered.seqs if sid == "s_a"] == [1, 2]
    assert sorted(await logged(database)) == [("s_a", 1), ("s_a", 2), ("s_b", 1), ("s_c", 1)]


async def test_a_sessions_second_write_waits_for_its_first(database: Database) -> None:
    delivered = Delivered()
    writer = WriteBehind(database, interval=60.0, deliver=delivered)
    release = asyncio.Event()
    order: list[str] = []

    async def write(name: str, seq: int, wait: bool) -> None:
        async with writer.transaction("s_a"):
            order.append(f"{name} in")
            publish(writer, "s_a", frame(seq))
            if wait:
                await release.wait()
            order.append(f"{name} out")

    first = asyncio.create_task(write("first", 1, True))
    await asyncio.sleep(0.05)
    second = asyncio.create_task(write("second", 2, False))
    await asyncio.sleep(0.1)
    assert order == ["first in"]
    release.set()
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert order == ["first in", "first out", "second in", "second out"]
    assert delivered.seqs == [("s_a", 1), ("s_a", 2)]


async def test_a_cancelled_waiter_leaves_the_write_it_waited_for_alone() -> None:
    lanes = WriteOrder(serial=False)
    release = asyncio.Event()

    async def holder() -> None:
        async with lanes.session("s_a"):
            await release.wait()

    held = asyncio.create_task(holder())
    await asyncio.sleep(0)
    assert lanes.busy("s_a")

    async def waiter() -> None:
        async with lanes.session("s_a"):
            pass

    waiting = asyncio.create_task(waiter())
    await asyncio.sleep(0.01)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert not held.done()
    release.set()
    await held
    assert not lanes.busy("s_a")
    async with asyncio.timeout(1), lanes.session("s_a"):
        assert lanes.busy("s_a")
