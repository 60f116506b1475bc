"""Startup repair of turns a crash left open: each is handed to a recorder that closes it as interrupted,
with a valid history.

For each turn_start without a turn_done: the streamed text is kept and marked interrupted (as much of it
as clients saw: the event log, written more often than the text, may hold more than the last text flush),
tool calls without a result get TOOL_INTERRUPTED_BY_RESTART as an error result, and a turn_done with
status interrupted closes the turn (TurnLog.close_after_restart).

Clients learn it through the events a stop sends (agent_status idle, agent_cancelled naming what was
cut, turn_done), which go into the log like any other: a client that reconnects with Last-Event-ID
gets them.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime

from app.storage import event_log, pending, repository
from app.storage.engine import Database
from app.storage.tables import ChatMessageRow
from app.streaming.writer import WriteBehind
from app.turns.ends import TurnLog
from app.turns.live import LiveStatusBoard
from app.turns.resume import last_round
from app.turns.runner import Runner

log = logging.getLogger(__name__)


def _turn_log(writer: WriteBehind, live: LiveStatusBoard, session_id: str, turn_id: str) -> TurnLog:
    return TurnLog(
        writer=writer,
        events=writer.publisher(session_id),
        live=live,
        session_id=session_id,
        turn_id=turn_id,
        model="",
    )


async def close_open_turns(
    database: Database, writer: WriteBehind, live: LiveStatusBoard, *, leased: frozenset[str] = frozenset()
) -> int:
    """Closes every turn left open, but those in `leased` (multi-replica mode: turns some replica holds a
    lease of, alive or expired; the sweeper closes the expired ones)."""
    # First, while the log holds only what was logged before the crash.
    try:
        async with database.session() as db:
            lost = await event_log.turn_ends_missing_from_log(db)
    except Exception:  # the repair below does not need it: a restart goes on
        log.exception("the turn ends a crash lost from the log could not be read")
        lost = []
    for done in lost:
        try:
            await _turn_log(writer, live, done.session_id, done.turn_id).announce_lost_end(done)
        except Exception:  # one turn's rows never stop a restart: the others are repaired, this one logged
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
        except Exception:
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
    """Closes one turn whose process is gone, as a stop by the server would have (TurnLog.
    close_after_restart; as the user's stop would have, if `cancelled`); False when it was closed
    already. In multi-replica mode the caller holds the turn's lease (taken over), and the close
    releases it."""
    async with database.session() as db:
        rows = await repository.turn_messages(db, turn_id)
    seen = {row.id: await _seen_text(database, row) for row in rows if _streaming(row)}
    if not rows or any(row.type == "turn_done" for row in rows):
        return False
    closing = _turn_log(writer, live, session_id, turn_id)
    await closing.close_after_restart(rows[0].timestamp, rows, seen, cancelled=cancelled)
    return True


async def resume_suspended(database: Database, runner: Runner) -> int:
    """Turns that waited for answers (client results, approvals) when the server stopped or died wait
    again: same requests, same expiry, answerable as before. Their round's calls that were running get
    the restart's interrupted result (turns.resume)."""
    async with database.session() as db:
        turn_ids = await pending.suspended_turns(db)
    resumed = 0
    for turn_id in turn_ids:
        try:
            again = await resume_turn(database, runner, turn_id)
        except Exception:
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
        except Exception:
            log.exception("the waiting messages of session %s could not start after a restart", session_id)


def _streaming(row: ChatMessageRow) -> bool:
    return row.type == "text" and row.role == "assistant" and row.duration_ms is None


async def _seen_text(database: Database, row: ChatMessageRow) -> str:
    """The longer of the flushed text and the logged deltas, when the log holds the message from its start.
    The flushed text when the log cannot be read (an event an older version logged that PostgreSQL's JSON
    functions refuse, such as a `\\u0000` escape): the turn is closed with what its row holds."""
    flushed = row.content or ""
    try:
        async with database.session() as db:
            logged_events = await event_log.message_deltas(db, row.session_id, row.id)
    except Exception:
        log.exception("the logged deltas of message %s could not be read; keeping its flushed text", row.id)
        return flushed
    deltas = [json.loads(event.data) for event in logged_events]
    # Only the first delta of a message carries its timestamp: without it, retention cut the beginning.
    if not deltas or "timestamp" not in deltas[0]:
        return flushed
    logged = "".join(str(delta.get("text", "")) for delta in deltas)
    return logged if len(logged) > len(flushed) and logged.startswith(flushed) else flushed
