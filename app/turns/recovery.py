"""Startup repair of turns a crash left open: they are closed as interrupted, with a valid history.

For each turn_start without a turn_done: the streamed text is kept and marked interrupted (as much of it
as clients saw: the event log, written more often than the text, may hold more than the last text flush),
tool calls without a result get TOOL_INTERRUPTED_BY_RESTART as an error result, and a turn_done with
status interrupted closes the turn. As for every turn, its duration runs from its start to its turn_done,
here the restart that closed it, downtime included: when the process died is not recorded (rows only
date when a text or a tool began, which would undercount a long answer).

Clients learn it through the events a stop sends (agent_status idle, agent_cancelled naming what was
cut, turn_done), which go into the log like any other: a client that reconnects with Last-Event-ID
gets them.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime

from sqlmodel.ext.asyncio.session import AsyncSession

from app.protocol.clock import now_iso
from app.protocol.events import AgentCancelled, AgentStatus, TurnDone
from app.protocol.ids import new_message_id
from app.storage import repository
from app.storage.engine import Database
from app.storage.tables import ChatMessageRow
from app.streaming.broker import Broker
from app.turns.recorder import TOOL_INTERRUPTED_BY_RESTART

log = logging.getLogger(__name__)


@dataclass
class _Closed:
    done: ChatMessageRow
    message_ids: list[str] = field(default_factory=list)
    tool_call_ids: list[str] = field(default_factory=list)


async def close_open_turns(db_: Database, broker: Broker) -> int:
    # First, while the log holds only what was logged before the crash.
    await _announce_lost_ends(db_, broker)
    async with db_.session() as db:
        open_turns = await repository.open_turns(db)
    for start in open_turns:
        async with db_.session() as db:
            closed = await _close(db, start)
            await db.commit()
        channel = await broker.channel(start.session_id)
        channel.publish(AgentStatus, status="idle", turn_id=start.turn_id)
        channel.publish(
            AgentCancelled,
            turn_id=start.turn_id,
            interrupted_message_ids=closed.message_ids,
            interrupted_tool_call_ids=closed.tool_call_ids,
        )
        done = closed.done
        channel.publish(
            TurnDone,
            id=done.id,
            turn_id=start.turn_id,
            timestamp=done.timestamp,
            duration_seconds=done.duration_seconds,
            status="interrupted",
        )
        log.warning("closed turn %s of session %s left open by a restart", start.turn_id, start.session_id)
    return len(open_turns)


async def _announce_lost_ends(db_: Database, broker: Broker) -> None:
    """A turn that ended just before a crash may have its turn_done row but not its event: announce it,
    or a client resuming from the log would show the agent working until it reloads."""
    async with db_.session() as db:
        lost = await repository.turn_ends_missing_from_log(db)
    for done in lost:
        channel = await broker.channel(done.session_id)
        channel.publish(AgentStatus, status="idle", turn_id=done.turn_id)
        channel.publish(
            TurnDone,
            id=done.id,
            turn_id=done.turn_id,
            timestamp=done.timestamp,
            duration_seconds=done.duration_seconds or 0.0,
            status=done.status or "completed",
        )
        log.warning("announced the end of turn %s, whose event a crash lost", done.turn_id)


async def _close(db: AsyncSession, start: ChatMessageRow) -> _Closed:
    rows = await repository.turn_messages(db, start.turn_id)
    at = now_iso()
    closed = _Closed(
        ChatMessageRow(
            id=new_message_id(),
            session_id=start.session_id,
            turn_id=start.turn_id,
            type="turn_done",
            timestamp=at,
            duration_seconds=_seconds_between(start.timestamp, at),
            status="interrupted",
        )
    )
    for row in rows:
        if row.type == "tool_group" and row.result is None:
            await repository.update_message(
                db, row.id, {"result": TOOL_INTERRUPTED_BY_RESTART, "is_error": True, "interrupted": True}
            )
            closed.message_ids.append(row.id)
            closed.tool_call_ids.append(row.tool_call_id or "")
        elif row.type == "text" and row.role == "assistant" and row.duration_ms is None:
            content = await _seen_text(db, row)
            await repository.update_message(db, row.id, {"content": content, "interrupted": True})
            closed.message_ids.append(row.id)
    await repository.insert_messages(db, [closed.done])
    return closed


async def _seen_text(db: AsyncSession, row: ChatMessageRow) -> str:
    """The longer of the flushed text and the logged deltas, when the log holds the message from its start."""
    flushed = row.content or ""
    deltas = [json.loads(event.data) for event in await repository.message_deltas(db, row.session_id, row.id)]
    # Only the first delta of a message carries its timestamp: without it, retention cut the beginning.
    if not deltas or "timestamp" not in deltas[0]:
        return flushed
    logged = "".join(str(delta.get("text", "")) for delta in deltas)
    return logged if len(logged) > len(flushed) and logged.startswith(flushed) else flushed


def _seconds_between(start: str, end: str) -> float:
    elapsed = (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    return round(max(elapsed, 0.0), 3)
