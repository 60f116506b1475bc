"""The app with its write-behind's batches paused (its task's, and those a turn's task makes of a first
delta): nothing reaches the event log but what a turn (or a request) commits in its own transaction.
For kill -9 tests: an event that only a batch would have logged is lost at the kill, so a test sees
exactly which events commit with their rows.

    python -m uvicorn tests.support.paused_writer_app:app
"""

from __future__ import annotations

import asyncio

from app.main import create_app
from app.streaming.log.schedule import GroupCommit


async def _paused(self: GroupCommit) -> None:
    await asyncio.Event().wait()


async def _left_to_batches(self: GroupCommit, session_id: str) -> None:
    """A first delta is left to the (paused) batches."""


GroupCommit._run = _paused  # type: ignore[method-assign]
GroupCommit.opened = _left_to_batches  # type: ignore[method-assign]

app = create_app()
