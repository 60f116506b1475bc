"""kill -9 right after the 202s: whatever the history holds, the event log announces.

The server runs with its write-behind's batches paused (tests/support/paused_writer_app.py), so the
only events that reach the log are those committed in the same transaction as the rows they announce:
exactly the guarantee under test. Five sessions start turns, one more message waits its turn, and the
server is killed at once. After a restart (which closes the open turns), every row of the history that
clients are told about (a turn's start, each user message, each tool call, each turn's end) has its
event in the log, and the log's numbers have no gap.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from app.storage import event_log, repository
from app.storage.engine import Database
from tests.support.client import LONG, new_session, post
from tests.support.process import ServerProcess

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.processes]

ANNOUNCED = {"turn_start": "turn_start", "tool_group": "tool_exec_start", "turn_done": "turn_done"}


@pytest.mark.both_backends
async def test_kill_9_right_after_the_202s_loses_no_announcement(database_url: str, tmp_path: Path) -> None:
    env = {"PARLEY_DATABASE_URL": database_url, "PARLEY_DEMO_TOKEN_DELAY": "0.05"}
    paused = ServerProcess(env, tmp_path / "paused.log", app="tests.support.paused_writer_app:app")
    await asyncio.to_thread(paused.start)
    try:
        async with httpx.AsyncClient(base_url=paused.base_url, timeout=30) as client:
            sids = [await new_session(client) for _ in range(5)]
            acknowledged = [await post(client, sid, LONG) for sid in sids]
            acknowledged.append(await post(client, sids[0], "and after that?"))
            acknowledged.append(await post(client, sids[1], "what time is it?"))
            await asyncio.to_thread(paused.kill)
    finally:
        paused.kill()
    assert [a["queued"] for a in acknowledged] == [False] * 5 + [True] * 2

    restarted = ServerProcess(env, tmp_path / "restarted.log", port=paused.port)
    await asyncio.to_thread(restarted.start)
    await asyncio.to_thread(restarted.terminate)

    database = Database(database_url)
    try:
        for sid in sids:
            async with database.session() as db:
                rows = await repository.list_messages(db, sid)
                events = [json.loads(e.data) for e in await event_log.events_after(db, sid, 0, 10_000)]
            assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
            announced = {(e["type"], e.get("id")) for e in events}
            for row in rows:
                if row.type in ANNOUNCED:
                    assert (ANNOUNCED[row.type], row.id) in announced, (sid, row.type, events)
                elif row.role == "user":
                    assert ("user_message", row.id) in announced, (sid, row.id, events)
    finally:
        await database.dispose()
    # Each acknowledged message is stored once, and announced: taken by a turn, or waiting in the line.
    async with database.session() as db:
        for message in acknowledged:
            stored = await repository.get_message(db, str(message["id"]))
            waiting = await repository.get_queued(db, str(message["id"]))
            assert (stored is None) != (waiting is None), message
    await database.dispose()
