"""SQL of calls that wait outside the service (pending_tool_requests) and of their tool_group rows.
Functions take a database session (`db`) and never commit: callers own transactions."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import update
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from app.storage.tables import ChatMessageRow, PendingToolRequestRow

WAITING = "pending"
# An approved call marked before it runs: a crash from there on never runs it again.
RUNNING = "running"


async def insert(db: AsyncSession, rows: Sequence[PendingToolRequestRow]) -> None:
    db.add_all(rows)
    await db.flush()


async def update_request(db: AsyncSession, turn_id: str, tool_call_id: str, values: dict[str, Any]) -> None:
    await db.exec(
        update(PendingToolRequestRow)
        .where(
            col(PendingToolRequestRow.turn_id) == turn_id,
            col(PendingToolRequestRow.tool_call_id) == tool_call_id,
        )
        .values(**values)
    )


async def close_turn_requests(db: AsyncSession, turn_id: str, at: str) -> None:
    """The turn ends: whatever of it still waits (or was approved and never started) is interrupted."""
    await db.exec(
        update(PendingToolRequestRow)
        .where(
            col(PendingToolRequestRow.turn_id) == turn_id,
            (col(PendingToolRequestRow.state) == WAITING)
            | (
                (col(PendingToolRequestRow.state) == "answered")
                & col(PendingToolRequestRow.decision).in_(["approve", "edit"])
            ),
        )
        .values(state="interrupted", answered_at=at)
    )


async def waiting_in_session(db: AsyncSession, session_id: str) -> list[PendingToolRequestRow]:
    """What waits for an answer in the session, in call order."""
    query = (
        select(PendingToolRequestRow)
        .where(
            col(PendingToolRequestRow.session_id) == session_id, col(PendingToolRequestRow.state) == WAITING
        )
        .order_by(col(PendingToolRequestRow.position))
    )
    return list((await db.exec(query)).all())


async def latest_for_calls(
    db: AsyncSession, session_id: str, tool_call_ids: Sequence[str]
) -> dict[str, PendingToolRequestRow]:
    """The session's newest request of each call id (a model may reuse an id in a later turn)."""
    query = (
        select(PendingToolRequestRow)
        .where(
            col(PendingToolRequestRow.session_id) == session_id,
            col(PendingToolRequestRow.tool_call_id).in_(list(tool_call_ids)),
        )
        .order_by(col(PendingToolRequestRow.position))
    )
    return {row.tool_call_id: row for row in (await db.exec(query)).all()}


async def of_turn(db: AsyncSession, turn_id: str) -> list[PendingToolRequestRow]:
    query = (
        select(PendingToolRequestRow)
        .where(col(PendingToolRequestRow.turn_id) == turn_id)
        .order_by(col(PendingToolRequestRow.position))
    )
    return list((await db.exec(query)).all())


async def suspended_turns(db: AsyncSession, turn_id: str | None = None) -> list[str]:
    """Turns with a call still waiting for an answer, or approved and not yet started: at startup they
    resume instead of being closed as interrupted (an open turn, whose turn_done is missing). With
    `turn_id`, that turn if it is one (a sweeper taking over a dead replica's turn resumes it too)."""
    done = select(ChatMessageRow.turn_id).where(col(ChatMessageRow.type) == "turn_done")
    query = (
        select(PendingToolRequestRow.turn_id)
        .where(
            (col(PendingToolRequestRow.state) == WAITING)
            | (
                (col(PendingToolRequestRow.state) == "answered")
                & col(PendingToolRequestRow.decision).in_(["approve", "edit"])
            ),
            col(PendingToolRequestRow.turn_id).not_in(done),
        )
        .distinct()
    )
    if turn_id is not None:
        query = query.where(col(PendingToolRequestRow.turn_id) == turn_id)
    return list((await db.exec(query)).all())


async def set_tool_arguments(db: AsyncSession, message_id: str, arguments: Any) -> None:
    """An edited call's arguments, on its tool_group row (the history shows what ran)."""
    await db.exec(
        update(ChatMessageRow)
        .where(col(ChatMessageRow.id) == message_id)
        .values(arguments=json.loads(json.dumps(arguments)))
    )
