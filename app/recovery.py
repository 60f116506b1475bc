"""Startup repair of turns a crash left open: they are closed as interrupted, with a valid history."""

from __future__ import annotations

import logging

from app import repository
from app.broker import Broker
from app.clock import new_message_id, now_iso
from app.db import Database
from app.events import AgentStatus, TurnDone
from app.models import ChatMessageRow

log = logging.getLogger(__name__)

TOOL_INTERRUPTED_BY_RESTART = "[Tool execution interrupted by server restart]"


async def close_open_turns(db_: Database, broker: Broker) -> int:
    async with db_.session() as db:
        open_turns = await repository.open_turns(db)
    for start in open_turns:
        async with db_.session() as db:
            rows = await repository.turn_messages(db, start.turn_id)
            for row in rows:
                if row.type == "tool_group" and row.result is None:
                    await repository.update_message(
                        db, row.id, {"result": TOOL_INTERRUPTED_BY_RESTART, "is_error": True}
                    )
                elif row.type == "text" and row.role == "assistant" and row.duration_ms is None:
                    await repository.update_message(db, row.id, {"interrupted": True})
            at = now_iso()
            done = ChatMessageRow(
                id=new_message_id(),
                session_id=start.session_id,
                turn_id=start.turn_id,
                type="turn_done",
                timestamp=at,
                duration_seconds=0.0,
                status="interrupted",
            )
            await repository.insert_messages(db, [done])
            await db.commit()
        channel = await broker.channel(start.session_id)
        channel.publish(AgentStatus, status="idle", turn_id=start.turn_id)
        channel.publish(
            TurnDone,
            id=done.id,
            turn_id=start.turn_id,
            timestamp=at,
            duration_seconds=0.0,
            status="interrupted",
        )
        log.warning("closed turn %s of session %s left open by a restart", start.turn_id, start.session_id)
    return len(open_turns)
