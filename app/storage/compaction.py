"""The SQL of context compaction (docs/context.md): running summaries, what each call sent, and the
session's calibration. Functions take a database session and never commit: callers own transactions."""

from __future__ import annotations

from collections.abc import Sequence

from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from app.storage.tables import ContextSummaryRow, ContextViewRow

# Summaries looked at for a path's own: the newest of a session are nearly always its current path's.
_RECENT_SUMMARIES = 20


async def insert_summary(db: AsyncSession, row: ContextSummaryRow) -> None:
    db.add(row)
    await db.flush()


async def insert_view(db: AsyncSession, row: ContextViewRow) -> None:
    db.add(row)
    await db.flush()


async def summary_for(db: AsyncSession, session_id: str, path: Sequence[str]) -> ContextSummaryRow | None:
    """The summary of the path the history now follows (`path`: its turn ids in history order, once a turn
    or once a message): of the session's summaries whose last summarised turn is on it, the one reaching
    furthest along it (the newest of those ending on one turn). A summary of turns no longer in the
    history never applies. One written on another branch applies only when it ends on a turn this path
    shares (it summarises this path's turns, then) and reaches further than this path's own: never a
    newer but shorter one."""
    rows: Sequence[ContextSummaryRow] = (
        await db.exec(
            select(ContextSummaryRow)
            .where(col(ContextSummaryRow.session_id) == session_id)
            .order_by(col(ContextSummaryRow.position).desc())
            .limit(_RECENT_SUMMARIES)
        )
    ).all()
    depth = {turn_id: index for index, turn_id in enumerate(path)}
    found = [row for row in rows if row.through_turn_id in depth]
    # max keeps the first of equals: rows come newest first.
    return max(found, key=lambda row: depth[row.through_turn_id], default=None)


async def views_of_turns(db: AsyncSession, turn_ids: Sequence[str]) -> list[ContextViewRow]:
    """What the turns' compacted model calls sent, in the order they were made."""
    if not turn_ids:
        return []
    rows = await db.exec(
        select(ContextViewRow)
        .where(col(ContextViewRow.turn_id).in_(list(turn_ids)))
        .order_by(col(ContextViewRow.position))
    )
    return list(rows.all())
