"""When the write-behind commits (streaming.log.write_behind says what): its task, the pacing of its batches,
the
urgent work that does not wait for them, and storage's refusal while they fail. The write-behind owns one
`GroupCommit` and hands itself to it at construction as what the schedule runs (`Batches`): commit
(`flush`), say whether events are pending, and set aside work the database refuses for its data.

Batches are a group commit with two speeds. Urgent work (the first delta of a response, which also
inserts its row, or an event published outside a turn's own write) is committed as soon as the previous
commit returns: it waits for no tick, and under load batches grow instead of queueing. An urgent batch
takes only the sessions with urgent work (all their pending events, in order), so it stays small and fans
out to their streams only: taking every session's deltas made each stream's sends, and the CPU per
chunk, grow with the rate at which responses start. Text deltas of a message already open are not
urgent: they ride the next interval batch (or a commit of their own session), at most one commit per
`interval`. So the first token reaches a client about one commit after the upstream sent it, whatever
the load, and a stream of deltas costs at most one commit per `interval`.

A response's first delta is committed by its turn's own task when no batch is under way (`opened`):
waking this task instead took a turn of a busy loop or more, on the path of the first token.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import suppress
from typing import Protocol

from app.errors import StorageUnavailable
from app.errors.storage import storage_refusal
from app.streaming.log.commit import BATCH_TASK, URGENT_TASK

log = logging.getLogger(__name__)


async def _wait(event: asyncio.Event, timeout: float) -> None:
    """Until `event` is set or `timeout` passed. Not wait_for: on 3.11 it waits in a task of its own (a
    first delta to its urgent batch, 50 streaming sessions: 128 us p50, 688 p90; this way 87 and 297)."""
    with suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()


class Batches(Protocol):
    """What the schedule runs: the write-behind (streaming.log.write_behind)."""

    async def flush(
        self, *, force_text: bool = True, urgent: bool = False, scope: set[str] | None = None
    ) -> None: ...

    def has_events(self) -> bool: ...

    async def isolate(self) -> None:
        """A batch failed for its data, not for storage: sets aside the work the database refuses."""


class GroupCommit:
    """The write-behind's schedule: when its `flush` runs, and what storage's refusal of it is."""

    def __init__(
        self,
        batches: Batches,
        *,
        interval: float,
        text_interval: float,
    ) -> None:
        self._work = batches
        self._interval, self._text_interval = interval, text_interval
        self._task: asyncio.Task[None] | None = None
        # Batches one at a time (the write-behind's flush holds it).
        self.batches = asyncio.Lock()
        self._pending = asyncio.Event()
        # Set when pending work must not wait for the interval (see the module docstring).
        self._urgent = asyncio.Event()
        # Sessions with urgent work: the next urgent batch commits theirs (and only theirs).
        self._urgent_sessions: set[str] = set()
        self._last_commit = 0.0
        # Batch commits (interval flushes and urgent ones).
        self.batch_commits = self.urgent_commits = 0
        # Storage's refusal while batches fail (full, busy, failing): running turns stop on it, not stream on.
        self.failure: StorageUnavailable | None = None

    def wake(self) -> None:
        """Work is pending: the next batch is due (at once if urgent, else after the interval)."""
        if not self._pending.is_set():
            self._pending.set()

    def mark_urgent(self, session_id: str) -> None:
        self._urgent_sessions.add(session_id)
        self._urgent.set()

    def batch_done(self, *, urgent: bool) -> None:
        """A batch committed (no await since: see writer._batch)."""
        if urgent:
            self.urgent_commits += 1
        else:  # only interval batches pace the next one: an urgent one took its sessions' work
            self.batch_commits += 1
            self._last_commit = time.monotonic()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=BATCH_TASK)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._work.flush()

    async def opened(self, session_id: str) -> None:
        """From a turn's own task, right after the writer's `track` opened a message: commits the
        session's urgent work (the row and first delta) at once when no batch is under way. While one
        is, the urgent batch after it takes the work with any other (the group commit)."""
        if self.batches.locked() or session_id not in self._urgent_sessions:
            return
        self._urgent_sessions.discard(session_id)
        if not self._urgent_sessions:
            self._urgent.clear()
        try:
            await self._work.flush(force_text=False, urgent=True, scope={session_id})
        except BaseException as exc:
            # Still pending: this task retries it (and notes storage's refusal, as for its own batches).
            self.mark_urgent(session_id)
            if not isinstance(exc, Exception):
                raise
            self.failed(exc)
        else:
            self.works_again("a response's first delta committed")

    async def _run(self) -> None:
        task = asyncio.current_task()
        while True:
            # Streamed text needs a flush every text_interval even when no event comes.
            await _wait(self._pending, self._text_interval)
            urgent = await self._until_due()
            # One turn of the loop, so events published together share the commit.
            await asyncio.sleep(0)
            self._pending.clear()
            self._urgent.clear()
            # An interval batch takes everything, the urgent sessions' work too.
            scope = self._urgent_sessions if urgent else None
            self._urgent_sessions = set()
            if task is not None:
                # observability.monitor tells the two kinds of batch apart by the task's name.
                task.set_name(URGENT_TASK if urgent else BATCH_TASK)
            try:
                await self._work.flush(force_text=False, urgent=urgent, scope=scope)
                if scope is not None and self._work.has_events():
                    self._pending.set()  # the other sessions' events: their interval batch is still due
            except Exception as exc:
                self.failed(exc)
                if storage_refusal(exc) is None:
                    # Not storage refusing work but the database refusing some work (its data): one
                    # session's write must not hold every other session's back, retry after retry.
                    await self._work.isolate()
                self._pending.set()
                await asyncio.sleep(self._interval)
            else:
                self.works_again("pending events committed")

    def works_again(self, how: str) -> None:
        """A commit went through: storage takes writes again, so running turns may stream on."""
        if self.failure is not None:
            log.warning("write-behind: storage works again; %s", how)
            self.failure = None

    def failed(self, exc: Exception) -> None:
        """A batch failed, its work stays pending: storage's refusal logged once a spell, else a traceback."""
        refusal = storage_refusal(exc)
        if refusal is None:
            log.exception("write-behind flush failed; will retry")
            return
        if self.failure is None:
            log.error("write-behind: %s (%s); retrying until storage works", refusal.code, exc)
        self.failure = refusal

    async def _until_due(self) -> bool:
        """Waits until the pending work is due: at once when it is urgent (True), else until `interval`
        after the last commit (False), or until urgent work comes meanwhile."""
        while not self._urgent.is_set():
            # time.monotonic, not loop.time(): the loop's clock is read once per iteration, so after a long
            # iteration it lags, and two commits could land in one interval. The millisecond covers a
            # timer that fires a little early.
            wait = self._last_commit + self._interval + 0.001 - time.monotonic()
            if wait <= 0:
                return False
            await _wait(self._urgent, wait)
        return True
