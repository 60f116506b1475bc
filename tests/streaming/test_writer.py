"""The write-behind against a real migrated SQLite file: its group commit (urgent work at once, streamed
deltas at most once per interval; a response's first delta committed by the turn's task that opened it
when no batch is under way, left to the next urgent batch when one is, and left pending on a refusal or a
cancel), a batch's writes in one commit, and a turn's own transaction that commits
and delivers its session's pending events with its rows."""

from __future__ import annotations

import asyncio
import itertools
import json
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence

import pytest
from sqlalchemy import text
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from app.errors import StorageFull
from app.observability import hooks
from app.observability.monitor import CommitCounter
from app.protocol.events import TextDelta
from app.storage import event_log, repository
from app.storage.engine import Database
from app.storage.tables import ChatMessageRow, EventRow
from app.streaming.frames import Draft, Frame
from app.streaming.log import commit as commit_module
from app.streaming.log import write_behind as writer_module
from app.streaming.log.schedule import GroupCommit
from app.streaming.log.texts import TextBuffer
from app.streaming.log.write_behind import WriteBehind
from tests.support.rows import T0, add_sessions

pytestmark = pytest.mark.anyio


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    db = Database(database_url)
    await add_sessions(db, "s_a", "s_b")
    yield db
    await db.dispose()


class Delivered:
    def __init__(self) -> None:
        self.batches: list[list[tuple[str, int]]] = []

    def __call__(self, committed: Sequence[tuple[str, Frame]]) -> None:
        self.batches.append([(sid, frame.seq) for sid, frame in committed])

    @property
    def seqs(self) -> list[tuple[str, int]]:
        return [item for batch in self.batches for item in batch]


def frame(expected_seq: int, kind: str = "agent_status") -> Draft:
    """An event to publish; `expected_seq` is the number the writer must give it (asserted by the tests).
    An agent_status published outside a turn's write is urgent; a text_delta is not."""
    return Draft("", kind, f',"expected":{expected_seq}}}')


def delta(expected_seq: int) -> Draft:
    return frame(expected_seq, "text_delta")


def first_text(session_id: str, message_id: str) -> TextBuffer:
    return TextBuffer(
        ChatMessageRow(
            id=message_id,
            session_id=session_id,
            turn_id="t",
            type="text",
            role="assistant",
            content="Hi",
            timestamp=T0,
        )
    )


def sink_of(writer: WriteBehind) -> Callable[[str, Draft], None]:
    def add(session_id: str, draft: Draft) -> None:
        writer.add(Draft(session_id, draft.type, draft.rest))

    return add


async def logged(database: Database) -> list[tuple[str, int]]:
    async with database.session() as db:
        rows = (await db.exec(select(EventRow).order_by(col(EventRow.session_id), col(EventRow.seq)))).all()
    return [(r.session_id, r.seq) for r in rows]


def count_commits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When each of the writer's commits returned: every one goes through commit.settled."""
    times: list[float] = []
    loop = asyncio.get_running_loop()
    observed = hooks.commit_observed

    def counted(kind: str, seconds: float) -> None:
        times.append(loop.time())
        observed(kind, seconds)

    monkeypatch.setattr(commit_module, "commit_observed", counted)
    return times


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def test_the_first_event_after_a_quiet_spell_commits_without_waiting_for_a_tick(
    database: Database,
) -> None:
    delivered = Delivered()
    writer = WriteBehind(database, interval=5.0, deliver=delivered)
    writer.start()
    try:
        sink = sink_of(writer)
        sink("s_a", frame(1))
        sink("s_a", frame(2))  # published together: one batch
        # interval=5 s: only the quiet-spell rule can deliver this quickly.
        await wait_for(lambda: delivered.seqs == [("s_a", 1), ("s_a", 2)], timeout=2.0)
        assert delivered.batches == [[("s_a", 1), ("s_a", 2)]]
        assert await logged(database) == [("s_a", 1), ("s_a", 2)]
    finally:
        await writer.stop()


