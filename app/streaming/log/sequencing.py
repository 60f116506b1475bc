"""Event sequencing: each session's events are numbered 1, 2, 3, ... in the transaction that logs them.

A number is taken inside that transaction and becomes final only when it commits, so the log has no gap
and no number is ever handed out twice: the event log's primary key (session_id, seq) is a plain insert,
and a collision would be a bug, never a case to ignore.
"""

from __future__ import annotations

from typing import Protocol

from sqlmodel.ext.asyncio.session import AsyncSession

from app.storage import event_log
from app.streaming.frames import Draft, Frame


class SequenceBatch(Protocol):
    async def take(self, db: AsyncSession, session_id: str, count: int) -> int | None:
        """The first of `count` consecutive numbers after the session's last, inside `db`'s transaction;
        None when the session no longer exists (its events are dropped with it)."""
        ...

    async def take_all(self, db: AsyncSession, counts: dict[str, int]) -> dict[str, int | None]:
        """`take` for each session of a batch (`counts`: how many numbers each), in as few statements as
        the implementation can."""
        ...

    async def log(self, db: AsyncSession, drafts: list[Draft]) -> list[tuple[str, Frame]]:
        """Numbers the drafts (publication order, each session's from its own sequence) and logs them in
        `db`'s transaction; the frames to deliver once it commits. A gone session's drafts are dropped."""
        ...

    def committed(self) -> None:
        """`db` committed: the numbers taken are used for good. Without this call they are not."""
        ...


class EventSequencer(Protocol):
    """Numbers the events of every session.

    A multi-process implementation must guarantee what this one does across processes: the numbers of a
    session are taken under a lock held by the logging transaction (a counter row updated in it, e.g.
    `UPDATE ... SET last_seq = last_seq + n RETURNING last_seq`, whose row lock serializes writers and
    whose rollback returns the numbers), so two processes never take the same number and a transaction
    that fails leaves no gap.
    """

    def begin(self) -> SequenceBatch: ...

    def forget(self, session_id: str) -> None:
        """The session was deleted, or rested (turns.runtime.state_cache): nothing of it stays here; its next
        numbers
        come from the log."""
        ...


class LocalSequencer:
    """Counters in this process's memory, started from the log's last number. Correct while one process
    writes the log: every logging transaction runs under the write-behind's lock, one at a time."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def begin(self) -> LocalBatch:
        return LocalBatch(self._last)

    def forget(self, session_id: str) -> None:
        self._last.pop(session_id, None)


class LocalBatch:
    __slots__ = ("_last", "_taken")

    def __init__(self, last: dict[str, int]) -> None:
        self._last = last
        self._taken: dict[str, int] = {}

    async def take(self, db: AsyncSession, session_id: str, count: int) -> int:
        last = self._taken.get(session_id)
        if last is None:
            last = self._last.get(session_id)
            if last is None:
                last = await event_log.last_event_seq(db, session_id)
        self._taken[session_id] = last + count
        return last + 1

    async def take_all(self, db: AsyncSession, counts: dict[str, int]) -> dict[str, int | None]:
        return {sid: await self.take(db, sid, count) for sid, count in counts.items()}

    def number_known(self, drafts: list[Draft]) -> list[tuple[str, Frame]] | None:
        """The drafts numbered without a read, as `number` does; None (nothing taken) when the last number
        of one of their sessions is not known here yet."""
        taken, last = self._taken, self._last
        if any(d.session_id not in taken and d.session_id not in last for d in drafts):
            return None
        frames = []
        for d in drafts:
            sid = d.session_id
            seq = taken.get(sid)
            seq = taken[sid] = (last[sid] if seq is None else seq) + 1
            frames.append((sid, d.number(seq)))
        return frames

    async def log(self, db: AsyncSession, drafts: list[Draft]) -> list[tuple[str, Frame]]:
        return await number_and_log(db, self, drafts)

    def committed(self) -> None:
        self._last.update(self._taken)


class CounterSequencer:
    """The multi-process implementation: the numbers come from the session's counter row
    (chat_sessions.last_seq), updated in the logging transaction. Its row lock serializes the logging
    transactions of every replica, and a rollback returns the numbers, so there is no gap and no number
    twice. The counter never goes below the log's last number (a database that ran single-process)."""

    def begin(self) -> _CounterBatch:
        return _CounterBatch()

    def forget(self, session_id: str) -> None:
        """Nothing is held here: the counter goes with the session's row."""


class _CounterBatch:
    __slots__ = ()

    async def take(self, db: AsyncSession, session_id: str, count: int) -> int | None:
        last = await event_log.advance_counter(db, session_id, count)
        return None if last is None else last - count + 1

    async def take_all(self, db: AsyncSession, counts: dict[str, int]) -> dict[str, int | None]:
        lasts = await event_log.advance_counters(db, counts)
        return {sid: (lasts[sid] - n + 1 if sid in lasts else None) for sid, n in counts.items()}

    async def log(self, db: AsyncSession, drafts: list[Draft]) -> list[tuple[str, Frame]]:
        """On PostgreSQL the counters move and the events are logged in one statement (one round trip of
        every transaction that logs events, instead of two)."""
        if db.get_bind().dialect.name != "postgresql":
            return await number_and_log(db, self, drafts)
        counts: dict[str, int] = {}
        places = []
        for d in drafts:
            place = counts[d.session_id] = counts.get(d.session_id, 0) + 1
            places.append(place)
        rows = [(d.session_id, place, d.type, d.rest) for d, place in zip(drafts, places, strict=True)]
        lasts = await event_log.advance_and_log(db, counts, rows)
        return [
            (d.session_id, d.number(lasts[d.session_id] - counts[d.session_id] + place))
            for d, place in zip(drafts, places, strict=True)
            if d.session_id in lasts  # the session is gone: so are its events
        ]

    def committed(self) -> None:
        """The counter is in the transaction: nothing to note."""


async def number(db: AsyncSession, numbers: SequenceBatch, drafts: list[Draft]) -> list[tuple[str, Frame]]:
    """The drafts numbered in publication order, each session's from its own sequence."""
    counts: dict[str, int] = {}
    for d in drafts:
        counts[d.session_id] = counts.get(d.session_id, 0) + 1
    # One call for the batch: the counter rows are locked in one order by every replica (no deadlock).
    next_seq = await numbers.take_all(db, counts)
    frames = []
    for d in drafts:
        seq = next_seq[d.session_id]
        if seq is None:  # the session is gone: so are its events
            continue
        next_seq[d.session_id] = seq + 1
        frames.append((d.session_id, d.number(seq)))
    return frames


async def number_and_log(
    db: AsyncSession, numbers: SequenceBatch, drafts: list[Draft]
) -> list[tuple[str, Frame]]:
    """`number`, then the numbered events logged: a statement for each (SequenceBatch.log)."""
    events = await number(db, numbers, drafts)
    await event_log.log_events(db, [(sid, f.seq, f.type, f.data) for sid, f in events])
    return events
