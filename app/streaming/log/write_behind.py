"""Write-behind persistence for the hot path: the event log and streamed text, in one periodic batch.

Nothing is written per text delta. One short transaction inserts the events published since the last
batch, inserts the rows of assistant messages that started streaming, updates the text of those still
streaming (at most every `text_interval`), and trims the logs of sessions that outgrew `retention` by a
tenth. Only after that commit are the events handed to the broker for delivery: a client never sees an
event the log could lose. The statements go to the driver in one executemany each, whatever the number
of sessions in the batch, through the drivers' public API (storage.sql).

When batches commit (at once for urgent work, else at most once per `interval`) is streaming.log.schedule.

Everything else (user messages, response ends, tool results, turn ends) is written by the turn itself,
because those moments must be durable when they are announced. It writes them in `transaction()`, which
also commits that session's pending events (the ones it just announced included) and delivers them right
after the commit: an event and the row it announces are durable together, and a stop or the end of a turn
reaches clients without waiting for the next batch.

A session's writes go one at a time (streaming.log.write_order): a turn's write waits for a batch that took
its
session, and a batch leaves out the sessions whose turn write is open (that write commits their pending
work). Different sessions' writes go at once on PostgreSQL (with one lock for all, turn starts and ends
waited 150-280 ms p50 at 60 sessions on one replica); on SQLite, one writer at a time, all take one lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

from sqlmodel.ext.asyncio.session import AsyncSession

from app.errors import StorageUnavailable
from app.errors.storage import storage_refusal
from app.storage import event_log
from app.storage.engine import Database
from app.streaming.frames import Draft, Frame, Publisher
from app.streaming.log.commit import commit as _commit
from app.streaming.log.fencing import Fence
from app.streaming.log.pending_events import PendingEvents
from app.streaming.log.retention import Retention
from app.streaming.log.schedule import GroupCommit
from app.streaming.log.sequencing import EventSequencer, LocalSequencer, SequenceBatch
from app.streaming.log.texts import TextBuffer, due_texts, mark_written, write_texts
from app.streaming.log.write_order import WriteOrder

log = logging.getLogger(__name__)

Deliver = Callable[[Sequence[tuple[str, Frame]]], None]
# Seconds a deleted session's drafts are still dropped (forget_session).
FORGOTTEN_SECONDS = 600.0


class OutputRefused(Exception):
    """A turn's write, after the database refused pending output of its session for its data."""


