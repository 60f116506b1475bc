"""The app with its write-behind's batches paused: nothing reaches the event log but what a turn (or a
request) commits in its own transaction. For kill -9 tests: an event that only a batch would have
logged is lost at the kill, so a test sees exactly which events commit with their rows.

    python -m uvicorn tests.support.paused_writer_app:app
"""

from __future__ import annotations

import asyncio

from app.main import create_app
from app.streaming.writer import WriteBehind


async def _paused(self: WriteBehind) -> None:
    await asyncio.Event().wait()


WriteBehind._run = _paused  # type: ignore[method-assign]

app = create_app()