async def test_a_steady_stream_of_deltas_commits_at_most_once_per_interval(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """How 'at most one batch commit per interval under load' is proven: commits are counted with an
    SQLAlchemy listener while text deltas arrive every 2 ms for 0.6 s with a 0.1 s interval."""
    delivered = Delivered()
    writer = WriteBehind(database, interval=0.1, deliver=delivered)
    commits = count_commits(monkeypatch)
    loop = asyncio.get_running_loop()
    writer.start()
    began = loop.time()
    try:
        sink = sink_of(writer)
        for seq in range(1, 301):
            sink("s_a" if seq % 2 else "s_b", delta((seq + 1) // 2))
            await asyncio.sleep(0.002)
        await wait_for(lambda: len(delivered.seqs) == 300)
        took = loop.time() - began
    finally:
        await writer.stop()
    gaps = [b - a for a, b in itertools.pairwise(commits)]
    assert gaps, commits
    # Timers may fire a little early on a busy machine; 10% slack, no upper bound asserted.
    assert min(gaps) >= 0.09, gaps
    # The 300 sleeps of 2 ms last 0.6 s on a quiet machine, longer on a busy one: the bound is per the
    # time they took, not per 0.6 s.
    assert len(commits) <= took / 0.1 + 2, (len(commits), took)
    # Every event once, in order per session.
    for sid in ("s_a", "s_b"):
        assert [s for x, s in delivered.seqs if x == sid] == list(range(1, 151))


async def test_a_first_delta_commits_at_once_while_other_deltas_wait_for_the_interval(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group commit: a batch of deltas has just committed and the interval (5 s) has not passed, yet a
    response's first delta (its row not inserted) commits as soon as it comes, with its row, and only
    its own session's work: the other session's delta waits for its interval batch (here the last one,
    at stop), so an urgent commit fans out only to the streams it concerns."""
    delivered = Delivered()
    writer = WriteBehind(database, interval=5.0, deliver=delivered)
    commits = count_commits(monkeypatch)
    writer.start()
    try:
        sink = sink_of(writer)
        sink("s_b", delta(1))  # after a quiet spell: commits at once, and starts the 5 s interval
        await wait_for(lambda: delivered.seqs == [("s_b", 1)], timeout=2.0)
        sink("s_b", delta(2))  # not urgent: waits for the interval
        await asyncio.sleep(0.2)
        assert delivered.seqs == [("s_b", 1)]
        buffer = first_text("s_a", "m_first")
        writer.track(buffer)
        sink("s_a", delta(1))  # the first delta's event
        await wait_for(lambda: len(delivered.seqs) == 2, timeout=2.0)  # 2 s: well inside the 5 s interval
        assert delivered.batches[-1] == [("s_a", 1)]
        async with database.session() as db:
            stored = [(r.id, r.content) for r in await repository.list_messages(db, "s_a")]
        assert stored == [("m_first", "Hi")]
        assert (writer.batch_commits, writer.urgent_commits) == (1, 1)
        assert len(commits) == 2
    finally:
        await writer.stop()
    assert delivered.batches[-1] == [("s_b", 2)]  # the last batch, at stop


async def test_urgent_work_under_a_stream_of_deltas_keeps_deltas_to_one_batch_per_interval(
    database: Database,
) -> None:
    """Deltas every 2 ms and a status event every 30 ms for 0.6 s: each status commits without waiting
    for the interval (none waits near 0.1 s) and takes only its own session's events along, while the
    interval batches, which carry the deltas, stay at least 0.1 s apart."""
    delivered = Delivered()
    loop = asyncio.get_running_loop()
    published: dict[int, float] = {}
    arrived: dict[int, float] = {}

    def deliver(committed: Sequence[tuple[str, Frame]]) -> None:
        delivered(committed)
        for sid, f in committed:
            if sid == "s_b":
                arrived[f.seq] = loop.time()

    writer = WriteBehind(database, interval=0.1, deliver=deliver)
    batches: list[float] = []
    original = writer.flush

    urgent_sessions: set[str] = set()

    async def flush(*, force_text: bool = True, urgent: bool = False, scope: set[str] | None = None) -> None:
        if not urgent and not force_text:  # the loop's interval batches (stop() forces a last one)
            batches.append(loop.time())
        before = len(delivered.batches)
        await original(force_text=force_text, urgent=urgent, scope=scope)
        if urgent:
            urgent_sessions.update(sid for batch in delivered.batches[before:] for sid, _ in batch)

    writer.flush = flush  # type: ignore[method-assign]
    writer.start()
    try:
        sink = sink_of(writer)
        status = 0
        for n in range(1, 301):
            sink("s_a", delta(n))
            if n % 15 == 0:
                status += 1
                published[status] = loop.time()
                sink("s_b", frame(status))
            await asyncio.sleep(0.002)
        await wait_for(lambda: len(delivered.seqs) == 300 + status)
    finally:
        await writer.stop()
    assert status == 20 and sorted(arrived) == list(range(1, 21))
    waits = sorted(arrived[n] - published[n] for n in arrived)
    # The median status waits for one commit, not for half an interval (50 ms).
    assert waits[len(waits) // 2] < 0.04, waits
    gaps = [b - a for a, b in itertools.pairwise(batches)]
    assert gaps and min(gaps) >= 0.09, gaps
    # The urgent batches took the statuses' session alone: the deltas went with the interval batches.
    assert writer.urgent_commits > 0 and urgent_sessions == {"s_b"}, (writer.urgent_commits, urgent_sessions)
    assert [s for x, s in delivered.seqs if x == "s_a"] == list(range(1, 301))


async def test_events_published_inside_a_turn_write_do_not_trigger_a_batch(database: Database) -> None:
    """A turn's own write commits its events: they must not wake an urgent batch afterwards (it would
    commit other sessions' deltas early, one more commit per turn write)."""
    delivered = Delivered()
    writer = WriteBehind(database, interval=5.0, deliver=delivered)
    writer.start()
    try:
        sink = sink_of(writer)
        sink("s_b", delta(1))
        await wait_for(lambda: delivered.seqs == [("s_b", 1)], timeout=2.0)
        sink("s_b", delta(2))
        async with writer.transaction("s_a"):
            sink("s_a", frame(1))
        assert delivered.seqs[-1] == ("s_a", 1)
        await asyncio.sleep(0.3)
        assert delivered.seqs == [("s_b", 1), ("s_a", 1)]  # s_b's delta still waits for its interval
        assert writer.urgent_commits == 0
    finally:
        await writer.stop()


async def test_a_turn_transaction_commits_and_delivers_its_sessions_pending_events_with_its_rows(
    database: Database,
) -> None:
    delivered = Delivered()
    writer = WriteBehind(database, interval=60.0, deliver=delivered)  # no batch runs: no start()
    sink = sink_of(writer)
    sink("s_a", frame(1))
    sink("s_b", frame(1))
    sink("s_a", frame(2))
    row = ChatMessageRow(
        id="m_1", session_id="s_a", turn_id="t_1", type="turn_done", timestamp=T0, status="completed"
    )
    async with writer.transaction("s_a") as db:
        await repository.insert_messages(db, [row])
        sink("s_a", frame(3))  # announced inside: commits with the row
        assert delivered.batches == []  # nothing before the commit
    assert delivered.batches == [[("s_a", 1), ("s_a", 2), ("s_a", 3)]]
    assert await logged(database) == [("s_a", 1), ("s_a", 2), ("s_a", 3)]
    async with database.session() as db:
        stored = (await db.exec(select(ChatMessageRow).where(col(ChatMessageRow.id) == "m_1"))).all()
    assert len(stored) == 1
    # The other session's event is left to the next batch, and goes out then.
    await writer.flush()
    assert delivered.batches[-1] == [("s_b", 1)]


async def test_a_failed_transaction_drops_its_own_events_and_keeps_the_ones_before_it(
    database: Database,
) -> None:
    """The block's row is rolled back, so the event announcing it must not go out (the write, retried,
    announces it again: without this a retried end showed two `error` events). Events published before
    the block are not the block's: they stay pending for the next batch."""
    delivered = Delivered()
    writer = WriteBehind(database, interval=60.0, deliver=delivered)
    sink = sink_of(writer)
    sink("s_a", delta(1))  # before the block
    bad = ChatMessageRow(id="m_x", session_id="s_missing", turn_id="t", type="turn_done", timestamp=T0)

    async def turn_write() -> None:
        async with writer.transaction("s_a") as db:
            sink("s_a", frame(99))  # announces the row below
            sink("s_b", frame(1))  # another session's event, published meanwhile
            await repository.insert_messages(db, [bad])

    with pytest.raises(Exception, match="FOREIGN KEY"):
        await turn_write()
    assert delivered.batches == []
    await writer.flush()
    assert delivered.seqs == [("s_a", 1), ("s_b", 1)]
    assert await logged(database) == [("s_a", 1), ("s_b", 1)]


async def test_a_failed_transaction_leaves_the_text_it_finished_to_the_next_batch(database: Database) -> None:
    """A response's last write (its final text, with usage) fails: the streamed message's row, never
    inserted yet, and its text are still written by the next batch, with the first delta's event."""
    delivered = Delivered()
    writer = WriteBehind(database, interval=60.0, deliver=delivered)
    sink = sink_of(writer)
    row = ChatMessageRow(
        id="m_t", session_id="s_a", turn_id="t", type="text", role="assistant", content="Hel", timestamp=T0
    )
    buffer = TextBuffer(row)
    writer.track(buffer)
    sink("s_a", frame(1))  # the first delta's event: it commits with the row
    buffer.parts.append("lo")
    bad = ChatMessageRow(id="m_x", session_id="s_missing", turn_id="t", type="turn_done", timestamp=T0)

    async def response_done() -> None:
        async with writer.transaction("s_a") as db:
            writer.untrack(buffer)
            await repository.update_message(db, "m_t", {"content": buffer.text()})
            await repository.insert_messages(db, [bad])

    with pytest.raises(Exception, match="FOREIGN KEY"):
        await response_done()
    await writer.flush()
    async with database.session() as db:
        stored = (await db.exec(select(ChatMessageRow).where(col(ChatMessageRow.id) == "m_t"))).all()
    assert [r.content for r in stored] == ["Hello"]
    assert delivered.seqs == [("s_a", 1)]
    # Once a transaction that finishes it commits, the batches leave it alone.
    async with writer.transaction("s_a") as db:
        writer.untrack(buffer)
    buffer.parts.append("!")
    await writer.flush()
    async with database.session() as db:
        stored = (await db.exec(select(ChatMessageRow).where(col(ChatMessageRow.id) == "m_t"))).all()
    assert [r.content for r in stored] == ["Hello"]


async def test_a_committed_turn_write_clears_the_batches_storage_failure(database: Database) -> None:
    """Batches failed (the disk was full) and a turn's end, retried, is written once space is freed: that
    commit proves storage works, so a turn starting right after it streams instead of stopping on the
    stale failure before the batch loop's next success (a CI flake: the next turn failed storage_full)."""
    writer = WriteBehind(database, interval=60.0, deliver=Delivered())
    schedule: GroupCommit = writer.schedule  # the write-behind's own, composed in
    schedule.failure = StorageFull("The database's disk is full.")
    bad = ChatMessageRow(id="m_x", session_id="s_missing", turn_id="t", type="turn_done", timestamp=T0)
    with pytest.raises(Exception, match="FOREIGN KEY"):
        async with writer.transaction("s_a") as db:
            await repository.insert_messages(db, [bad])
    assert writer.failure is not None  # a failed write proves nothing
    row = ChatMessageRow(id="m_1", session_id="s_a", turn_id="t", type="turn_done", timestamp=T0)
    async with writer.transaction("s_a") as db:
        await repository.insert_messages(db, [row])
    assert writer.failure is None


async def test_a_transaction_waits_for_a_batch_in_flight_so_frames_stay_in_order(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch holding frame 1 of s_a is committing when the turn's transaction announces frame 2: the
    broker must get 1 before 2 (it drops a frame older than one it already delivered)."""
    delivered = Delivered()
    writer = WriteBehind(database, interval=60.0, deliver=delivered)
    sink = sink_of(writer)
    sink("s_a", frame(1))
    release = asyncio.Event()
    original = event_log.log_events

    async def slow_insert(db: AsyncSession, rows: Sequence[tuple[str, int, str, str]]) -> None:
        await release.wait()
        await original(db, rows)

    monkeypatch.setattr(event_log, "log_events", slow_insert)
    batch = asyncio.create_task(writer.flush())
    await asyncio.sleep(0.01)

    async def turn_write() -> None:
        async with writer.transaction("s_a"):
            sink("s_a", frame(2))

    turn = asyncio.create_task(turn_write())
    await asyncio.sleep(0.01)
    assert not turn.done()
    release.set()
    await asyncio.gather(batch, turn)
    assert delivered.seqs == [("s_a", 1), ("s_a", 2)]


async def test_numbers_are_taken_in_the_logging_transaction_and_continue_from_the_log(
    database: Database,
) -> None:
    """Numbers come from the transaction that logs the events: a failed one leaves no gap, and a new
    writer (a restarted process) goes on from the log's last number, so none is ever handed out twice."""
    delivered = Delivered()
    writer = WriteBehind(database, interval=60.0, deliver=delivered)
    sink = sink_of(writer)
    sink("s_a", frame(1))
    await writer.flush()
    bad = ChatMessageRow(id="m_x", session_id="s_missing", turn_id="t", type="turn_done", timestamp=T0)

    async def failing_write() -> None:
        async with writer.transaction("s_a") as db:
            sink("s_a", frame(0))  # dropped with the failed write: it takes no number
            await repository.insert_messages(db, [bad])

    with pytest.raises(Exception, match="FOREIGN KEY"):
        await failing_write()
    sink("s_a", frame(2))
    sink("s_a", frame(3))
    await writer.flush()
    assert delivered.seqs == [("s_a", 1), ("s_a", 2), ("s_a", 3)]
    restarted = WriteBehind(database, interval=60.0, deliver=delivered)
    sink_of(restarted)("s_a", frame(4))
    await restarted.flush()
    assert await logged(database) == [("s_a", 1), ("s_a", 2), ("s_a", 3), ("s_a", 4)]
    async with database.session() as db:
        rows = (await db.exec(select(EventRow).order_by(col(EventRow.seq)))).all()
    # Each event's JSON carries the number it was given.
    assert [(r.seq, r.data) for r in rows] == [
        (n, f'{{"type":"agent_status","seq":{n},"expected":{n}}}') for n in range(1, 5)
    ]


@pytest.mark.parametrize("known", [False, True], ids=["first-batch", "number-known"])
async def test_a_batch_cancelled_while_it_commits_is_accounted_for_once(
    database: Database, monkeypatch: pytest.MonkeyPatch, known: bool
) -> None:
    """The driver finishes a commit whatever happens to the awaiting task: a flush cancelled meanwhile
    must still count its events as logged, or the next batch would log them again (a duplicate number);
    so too once the session's last number is known to this process."""
    delivered = Delivered()
    writer = WriteBehind(database, interval=60.0, deliver=delivered)
    sink = sink_of(writer)
    first = 1
    if known:
        sink("s_a", frame(1))
        await writer.flush()
        first = 2
    original = AsyncSession.commit
    committing = asyncio.Event()

    async def slow_commit(self: AsyncSession) -> None:
        committing.set()
        await asyncio.sleep(0.2)
        await original(self)

    monkeypatch.setattr(AsyncSession, "commit", slow_commit)
    sink("s_a", frame(first))
    flush = asyncio.create_task(writer.flush())
    await committing.wait()
    flush.cancel()
    with pytest.raises(asyncio.CancelledError):
        await flush
    monkeypatch.setattr(AsyncSession, "commit", original)
    sink("s_a", frame(first + 1))
    await writer.flush()
    assert delivered.seqs == [("s_a", n) for n in range(1, first + 2)]
    assert await logged(database) == [("s_a", n) for n in range(1, first + 2)]


@pytest.mark.parametrize("by", ["batch", "transaction"])
async def test_a_streamed_message_whose_id_is_taken_takes_a_fresh_one_with_its_deltas(
    database: Database, by: str
) -> None:
    """The first delta's event is published before its row is inserted; when another row holds the id,
    the row, the buffer and every delta not committed yet take the fresh id, whichever commit inserts it."""
    async with database.session() as db:
        await repository.insert_messages(db, [ChatMessageRow(id="m_taken", session_id="s_b", turn_id="t",
                                                             type="turn_start", timestamp=T0)])  # fmt: skip
        await db.commit()
    delivered = Delivered()
    writer = WriteBehind(database, interval=60.0, deliver=delivered)
    # The session's last number known: the batch tries its one trip first, which leaves it all to the long
    # way once the id turns out to be held.
    sink_of(writer)("s_a", frame(1))
    await writer.flush()
    row = ChatMessageRow(
        id="m_taken", session_id="s_a", turn_id="t", type="text", role="assistant", content="He", timestamp=T0
    )
    buffer = TextBuffer(row)
    writer.track(buffer)
    events = writer.publisher("s_a")
    events.emit(TextDelta, id="m_taken", text="He", timestamp=T0, model="m")
    events.text_delta("m_taken", "llo")
    if by == "batch":
        await writer.flush()
    else:
        async with writer.transaction("s_a"):
            pass
    assert buffer.message_id != "m_taken"
    async with database.session() as db:
        stored = [(r.id, r.content) for r in await repository.list_messages(db, "s_a")]
        logged = [json.loads(e.data)["id"] for e in await event_log.events_after(db, "s_a", 1, 10)]
    assert stored == [(buffer.message_id, "He")]
    assert logged == [buffer.message_id, buffer.message_id]


async def test_a_batch_writes_its_rows_texts_events_and_trim_in_one_commit(database: Database) -> None:
    """A batch's new row, text update, events and the log's trim are one transaction: one commit, after
    which its events are delivered in order."""
    delivered = Delivered()
    writer = WriteBehind(database, interval=60.0, deliver=delivered, retention=4)
    sink = sink_of(writer)
    open_one = first_text("s_a", "m_open")
    writer.track(open_one)
    sink("s_a", delta(1))
    await writer.flush()
    open_one.parts.append(" there")
    for n in range(2, 8):
        sink("s_a", delta(n))
    writer.track(first_text("s_a", "m_new"))
    sink("s_a", delta(8))
    counter = CommitCounter()
    counter.attach(database.engine)
    try:
        await writer.flush()
    finally:
        counter.detach()
    assert counter.total == 1
    assert delivered.seqs == [("s_a", n) for n in range(1, 9)]
    # The trim kept the newest four events; the rows and texts are there.
    assert await logged(database) == [("s_a", n) for n in range(5, 9)]
    async with database.session() as db:
        stored = [(r.id, r.content) for r in await repository.list_messages(db, "s_a")]
    assert stored == [("m_open", "Hi there"), ("m_new", "Hi")]


async def test_a_batch_that_fails_after_some_statements_ran_writes_nothing_and_its_work_stays_pending(
    database: Database,
) -> None:
    """The batch's new row is inserted, then the events' insert fails (a trigger stands for a disk that
    refuses): the row is rolled back with the rest, nothing is delivered, and the next batch writes the
    same work, numbered the same."""
    delivered = Delivered()
    writer = WriteBehind(database, interval=60.0, deliver=delivered)
    sink = sink_of(writer)
    sink("s_a", frame(1))
    await writer.flush()  # the session's last number is known from here
    async with database.session() as db:
        await db.exec(  # type: ignore[call-overload]
            text(
                "CREATE TRIGGER refuse BEFORE INSERT ON events WHEN NEW.seq = 2 "
                "BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END"
            )
        )
        await db.commit()
    writer.track(first_text("s_a", "m_new"))
    sink("s_a", delta(2))
    with pytest.raises(sqlite3.DatabaseError, match="disk I/O error"):
        await writer.flush()
    assert delivered.seqs == [("s_a", 1)]
    assert await logged(database) == [("s_a", 1)]
    assert await stored(database, "s_a") == []
    async with database.session() as db:
        await db.exec(text("DROP TRIGGER refuse"))  # type: ignore[call-overload]
        await db.commit()
    await writer.flush()
    assert delivered.seqs == [("s_a", 1), ("s_a", 2)]
    assert await logged(database) == [("s_a", 1), ("s_a", 2)]
    assert await stored(database, "s_a") == ["m_new"]


async def test_a_sessions_first_batch_in_this_process_goes_on_from_the_logs_last_number(
    database: Database,
) -> None:
    """This process has not numbered an event of s_b yet (its last number is in the log only): the batch
    reads it and goes on from it, with the session's new row."""
    async with database.session() as db:
        await event_log.log_events(db, [("s_b", n, "agent_status", "{}") for n in (1, 2, 3)])
        await db.commit()
    writer = WriteBehind(database, interval=60.0, deliver=(delivered := Delivered()))
    writer.track(first_text("s_b", "m_b"))
    writer.add(Draft("s_b", "agent_status", ',"expected":4}'))
    await writer.flush()
    assert delivered.seqs == [("s_b", 4)]
    assert await stored(database, "s_b") == ["m_b"]


# --- a first delta committed by the task that opened it (group_commit.opened) ---------------------------


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


async def test_a_first_delta_committed_by_a_turns_task_counts_as_urgent(database: Database) -> None:
    """The turn's task asks for the commit of its first delta: the commit counter (the bench's
    "write-behind commits in any 100 ms") counts it as the write-behind's urgent commit, not as the
    turn's own write."""
    delivered = Delivered()
    writer = WriteBehind(database, interval=60.0, deliver=delivered)
    writer.add(Draft("s_a", "agent_status", ',"status":"idle"}'))
    await writer.flush(force_text=False)
    counter = CommitCounter()
    counter.attach(database.engine)
    writer.start()
    try:

        async def turn() -> None:
            open_message(writer, "s_a", "m_a")
            await writer.opened("s_a")

        await asyncio.create_task(turn(), name="turn:t_000000000001")
        assert delivered.seqs == [("s_a", 1), ("s_a", 2)]
        assert counter.snapshot(window=60.0)["by_origin"] == {"urgent": 1}
    finally:
        counter.detach()
        await writer.stop()


async def test_while_a_batch_is_under_way_the_first_delta_goes_with_the_next_urgent_batch(
    database: Database,
) -> None:
    delivered = Delivered()
    writer = WriteBehind(database, interval=60.0, deliver=delivered)
    writer.start()
    try:
        async with writer.schedule.batches:  # a batch under way
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
        opening = asyncio.create_task(writer.opened("s_a"))
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


async def test_a_deleted_sessions_drafts_are_dropped_and_the_deletion_is_forgotten_later(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a deleted session still had pending is dropped (its rows would only break foreign keys); the
    writer remembers the deletion for FORGOTTEN_SECONDS only, or a process would hold every session id it
    ever deleted. A session that rested (let_go) loses its cached number only: its next events go on from
    the log's last one."""
    delivered = Delivered()
    writer = WriteBehind(database, interval=60.0, deliver=delivered)
    sink = sink_of(writer)
    sink("s_a", frame(1))
    sink("s_b", frame(1))
    await writer.flush()
    sink("s_b", frame(0))  # pending when its session is deleted
    writer.forget_session("s_b")
    writer.let_go("s_a")
    sink("s_a", frame(2))
    await writer.flush()
    assert delivered.seqs == [("s_a", 1), ("s_b", 1), ("s_a", 2)]
    assert await logged(database) == [("s_a", 1), ("s_a", 2), ("s_b", 1)]
    assert "s_b" in writer._forgotten
    monkeypatch.setattr(writer_module, "FORGOTTEN_SECONDS", 0.0)
    await asyncio.sleep(0.01)
    writer.forget_session("s_gone")
    assert list(writer._forgotten) == ["s_gone"]
