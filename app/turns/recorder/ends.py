"""The ways a turn ends, each one transaction: completed (with its last response), failed, stopped (its
partial state committed, docs/api.md, Stop), or left open by a crash (recovery and the sweeper close it
with this part alone, close_after_restart).

Storage that refuses a write (a full disk, a lock held past the busy timeout, an I/O error) must not
leave a turn half closed: every step of an end changes the turn's state only once its transaction has
committed, so it can run again, and `end_durably` runs the end until storage takes it. Until then the
turn stays this process's, so nothing starts after it and its end lands in order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial

from sqlmodel.ext.asyncio.session import AsyncSession

from app.errors import StorageUnavailable
from app.errors.storage import storage_refusal
from app.observability.context import current_trace_id
from app.protocol.clock import now_iso
from app.protocol.events import AgentCancelled, ErrorEvent, TurnDone, TurnStatus
from app.protocol.ids import new_message_id
from app.storage import repository
from app.storage.tables import ChatMessageRow
from app.streaming.log.fencing import LeaseLost
from app.turns.recorder.requests import ToolRequests
from app.turns.recorder.round import OpenRound
from app.turns.recorder.rows import TurnRows
from app.turns.recorder.stop import (
    TOOL_INTERRUPTED_BY_ERROR,
    TOOL_INTERRUPTED_BY_RESTART,
    TOOL_INTERRUPTED_BY_USER,
    TurnStop,
)

log = logging.getLogger(__name__)

# A turn whose output the database refused for its data (not storage refusing work) ends with this.
REFUSED_MESSAGE = "The database refused part of this turn's output."
STORAGE_ERROR_MESSAGE = f"The turn stopped because the server could not store it: {REFUSED_MESSAGE}"
# Seconds between attempts to write a turn's end while storage refuses it: doubling, up to the most.
END_RETRY_FIRST, END_RETRY_MOST = 0.05, 1.0


@dataclass
class TurnEnds:
    rows: TurnRows
    # What a stop or a failure closes; the requests of calls that wait, when the turn ran here.
    round: OpenRound = field(default_factory=OpenRound)
    stop: TurnStop = field(default_factory=TurnStop)
    requests: ToolRequests | None = None
    started: float = field(default_factory=time.monotonic)
    closed: bool = False
    closed_status: TurnStatus | None = None  # how close() ended it (metrics, the turn's span)
    interrupted_message_ids: list[str] = field(default_factory=list)
    interrupted_tool_call_ids: list[str] = field(default_factory=list)
    # A failed turn's provider Retry-After, told in its error event.
    _retry_after: float | None = None
    # The turn's last response, written by the end's transaction (TurnRecorder): the agent ends right
    # after it, and one commit instead of two is one write less for every turn.
    deferred: Callable[[AsyncSession], Awaitable[None]] | None = None
    # What storage answered while the end cannot be written; None when it is not stuck.
    stalled: StorageUnavailable | None = None
    _stall: asyncio.Event = field(default_factory=asyncio.Event)

    # --- ends ----------------------------------------------------------------------------------------

    async def _write_partial(
        self, db: AsyncSession, tool_result: str, announce: Callable[[], None] | None
    ) -> None:
        """The partial state of a stop (docs/api.md, Stop), in the end's transaction: streamed text is kept
        and marked, and every
        call of the interrupted round ends with exactly one result (finished calls keep theirs).
        `announce` emits the events that go out with it. The state is cleared by `_end`, once the
        transaction committed."""
        buffer, open_tools = self.round.text, self.round.tools
        unstarted = [c for c in self.round.calls if c.id not in self.round.started]
        at = now_iso()
        response_id = self.round.response_id
        rows = [
            self.rows.tool_row(call, response_id, at, result=tool_result, is_error=True, duration_ms=0)
            for call in unstarted
        ]
        if self.requests is not None:
            await self.requests.abandon(db, tool_result)
        if buffer is not None:
            self.rows.writer.untrack(buffer)
            await repository.update_message(
                db, buffer.message_id, {"content": buffer.text(), "interrupted": True}
            )
        reasoning = self.round.reasoning
        if reasoning is not None:  # cut short: shown as it came, never sent back (it has no signature)
            self.rows.writer.untrack(reasoning)
            await repository.update_message(
                db, reasoning.message_id, {"content": reasoning.text(), "interrupted": True}
            )
        for tool in open_tools.values():
            await repository.update_message(
                db, tool.row_id, {"result": tool_result, "is_error": True, "interrupted": True}
            )
        await repository.insert_messages(db, rows, new_message_id)
        # Named once written: a streamed message's id is final once its row is in (writer._rename).
        self.interrupted_message_ids = [
            *([reasoning.message_id] if reasoning is not None else []),
            *([buffer.message_id] if buffer is not None else []),
            *(tool.row_id for tool in open_tools.values()),
            *(row.id for row in rows),
        ]
        self.interrupted_tool_call_ids = [*open_tools, *(call.id for call in unstarted)]
        if announce is not None:
            announce()

    async def finish_cancelled(self) -> None:
        await self._end(self.stop.status, partial=self.stop.tool_result, announce=self._announce_cancelled)

    def _announce_cancelled(self) -> None:
        self.rows.set_status("idle")
        self.rows.emit(
            AgentCancelled,
            turn_id=self.rows.turn_id,
            interrupted_message_ids=self.interrupted_message_ids,
            interrupted_tool_call_ids=self.interrupted_tool_call_ids,
        )

    async def finish_failed(self, code: str, message: str, *, retry_after: float | None = None) -> None:
        self._retry_after = retry_after
        await self._end("failed", partial=TOOL_INTERRUPTED_BY_ERROR, error=(code, message))

    def _error_row(self, code: str, message: str) -> ChatMessageRow:
        return self.rows.row(
            "error", now_iso(), role="assistant", content=message, code=code, model=self.rows.model
        )

    def _announce_error(self, row: ChatMessageRow) -> None:
        self.rows.emit(
            ErrorEvent,
            id=row.id,
            message=row.content or "",
            code=row.code or "",
            model=self.rows.model,
            timestamp=row.timestamp,
            retry_after=self._retry_after,
            trace_id=current_trace_id(),
        )

    async def close(self, status: TurnStatus) -> None:
        await self._end(status)

    async def write_deferred(self) -> None:
        """A last response that waits for the turn's end, followed after all by another event: written
        now, before it (defensive: the agent yields nothing after a response without calls)."""
        write, self.deferred = self.deferred, None
        if write is not None:
            try:
                async with self.rows.transaction() as db:
                    await write(db)
            except BaseException:
                self.deferred = write
                raise

    async def _end(
        self,
        status: TurnStatus,
        *,
        partial: str | None = None,
        announce: Callable[[], None] | None = None,
        error: tuple[str, str] | None = None,
    ) -> None:
        """The turn's end in one transaction, which releases its lease: the last response if it waits
        (`deferred`), the partial state of a stop or failure, the error, and turn_done, each with its
        events in that order. Either all of it commits or none of it does, so `end_durably` can run it
        again; the turn's state changes only once it committed."""
        if self.closed:
            return
        # A turn that completes can still be stopped until its end's transaction has its turn to write
        # (a write of the session before it, an interrupt's, holds it): the stop is then recorded by that
        # transaction, as it was when the last response was a write of its own (recorder.request_stop).
        completing = status == "completed"
        if completing:
            self.stop.ending = True
        else:
            self.stop.finishing = True
        # The live status goes idle with the end's events; if they do not commit, the turn is still live.
        live = self.rows.live.get(self.rows.session_id)
        try:
            async with self.rows.transaction(final=True) as db:
                self.stop.finishing = True
                if completing and self.stop.requested:
                    status, partial = self.stop.status, self.stop.tool_result
                    announce = self._announce_cancelled
                if self.deferred is not None:
                    await self.deferred(db)
                if partial is not None:
                    await self._write_partial(db, partial, announce)
                failure = [self._error_row(*error)] if error is not None else []
                # Stamped last, as it comes last: a turn's entries are stamped in their order.
                duration = round(time.monotonic() - self.started, 3)
                done = self.rows.row("turn_done", now_iso(), duration_seconds=duration, status=status)
                # Inserted first: a row whose id was taken gets a fresh one, which its event must carry.
                await repository.insert_messages(db, [*failure, done], new_message_id)
                for row in failure:
                    self._announce_error(row)
                self._announce_end(done)
        except BaseException:
            self.rows.live.set(self.rows.session_id, live)
            raise
        self.deferred = None
        if partial is not None:
            self.round.text, self.round.tools, self.round.calls = None, {}, []
            self.round.reasoning = None
        self.closed = True
        self.closed_status = status

    async def end_durably(self, end: Callable[[], Awaitable[None]]) -> None:
        """Runs `end` (finish_cancelled, finish_failed, close) until storage takes it. While storage
        refuses it, `stalled` says why (a cancel answers that) and the turn stays this process's: nothing
        starts after it, and at a restart recovery closes it. A turn whose output the database refused
        for its data (not storage refusing work) loses that pending output and ends failed instead, once;
        any other failure is raised."""
        delay = END_RETRY_FIRST
        discarded = False
        if self.rows.writer.refused(self.rows.session_id) is not None:
            # Output of this turn the database refused was dropped (WriteBehind._isolate): it ends failed.
            end = partial(self.finish_failed, "storage_error", STORAGE_ERROR_MESSAGE)
        while True:
            try:
                await end()
            except LeaseLost:
                # Another replica owns the turn now (or will, once the lease expires): it closes it.
                log.warning("turn %s: not closed here, this replica lost its lease", self.rows.turn_id)
                return
            except Exception as exc:
                refusal = storage_refusal(exc)
                if refusal is None:
                    if discarded:
                        raise
                    # The database refuses something of the turn for its data (the end commits the
                    # session's pending events and text with it): that goes, and the turn ends failed.
                    log.exception(
                        "turn %s: its end was refused; ending it failed without its pending output",
                        self.rows.turn_id,
                    )
                    discarded = True
                    self.rows.writer.discard(self.rows.session_id)
                    self.rows.writer.refused(self.rows.session_id)
                    end = partial(self.finish_failed, "storage_error", STORAGE_ERROR_MESSAGE)
                    continue
                if self.stalled is None:
                    log.error(
                        "turn %s: its end cannot be written (%s: %s); retrying until storage works",
                        self.rows.turn_id,
                        refusal.code,
                        exc,
                    )
                self.stalled = refusal
                self._stall.set()
                await asyncio.sleep(delay)
                delay = min(delay * 2, END_RETRY_MOST)
            else:
                if self.stalled is not None:
                    log.warning("turn %s: its end is written, storage works again", self.rows.turn_id)
                    self.stalled = None
                    self._stall.clear()
                return

    async def stall(self) -> StorageUnavailable:
        """Returns once the turn's end is stuck on storage (see end_durably), with what storage said."""
        while True:
            await self._stall.wait()
            if self.stalled is not None:
                return self.stalled
            self._stall.clear()

    def _announce_end(self, done: ChatMessageRow) -> None:
        if self.rows.live.get(self.rows.session_id).agent_status != "idle":
            self.rows.set_status("idle")
        self.rows.emit(
            TurnDone,
            id=done.id,
            turn_id=self.rows.turn_id,
            timestamp=done.timestamp,
            duration_seconds=done.duration_seconds or 0.0,
            status=done.status or "completed",
        )

    # --- after a crash -------------------------------------------------------------------------------

    async def close_after_restart(
        self,
        started_at: str,
        rows: Sequence[ChatMessageRow],
        seen_text: Mapping[str, str],
        *,
        cancelled: bool = False,
    ) -> None:
        """Closes a turn a crash left open, as a stop by the server would have: its streamed text kept as
        `seen_text` gives it and marked, its calls without a result given TOOL_INTERRUPTED_BY_RESTART, and
        a turn_done interrupted. Its duration runs from its start to this close (downtime included: when
        the process died is not recorded). `cancelled`: a user's cancel was asked for before its process
        died (multi-replica mode: the flag on its lease), so it closes as that cancel would have:
        TOOL_INTERRUPTED_BY_USER, and a turn_done cancelled."""
        self.stop.finishing = True
        at = now_iso()
        status = "cancelled" if cancelled else "interrupted"
        result = TOOL_INTERRUPTED_BY_USER if cancelled else TOOL_INTERRUPTED_BY_RESTART
        done = self.rows.row(
            "turn_done", at, duration_seconds=_seconds_between(started_at, at), status=status
        )
        async with self.rows.transaction(final=True) as db:
            for row in rows:
                if row.type == "tool_group" and row.result is None:
                    values = {"result": result, "is_error": True, "interrupted": True}
                    await repository.update_message(db, row.id, values)
                    self.interrupted_message_ids.append(row.id)
                    self.interrupted_tool_call_ids.append(row.tool_call_id or "")
                elif (
                    row.type in ("text", "reasoning") and row.role == "assistant" and row.duration_ms is None
                ):
                    content = seen_text.get(row.id, row.content or "")
                    await repository.update_message(db, row.id, {"content": content, "interrupted": True})
                    self.interrupted_message_ids.append(row.id)
            await repository.insert_messages(db, [done], new_message_id)
            self._announce_cancelled()
            self._announce_end(done)
        self.closed = True

    async def announce_lost_end(self, done: ChatMessageRow) -> None:
        """Announces a turn_done row whose event was lost (a log written by a version that committed a
        turn's end before its event)."""
        self.stop.finishing = True
        async with self.rows.transaction():
            self.rows.set_status("idle")
            self._announce_end(done)
        self.closed = True


def _seconds_between(start: str, end: str) -> float:
    elapsed = (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    return round(max(elapsed, 0.0), 3)
