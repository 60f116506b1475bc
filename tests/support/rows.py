"""Rows tests seed a migrated database with."""

from __future__ import annotations

from app.storage.engine import Database
from app.storage.tables import ChatSessionRow

T0 = "2026-02-28T06:30:00.000+00:00"


async def add_sessions(database: Database, *session_ids: str) -> None:
    """Empty demo-model sessions, created at T0."""
    async with database.session() as db:
        for session_id in session_ids:
            db.add(ChatSessionRow(id=session_id, model="parley/demo", tools=[], created_at=T0, updated_at=T0))
        await db.commit()
