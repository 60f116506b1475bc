"""The SQL of the turn view: a session's turns found by their turn_start rows, then their messages."""

from __future__ import annotations

from collections.abc import Sequence

from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from app.storage.sql import raw
from app.storage.tables import ChatMessageRow
from app.storage.turn_tree import on_path


async def turn_position(db: AsyncSession, session_id: str, turn_id: str) -> int | None:
    """The history position of the turn's turn_start, or None when the session has no such turn."""
    query = select(ChatMessageRow.position).where(
        col(ChatMessageRow.session_id) == session_id,
        col(ChatMessageRow.turn_id) == turn_id,
        col(ChatMessageRow.type) == "turn_start",
    )
    return (await db.exec(query)).first()


async def latest_turn_ids(
    db: AsyncSession, session_id: str, *, limit: int, before_position: int | None
) -> list[str]:
    """The ids of the `limit` newest turns of the session's active path (before `before_position`), newest
    first."""
    condition, params = on_path(session_id, None)
    statement = (
        f"SELECT turn_id FROM chat_messages WHERE session_id = ? AND type = 'turn_start' AND {condition}"
    )
    params = [session_id, *params]
    if before_position is not None:
        statement += " AND position < ?"
        params.append(before_position)
    statement += " ORDER BY position DESC LIMIT ?"
    found = await (await raw(db)).fetchall(statement, [*params, limit])
    return [row[0] for row in found]


async def messages_of_turns(
    db: AsyncSession, session_id: str, turn_ids: Sequence[str]
) -> list[ChatMessageRow]:
    """Every chat message of those turns of the session, in history order."""
    query = (
        select(ChatMessageRow)
        .where(col(ChatMessageRow.session_id) == session_id, col(ChatMessageRow.turn_id).in_(turn_ids))
        .order_by(col(ChatMessageRow.position))
    )
    return list((await db.exec(query)).all())


async def open_turn_id(db: AsyncSession, session_id: str) -> str | None:
    """The session's turn that has a turn_start and no turn_done yet (it runs somewhere), if any."""
    done = select(ChatMessageRow.turn_id).where(
        col(ChatMessageRow.session_id) == session_id, col(ChatMessageRow.type) == "turn_done"
    )
    query = select(ChatMessageRow.turn_id).where(
        col(ChatMessageRow.session_id) == session_id,
        col(ChatMessageRow.type) == "turn_start",
        col(ChatMessageRow.turn_id).not_in(done),
    )
    return (await db.exec(query.order_by(col(ChatMessageRow.position).desc()))).first()


async def turn_state(db: AsyncSession, turn_id: str) -> tuple[str, bool] | None:
    """(session_id, ended) of the turn: ended once its turn_done row is stored; None if no such turn."""
    query = select(ChatMessageRow.session_id, ChatMessageRow.type).where(
        col(ChatMessageRow.turn_id) == turn_id, col(ChatMessageRow.type).in_(("turn_start", "turn_done"))
    )
    rows = list((await db.exec(query)).all())
    if not rows:
        return None
    return rows[0][0], any(type_ == "turn_done" for _, type_ in rows)
