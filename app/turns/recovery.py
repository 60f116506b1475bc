"""Startup repair of turns a crash left open: each is handed to a recorder that closes it as interrupted,
with a valid history.

For each turn_start without a turn_done: the streamed text is kept and marked interrupted (as much of it
as clients saw: the event log, written more often than the text, may hold more than the last text flush),
tool calls without a result get TOOL_INTERRUPTED_BY_RESTART as an error result, and a turn_done with
status interrupted closes the turn (TurnEnds.close_after_restart).

When storage refuses the repair at startup (SQLite's disk still full), the server serves anyway
(`StartupRepair`): reads work, writes get storage's 503, no turn starts (a post only queues its
message), and the repair is retried every REPAIR_RETRY_SECONDS until storage takes it; then the turns
that wait start, in order.

Clients learn it through the events a stop sends (agent_status idle, agent_cancelled naming what was
cut, turn_done), which go into the log like any other: a client that reconnects with Last-Event-ID
gets them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from datetime import UTC, datetime

from app.errors.storage import storage_refusal
from app.storage import event_log, pending, repository
from app.storage.engine import Database
from app.storage.tables import ChatMessageRow
from app.streaming.log.write_behind import WriteBehind
from app.turns.live import LiveStatusBoard
from app.turns.recorder.ends import TurnEnds
from app.turns.recorder.rows import TurnRows
from app.turns.runtime.runner import Runner
from app.turns.suspended import last_round

log = logging.getLogger(__name__)

REPAIR_RETRY_SECONDS = 2.0


class StartupRepair:
    """One process owns every session: what a crash left is repaired before any client can ask, or, where
    storage refuses it, before any turn starts (see the module's docstring)."""

    def __init__(
        self,
        database: Database,
        writer: WriteBehind,
        live: LiveStatusBoard,
        runner: Runner,
        *,
        retry_seconds: float = REPAIR_RETRY_SECONDS,
    ) -> None:
        self._database = database
        self._writer = writer
        self._live = live
        self._runner = runner
        self._retry_seconds = retry_seconds
        self._closed = False
        self._retrying: asyncio.Task[None] | None = None

    @property
    def pending(self) -> bool:
        return self._retrying is not None and not self._retrying.done()

    async def start(self) -> None:
        """Repairs now; where storage refuses, goes on serving and retries in the background. Any other
        failure stops the start, as before."""
        self._runner.hold_turns()
        try:
            await self._attempt()
        except Exception as exc:
            refusal = storage_refusal(exc)
            if refusal is None:
                raise
            log.error(
                "the repair of what the last run left waits for storage (%s): serving meanwhile (what "
                "storage refuses gets its 503), and no turn starts until it is done; retrying every %.0f s",
                refusal.code,
                self._retry_seconds,
            )
            self._retrying = asyncio.create_task(self._retry(), name="startup-repair")
            return
        self._release()

    async def stop(self) -> None:
        if self._retrying is not None:
            self._retrying.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retrying

    async def _retry(self) -> None:
        while True:
            await asyncio.sleep(self._retry_seconds)
            try:
                await self._attempt()
            except Exception as exc:
                if storage_refusal(exc) is None:
                    log.exception("the repair of what the last run left failed; retrying")
                continue
            log.warning("storage works again: the repair of what the last run left is done")
            self._release()
            return

    async def _attempt(self) -> None:
        if not self._closed:
            await close_open_turns(self._database, self._writer, self._live)
            # The repair is in the log (and the turns it closed are announced) before any client can ask.
            await self._writer.flush()
            self._closed = True
            await resume_suspended(self._database, self._runner)
        await resume_waiting(self._database, self._runner)

    def _release(self) -> None:
        """Posts start turns again. A message queued meanwhile (while storage was refused) is taken by a
        last look at the waiting lines, after the release, so none is left waiting."""
        self._runner.release_turns()
        if self._retrying is not None:  # only then could a post have queued one meanwhile
            task = asyncio.create_task(resume_waiting(self._database, self._runner), name="startup-take")
            task.add_done_callback(_log_failure)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("taking the messages queued during the repair failed: %s", task.exception())


def _turn_ends(writer: WriteBehind, live: LiveStatusBoard, session_id: str, turn_id: str) -> TurnEnds:
    """The recorder's ends alone, over the turn's rows: all a turn whose process is gone needs."""
    rows = TurnRows(
        writer=writer,
        events=writer.publisher(session_id),
        live=live,
        session_id=session_id,
        turn_id=turn_id,
        model="",
    )
    return TurnEnds(rows)


async def close_open_turns(
    database: Database, writer: WriteBehind, live: LiveStatusBoard, *, leased: frozenset[str] = frozenset()
) -> int:
    """Closes every turn left open, but those in `leased` (multi-replica mode: turns some replica holds a
    lease of, alive or expired; the sweeper closes the expired ones)."""
    # First, while the log holds only what was logged before the crash.
    try:
        async with database.session() as db:
            lost = await event_log.turn_ends_missing_from_log(db)
    except Exception as exc:  # the repair below does not need it: a restart goes on
        _unless_storage_refuses(exc)
        log.exception("the turn ends a crash lost from the log could not be read")
        lost = []
    for done in lost:
        try:
            await _turn_ends(writer, live, done.session_id, done.turn_id).announce_lost_end(done)
        except (
            Exception
        ) as exc:  # one turn's rows never stop a restart: the others are repaired, this one logged
            _unless_storage_refuses(exc)
            log.exception("the lost end of turn %s could not be announced", done.turn_id)
            continue
        log.warning("announced the end of turn %s, whose event a crash lost", done.turn_id)
    async with database.session() as db:
        suspended = set(await pending.suspended_turns(db))
        open_turns = [
            t
            for t in await repository.open_turns(db)
            if t.turn_id not in suspended and t.turn_id not in leased
        ]
    closed = 0
    for start in open_turns:
        try:
            await close_left_turn(database, writer, live, start.session_id, start.turn_id)
        except Exception as exc:
            _unless_storage_refuses(exc)
            log.exception("turn %s of session %s could not be closed", start.turn_id, start.session_id)
            continue
        closed += 1
        log.warning("closed turn %s of session %s left open by a restart", start.turn_id, start.session_id)
    return closed


async def close_left_turn(
    database: Database,
    writer: WriteBehind,
    live: LiveStatusBoard,
    session_id: str,
    turn_id: str,
    *,
    cancelled: bool = False,
) -> bool:
    """Closes one turn whose process is gone, as a stop by the server would have (TurnEnds.
    close_after_restart; as the user's stop would have, if `cancelled`); False when it was closed
    already. In multi-replica mode the caller holds the turn's lease (taken over), and the close
    releases it."""
    async with database.session() as db:
        rows = await repository.turn_messages(db, turn_id)
    seen = {row.id: await _seen_text(database, row) for row in rows if _streaming(row)}
    if not rows or any(row.type == "turn_done" for row in rows):
        return False
    closing = _turn_ends(writer, live, session_id, turn_id)
    await closing.close_after_restart(rows[0].timestamp, rows, seen, cancelled=cancelled)
    return True


async def resume_suspended(database: Database, runner: Runner) -> int:
    """Turns that waited for answers (client results, approvals) when the server stopped or died wait
    again: same requests, same expiry, answerable as before. Their round's calls that were running get
    the restart's interrupted result (turns.suspended)."""
    async with database.session() as db:
        turn_ids = await pending.suspended_turns(db)
    resumed = 0
    for turn_id in turn_ids:
        try:
            again = await resume_turn(database, runner, turn_id)
        except Exception as exc:
            _unless_storage_refuses(exc)
            log.exception("turn %s could not be resumed after a restart", turn_id)
            continue
        if again:
            resumed += 1
            log.warning("turn %s waits again for answers after a restart", turn_id)
    return resumed


async def resume_turn(database: Database, runner: Runner, turn_id: str) -> bool:
    """Runs a suspended turn (pending.suspended_turns) here again, from its rows: its waiting round first.
    False when its session or its rows are gone, or it has ended."""
    async with database.session() as db:
        rows = await repository.turn_messages(db, turn_id)
        session = await repository.get_session(db, rows[0].session_id) if rows else None
    if session is None or any(row.type == "turn_done" for row in rows):
        return False
    elapsed = (datetime.now(UTC) - datetime.fromisoformat(rows[0].timestamp)).total_seconds()
    runner.resume_turn(session, turn_id, time.monotonic() - elapsed, last_round(rows, turn_id))
    return True


async def resume_waiting(database: Database, runner: Runner) -> None:
    """Messages acknowledged before a restart but never taken start their turns now."""
    async with database.read() as db:
        session_ids = await repository.sessions_with_queue(db)
    for session_id in session_ids:
        try:
            await runner.take_waiting(session_id)
        except Exception as exc:
            _unless_storage_refuses(exc)
            log.exception("the waiting messages of session %s could not start after a restart", session_id)


def _unless_storage_refuses(exc: Exception) -> None:
    """Re-raises what says storage refuses every write (busy, full, unreachable): then the whole repair
    waits and is retried (StartupRepair). Anything else is one row's or one turn's problem: the caller logs
    it and repairs the rest."""
    if storage_refusal(exc) is not None:
        raise exc


def _streaming(row: ChatMessageRow) -> bool:
    return row.type in ("text", "reasoning") and row.role == "assistant" and row.duration_ms is None


async def _seen_text(database: Database, row: ChatMessageRow) -> str:
    """The longer of the flushed text and the logged deltas, when the log holds the message from its start.
    The flushed text when the log cannot be read (an event an older version logged that PostgreSQL's JSON
    functions refuse, such as a `\\u0000` escape): the turn is closed with what its row holds."""
    flushed = row.content or ""
    try:
        async with database.session() as db:
            logged_events = await event_log.message_deltas(db, row.session_id, row.id)
    except Exception as exc:
        _unless_storage_refuses(exc)
        log.exception("the logged deltas of message %s could not be read; keeping its flushed text", row.id)
        return flushed
    deltas = [json.loads(event.data) for event in logged_events]
    # Only the first delta of a message carries its timestamp: without it, retention cut the beginning.
    if not deltas or "timestamp" not in deltas[0]:
        return flushed
    logged = "".join(str(delta.get("text", "")) for delta in deltas)
    return logged if len(logged) > len(flushed) and logged.startswith(flushed) else flushed