class WriteBehind:
    def __init__(
        self,
        database: Database,
        *,
        interval: float = 0.1,
        text_interval: float = 1.0,
        retention: int | None = None,
        deliver: Deliver | None = None,
        sequencer: EventSequencer | None = None,
        fence: Fence | None = None,
    ) -> None:
        self._database = database
        self._text_interval = text_interval
        # When batches commit (streaming.log.schedule): composed in, it calls back the three methods named.
        self.schedule = GroupCommit(self, interval=interval, text_interval=text_interval)
        # Multi-replica mode: every write of a turn is checked against its lease (streaming.log.fencing).
        self.fence = fence
        self._sequencer = sequencer or LocalSequencer()
        self._retention = Retention(retention) if retention is not None else None
        self._deliver = deliver
        # Published events not committed yet, by session, each session's in publication order.
        self._events = PendingEvents()
        self._texts: dict[str, TextBuffer] = {}
        # Buffers each open transaction finished (untrack), by session: they leave _texts once it commits.
        self._finished: dict[str, list[TextBuffer]] = {}
        # Deleted sessions, with when (their pending drafts are dropped), for FORGOTTEN_SECONDS.
        self._forgotten: dict[str, float] = {}
        # A session's writes one at a time, in order (on SQLite all writes).
        self._lanes = WriteOrder(serial=database.dialect != "postgresql")
        # Sessions whose turn write is open: their events commit with that write, so they are not urgent.
        self._writing: set[str] = set()
        # Turn writes that carried pending events.
        self.turn_commits = 0
        # Sessions whose pending work the database refused for its data (isolate), with the error: their
        # running turn ends failed on it (refused).
        self._refused: dict[str, Exception] = {}

    def add(self, draft: Draft) -> None:
        """A published event: numbered and logged by the next commit, delivered after it."""
        self._events.add(draft)
        self.schedule.wake()
        # A delta waits for the next batch (its row's first one commits with the row, track()).
        delta = draft.type == "text_delta" or draft.type == "reasoning_delta"
        if not delta and draft.session_id not in self._writing:
            self.schedule.mark_urgent(draft.session_id)

    def has_events(self) -> bool:
        return bool(self._events)

    def publisher(self, session_id: str) -> Publisher:
        return Publisher(session_id, self.add)

    @property
    def failure(self) -> StorageUnavailable | None:
        """Storage's refusal while batches fail (the schedule's): running turns stop on it."""
        return self.schedule.failure

    @property
    def batch_commits(self) -> int:
        return self.schedule.batch_commits

    @property
    def urgent_commits(self) -> int:
        return self.schedule.urgent_commits

    def start(self) -> None:
        self.schedule.start()

    async def stop(self) -> None:
        """Stops the batches' task, then commits what is pending."""
        await self.schedule.stop()

    async def opened(self, session_id: str) -> None:
        """From a turn's own task once `track` opened a message: the schedule's `opened`."""
        await self.schedule.opened(session_id)

    def track(self, buffer: TextBuffer) -> None:
        self._texts[buffer.message_id] = buffer
        if buffer.row is not None:
            # A response's first delta: its row and event go with the next commit, which comes at once.
            self.schedule.wake()
            if buffer.session_id not in self._writing:
                self.schedule.mark_urgent(buffer.session_id)

    def untrack(self, buffer: TextBuffer) -> None:
        """Inside `transaction`, which writes the buffer's final text: it leaves the write-behind once that
        transaction commits. If it fails, the next batch still inserts the row and writes the text."""
        finished = self._finished.get(buffer.session_id)
        assert finished is not None, "untrack belongs inside writer.transaction of its session"
        finished.append(buffer)

    def forget_session(self, session_id: str) -> None:
        """The session was deleted: its pending rows would only violate foreign keys."""
        forgotten, now = self._forgotten, time.monotonic()
        forgotten.pop(session_id, None)
        forgotten[session_id] = now  # oldest first
        # A deletion stops the session's turn first, so nothing of it is published long after; without
        # this a process would remember every session ever deleted. (The newest entry ends the loop.)
        while now - next(iter(forgotten.values())) > FORGOTTEN_SECONDS:
            del forgotten[next(iter(forgotten))]
        if self._retention is not None:
            self._retention.forget(session_id)
        self._sequencer.forget(session_id)
        self._drop_texts({session_id})

    def let_go(self, session_id: str) -> None:
        """The session rested (turns.runtime.state_cache): what is cached for it goes; its next write reads
        its last event
        number from the log. Pending events of it, if any, still commit: nothing is dropped but caches."""
        if self._retention is not None:
            self._retention.forget(session_id)
        self._sequencer.forget(session_id)

    async def isolate(self) -> None:
        """Commits each session's pending work alone; a session whose work the database refuses for its
        data (not storage refusing work: that stops here, every session waits for it) loses its pending
        events and text writes, and its turn ends failed (`refused`): the others' work commits."""
        sessions = set(self._events.sessions()) | {b.session_id for b in self._texts.values()}
        for session_id in sorted(sessions):
            try:
                await self.flush(scope={session_id})
            except Exception as exc:
                if storage_refusal(exc) is not None:
                    return
                log.exception("write-behind: the database refused the pending work of session %s", session_id)
                self.discard(session_id)
                self._refused[session_id] = exc

    def refused(self, session_id: str) -> Exception | None:
        """The error the database refused the session's pending work with (isolate), once."""
        return self._refused.pop(session_id, None)

    def discard(self, session_id: str) -> None:
        """Drops the session's pending events and text writes: the database refuses them for their data,
        and the turn's end must not be refused with them."""
        self._events.drop_session(session_id)
        self._drop_texts({session_id})

    def _drop_texts(self, session_ids: set[str]) -> None:
        for key in [k for k, b in self._texts.items() if b.session_id in session_ids]:
            del self._texts[key]

    async def flush(
        self, *, force_text: bool = True, urgent: bool = False, scope: set[str] | None = None
    ) -> None:
        """Commits the pending rows and events, then delivers the events; with a `scope`, only those of
        its sessions (an urgent batch), all of each one's, so every session's events stay in order. Sessions
        whose turn write is open are left to that write."""
        async with self.schedule.batches, self._lanes.exclusive():
            now = time.monotonic()
            busy = self._lanes.busy
            texts = [
                b
                for b in due_texts(
                    self._texts.values(), now=now, force=force_text, interval=self._text_interval, scope=scope
                )
                if not busy(b.session_id)
            ]
            events = self._events
            sessions = {b.session_id for b in texts} | {
                sid
                for sid in (events.sessions() if scope is None else scope)
                if events.has(sid) and not busy(sid)
            }
            if not sessions:
                return
            with self._lanes.holding(sessions):
                await self._batch(sessions, texts, now, urgent=urgent)

    async def _batch(self, sessions: set[str], texts: list[TextBuffer], now: float, *, urgent: bool) -> None:
        """One batch's transaction: the pending work of `sessions`, which it holds."""
        kind = "urgent" if urgent else "batch"
        forgotten = self._forgotten
        numbers = self._sequencer.begin()
        async with self._database.session() as db:
            if self.fence is not None:
                dropped = await self.fence.screen(db, sessions)
                if dropped:  # their turns lost their leases: nothing of them is written
                    forgotten = {**forgotten, **dict.fromkeys(dropped, 0.0)}
                    texts = [b for b in texts if b.session_id not in dropped]
                    self._drop_texts(dropped)
            written = await write_texts(db, texts, self._texts, self._events)
            # Taken after the texts: a message renamed on insert renames its drafts (texts.rename). Events
            # published from here on stay for the next commit.
            mine = self._events.of(sessions)
            drafts = [d for d in mine if d.session_id not in forgotten]
            frames = await self._log(db, numbers, drafts, exact=False)
            await _commit(db, kind)
            # No await from the commit to the delivery: a cancellation comes after both (_commit).
            numbers.committed()
            self._batch_committed(mine, written, frames, now, urgent=urgent)

    def _batch_committed(
        self,
        mine: list[Draft],
        written: list[tuple[TextBuffer, int]],
        frames: list[tuple[str, Frame]],
        now: float,
        *,
        urgent: bool,
    ) -> None:
        """After a batch's commit (no await, see _batch): its events leave, its texts are marked written,
        and its frames go to the broker."""
        self.schedule.batch_done(urgent=urgent)
        self._events.remove(mine)
        mark_written(written, now)
        if frames and self._deliver is not None:
            self._deliver(frames)

    @asynccontextmanager
    async def transaction(
        self, session_id: str, *, turn_id: str | None = None, final: bool = False
    ) -> AsyncIterator[AsyncSession]:
        """A turn's own write: commits with it the session's pending rows and events, then delivers them.

        The session's streamed text rows not inserted yet are inserted first, so the block can update
        them and later rows keep the history's order. Events published inside the block are part of the
        commit. Batches of other sessions wait for the block (it holds the writer's lock), so this
        session's frames are still delivered in order. If the block or its commit fails, the events it
        published are dropped with the rows they announce (whoever retries the write announces them
        again), while the session's streamed text and the events published before the block, and the
        text buffers the block finished (`untrack`), stay pending for the next batch.

        `turn_id`: a turn's write, fenced by its lease in multi-replica mode (`final` releases it)."""
        async with self._lanes.session(session_id), self._lanes.exclusive():
            refused = self._refused.get(session_id) if turn_id is not None else None
            if refused is not None:
                # The turn's output the database refused is gone (isolate): it must not end as if whole.
                raise OutputRefused(session_id) from refused
            now = time.monotonic()
            finished = self._finished[session_id] = []
            self._writing.add(session_id)
            numbers = self._sequencer.begin()
            frames: list[tuple[str, Frame]] = []
            before: set[int] | None = None
            try:
                async with self._database.session() as db:
                    await self._fenced(db, session_id, turn_id, final)
                    pending = [
                        b for b in self._texts.values() if b.session_id == session_id and b.row is not None
                    ]
                    written = await write_texts(db, pending, self._texts, self._events)
                    # The session's events so far: any other of it was published inside the block (no
                    # other write of the session runs meanwhile, nor renames its drafts).
                    before = {id(d) for d in self._events.session(session_id)}
                    yield db
                    mine = self._events.of((session_id,))
                    if session_id not in self._forgotten:
                        frames = await self._log(db, numbers, mine, exact=True)
                    await _commit(db, "turn")
                    # No await from the commit to the delivery: a cancellation comes after both (_commit).
                    numbers.committed()
                    if final and turn_id is not None and self.fence:
                        self.fence.end(session_id, turn_id)  # released with this commit
                    mark_written(written, now)
                    self._turn_committed(finished, mine, frames)
            except BaseException:
                self._abandoned(session_id, before)
                raise
            finally:
                self._finished.pop(session_id, None)
                self._writing.discard(session_id)

    def _turn_committed(
        self, finished: list[TextBuffer], mine: list[Draft], frames: list[tuple[str, Frame]]
    ) -> None:
        """After a turn write's commit (no await, see transaction): its buffers and events leave; delivery."""
        # A turn's end written by end_durably also proves storage works: the next turn must not stop on it.
        self.schedule.works_again("a turn's write committed")
        for buffer in finished:
            self._texts.pop(buffer.message_id, None)
        if mine:
            self.turn_commits += 1
            self._events.remove(mine)
        if frames and self._deliver is not None:
            self._deliver(frames)

    def _abandoned(self, session_id: str, before: set[int] | None) -> None:
        """A turn's write failed: the events its block published (those not `before` it) go; the
        session's earlier ones stay pending, and must not wait for the interval to be logged."""
        if before is not None:
            self._events.drop_session(session_id, keep=before)
        if self._events.has(session_id):
            self.schedule.mark_urgent(session_id)

    async def _fenced(self, db: AsyncSession, session_id: str, turn_id: str | None, final: bool) -> None:
        """The fence's check of a transaction (LeaseLost for a turn's write); a write of the waiting line
        on a session whose turn lost its lease here drops that turn's pending text and events."""
        if self.fence is not None and not await self.fence.guard(db, session_id, turn_id, final=final):
            self._events.drop_session(session_id)
            self._drop_texts({session_id})

    async def _log(
        self, db: AsyncSession, numbers: SequenceBatch, drafts: list[Draft], *, exact: bool
    ) -> list[tuple[str, Frame]]:
        """Numbers the drafts and logs them in `db`'s transaction; returns the frames to deliver once it
        commits."""
        if not drafts:
            return []
        events = await numbers.log(db, drafts)
        if self._retention is not None:
            # Exact: whatever lies beyond the retention goes. Otherwise once a tenth more has piled up.
            await event_log.prune_logs(db, self._retention.cutoffs(events, exact=exact))
        return events
