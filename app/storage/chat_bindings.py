"""SQL of the frontend kits' adapters: the binding of a kit's chat id to a session (`chat_bindings`), and
where a running turn starts in the event log (a kit's resume replays the turn from there)."""

from __future__ import annotations

from sqlmodel.ext.asyncio.session import AsyncSession

from app.storage.sql import json_text_sql, raw

# The first binding of a (principal, kit, chat) wins; a racing insert leaves it and reads it back.
_BIND = (
    "INSERT INTO chat_bindings (principal, kit, chat_key, session_id, created_at) VALUES (?, ?, ?, ?, ?)"
    " ON CONFLICT (principal, kit, chat_key) DO NOTHING"
)
_FIND = "SELECT session_id FROM chat_bindings WHERE principal = ? AND kit = ? AND chat_key = ?"


async def bound_session(db: AsyncSession, principal: str, kit: str, chat_key: str) -> str | None:
    found = await (await raw(db)).fetchall(_FIND, (principal, kit, chat_key))
    return str(found[0][0]) if found else None


async def bind_session(
    db: AsyncSession, principal: str, kit: str, chat_key: str, session_id: str, at: str
) -> str:
    """Binds the chat to `session_id` unless it is bound already; the session it is bound to now."""
    conn = await raw(db)
    await conn.execute(_BIND, (principal, kit, chat_key, session_id, at))
    found = await conn.fetchall(_FIND, (principal, kit, chat_key))
    return str(found[0][0])


async def turn_start_seq(db: AsyncSession, session_id: str, turn_id: str) -> int | None:
    """The number of the turn's `turn_start` event, if the log still holds it."""
    conn = await raw(db)
    turn = json_text_sql(conn.dialect, "data", "turn_id")
    found = await conn.fetchall(
        f"SELECT max(seq) FROM events WHERE session_id = ? AND type = 'turn_start' AND {turn} = ?",
        (session_id, turn_id),
    )
    return int(found[0][0]) if found and found[0][0] is not None else None
