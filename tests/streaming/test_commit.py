"""app.streaming.log.commit: a commit that has begun finishes, and its caller learns it did, even when the
caller is cancelled meanwhile; the cancellation comes at the caller's next await. How it proves it: a
real SQLite file, a commit slowed in the driver's path, a cancel while it runs, then the row read back
from another session and the caller seen cancelled only after `commit` returned."""

from __future__ import annotations

import asyncio

import pytest
from sqlmodel.ext.asyncio.session import AsyncSession

from app.storage.engine import Database
from app.streaming.log.commit import commit
from tests.support.rows import add_sessions

pytestmark = pytest.mark.anyio


async def test_a_cancelled_caller_still_knows_its_commit_landed(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = Database(database_url)
    original = AsyncSession.commit

    async def slow_commit(self: AsyncSession) -> None:
        await asyncio.sleep(0.2)
        await original(self)

    monkeypatch.setattr(AsyncSession, "commit", slow_commit)
    steps: list[str] = []

    async def writer() -> None:
        async with database.session() as db:
            connection = await db.connection()
            await connection.exec_driver_sql("UPDATE chat_sessions SET title = 'kept' WHERE id = 's_1'")
            await commit(db, "turn")
            steps.append("returned")
            await asyncio.sleep(1)
            steps.append("not reached")

    try:
        await add_sessions(database, "s_1")
        task = asyncio.create_task(writer())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with database.session() as db:
            found = await db.connection()
            title = (await found.exec_driver_sql("SELECT title FROM chat_sessions")).scalar()
    finally:
        await database.dispose()
    assert steps == ["returned"]
    assert title == "kept"
