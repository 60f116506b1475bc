"""The SQL of a session's turn tree (docs/protocol.md, Branches): turn_start rows name their parent turn,
the session names its active head, and the active path is the head's line of parents, found by one
recursive query. Functions take a database session (`db`) and never commit."""

from __future__ import annotations

import json
from typing import Any

from sqlmodel.ext.asyncio.session import AsyncSession

from app.storage.sql import raw

# The session's head, or its latest turn when it names none (no turn yet, or a session from before).
# Parameters: session_id, session_id.
HEAD = (
    "COALESCE((SELECT head_turn_id FROM chat_sessions WHERE id = ?),"
    " (SELECT turn_id FROM chat_messages WHERE session_id = ? AND type = 'turn_start'"
    " ORDER BY position DESC LIMIT 1))"
)


def path_cte(start: str) -> str:
    """`path(turn_id, depth)`: the turn `start` (an SQL expression) and its ancestors, depth 0 at `start`.
    Parameters: session_id, the parameters of `start`, session_id."""
    return (
        "WITH RECURSIVE path(turn_id, parent_turn_id, depth) AS ("
        " SELECT turn_id, parent_turn_id, 0 FROM chat_messages"
        f" WHERE session_id = ? AND type = 'turn_start' AND turn_id = {start}"
        " UNION ALL"
        " SELECT m.turn_id, m.parent_turn_id, p.depth + 1 FROM chat_messages m"
        " JOIN path p ON m.turn_id = p.parent_turn_id"
        " WHERE m.session_id = ? AND m.type = 'turn_start')"
    )


def on_path(session_id: str, through: str | None) -> tuple[str, list[Any]]:
    """A condition on chat_messages rows: the row's turn is on the path ending at `through` (None: the
    active path, ending at the head), and its parameters."""
    if through is None:
        start, start_params = HEAD, [session_id, session_id]
    else:
        start, start_params = "?", [through]
    condition = f"turn_id IN ({path_cte(start)} SELECT turn_id FROM path)"
    return condition, [session_id, *start_params, session_id]


async def head(db: AsyncSession, session_id: str) -> str | None:
    """The active path's head: the session's head_turn_id, or its latest turn; None before any turn."""
    found = await (await raw(db)).fetchall(f"SELECT {HEAD}", (session_id, session_id))
    return found[0][0] if found else None


async def set_head(db: AsyncSession, session_id: str, turn_id: str) -> None:
    await (await raw(db)).execute(
        "UPDATE chat_sessions SET head_turn_id = ? WHERE id = ?", (turn_id, session_id)
    )


async def path(db: AsyncSession, session_id: str, through: str | None = None) -> list[str]:
    """The turn ids of the path ending at `through` (None: the active path), first turn first."""
    start, start_params = (HEAD, [session_id, session_id]) if through is None else ("?", [through])
    statement = f"{path_cte(start)} SELECT turn_id FROM path ORDER BY depth DESC"
    found = await (await raw(db)).fetchall(statement, [session_id, *start_params, session_id])
    return [row[0] for row in found]


async def turn_start(db: AsyncSession, session_id: str, turn_id: str) -> tuple[str | None, bool] | None:
    """(parent_turn_id, ended) of the session's turn; None when the session has no such turn."""
    found = await (await raw(db)).fetchall(
        "SELECT type, parent_turn_id FROM chat_messages WHERE session_id = ? AND turn_id = ?"
        " AND type IN ('turn_start', 'turn_done')",
        (session_id, turn_id),
    )
    starts = [parent for type_, parent in found if type_ == "turn_start"]
    if not starts:
        return None
    return starts[0], any(type_ == "turn_done" for type_, _ in found)


async def latest_in_subtree(db: AsyncSession, session_id: str, turn_id: str) -> str:
    """The most recent turn of the subtree under `turn_id` (itself included): where activating it leads."""
    statement = (
        "WITH RECURSIVE sub(turn_id, position) AS ("
        " SELECT turn_id, position FROM chat_messages"
        " WHERE session_id = ? AND type = 'turn_start' AND turn_id = ?"
        " UNION ALL"
        " SELECT m.turn_id, m.position FROM chat_messages m JOIN sub s ON m.parent_turn_id = s.turn_id"
        " WHERE m.session_id = ? AND m.type = 'turn_start')"
        " SELECT turn_id FROM sub ORDER BY position DESC LIMIT 1"
    )
    found = await (await raw(db)).fetchall(statement, (session_id, turn_id, session_id))
    return str(found[0][0]) if found else turn_id


async def siblings(
    db: AsyncSession, session_id: str, parents: set[str | None]
) -> dict[str | None, list[str]]:
    """The children of each of `parents` (None: the session's first turns), oldest first."""
    named = sorted(p for p in parents if p is not None)
    conditions = []
    params: list[Any] = [session_id]
    if named:
        conditions.append(f"parent_turn_id IN ({', '.join('?' * len(named))})")
        params += named
    if None in parents:
        conditions.append("parent_turn_id IS NULL")
    if not conditions:
        return {}
    found = await (await raw(db)).fetchall(
        "SELECT parent_turn_id, turn_id FROM chat_messages WHERE session_id = ? AND type = 'turn_start'"
        f" AND ({' OR '.join(conditions)}) ORDER BY position",
        params,
    )
    children: dict[str | None, list[str]] = {p: [] for p in parents}
    for parent, turn_id in found:
        children.setdefault(parent, []).append(turn_id)
    return children


# Events looked at for a turn's last usage (activate): the newest first, a branch's head is nearly always
# among the latest turns.
USAGE_SCAN = 5000


async def context_used_at(db: AsyncSession, session_id: str, turn_id: str) -> int | None:
    """The context size the last response of `turn_id` reported (its last token_usage event), or None when
    it had none (or lies beyond the scan). A session's turns never interleave: a turn's events run from its
    turn_start to the next turn_start."""
    found = await (await raw(db)).fetchall(
        "SELECT type, data FROM events WHERE session_id = ? AND type IN ('turn_start', 'token_usage')"
        " ORDER BY seq DESC LIMIT ?",
        [session_id, USAGE_SCAN],
    )
    latest: int | None = None
    for kind, data in found:
        event = json.loads(data)
        if kind == "token_usage":
            latest = event["context_used"] if latest is None else latest
        elif event.get("turn_id") == turn_id:
            return latest
        else:
            latest = None
    return None


async def set_context_used(db: AsyncSession, session_id: str, used: int) -> None:
    await (await raw(db)).execute(
        "UPDATE chat_sessions SET context_used = ? WHERE id = ?", (used, session_id)
    )
