"""A restart while the SQLite disk is still full (issue 31): the server starts, serves reads, answers
writes with a 503 storage_full, and once space is freed it finishes the repair a crash left to do (the
turn left open closed as interrupted) before any new turn starts, then runs turns again.

The disk is made full as in tests/interrupt/test_storage_failure.py: every connection the server checks
out gets `PRAGMA max_page_count` at its current size while the test says so, so SQLite answers SQLITE_FULL
exactly as on a full disk. The crash is a database as a killed process leaves it: a turn with streamed
text and no end, whose log holds far more text than its last flush (as tests/turns/test_recovery.py
seeds it), so that closing it needs pages the full disk does not have."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from app.settings import Settings
from app.storage import event_log, repository
from app.storage.engine import Database
from app.storage.tables import ChatSessionRow
from tests.support.server import live_server
from tests.turns.test_recovery import SID, T0, T2, TURN, row
from tests.turns.test_recovery import event as logged

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SAFETY = 30.0


# What clients saw of the answer before the crash: far more than fits in the pages the database has.
SEEN = "word " * 8_000


async def seed(database: Database) -> None:
    async with database.session() as db:
        db.add(ChatSessionRow(id=SID, model="parley/demo", tools=[], created_at=T0, updated_at=T0))
        await db.flush()
        await repository.insert_messages(
            db,
            [
                row("m_00000start", "turn_start", T0),
                row("m_000000user", "text", T0, role="user", content="hi", sender="User"),
                row("m_000000text", "text", T2, role="assistant", model="parley/demo", content="word"),
            ],
        )
        half = len(SEEN) // 2
        await event_log.insert_events(
            db,
            [
                logged(1, "turn_start", id="m_00000start", turn_id=TURN, timestamp=T0),
                logged(
                    2, "text_delta", id="m_000000text", text=SEEN[:half], timestamp=T0, model="parley/demo"
                ),
                logged(3, "text_delta", id="m_000000text", text=SEEN[half:]),
            ],
        )
        await db.commit()


async def _history(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    response = await client.get(f"/v1/sessions/{SID}/messages")
    assert response.status_code == 200, response.text
    rows: list[dict[str, Any]] = response.json()["chat_messages"]
    return rows


async def _until(client: httpx.AsyncClient, done: Any) -> list[dict[str, Any]]:
    async with asyncio.timeout(SAFETY):
        while True:
            rows = await _history(client)
            if done(rows):
                return rows
            await asyncio.sleep(0.05)


async def test_a_restart_on_a_full_disk_serves_reads_refuses_writes_and_recovers(
    settings: Settings, full_disk: list[bool]
) -> None:
    database = Database(settings.database_url)
    await seed(database)
    await database.dispose()

    full_disk[0] = True
    with live_server(settings) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
            # Reads: the session, its history as the crash left it (no end yet), its events.
            assert (await client.get(f"/v1/sessions/{SID}")).status_code == 200
            before = await _history(client)
            assert "turn_done" not in [row["type"] for row in before]
            assert (await client.get("/v1/sessions")).status_code == 200
            # Writes: 503 storage_full, and nothing stored.
            created = await client.post("/v1/sessions", json={"system_prompt": "x" * 20_000})
            assert created.status_code == 503, created.text
            assert created.json()["error"]["code"] == "storage_full"
            posted = await client.post(f"/v1/sessions/{SID}/messages", json={"content": "x" * 20_000})
            assert posted.status_code == 503, posted.text
            assert posted.json()["error"]["code"] == "storage_full"
            assert await _history(client) == before

            # Space again: a message posted at once waits for the repair, which closes the old turn first.
            full_disk[0] = False
            posted = await client.post(f"/v1/sessions/{SID}/messages", json={"content": "hello again"})
            assert posted.status_code == 202, posted.text
            rows = await _until(client, lambda rows: [r["type"] for r in rows].count("turn_done") == 2)

    ends = [row for row in rows if row["type"] == "turn_done"]
    assert ends[0]["turn_id"] == TURN and ends[0]["status"] == "interrupted", ends
    assert ends[1]["status"] == "completed", ends
    assert [r["content"] for r in rows if r["id"] == "m_000000text"] == [SEEN]  # all the clients saw
    starts = [i for i, row in enumerate(rows) if row["type"] == "turn_start"]
    # The new turn starts after the old one's end: turns never overlap in the history.
    assert starts[1] > rows.index(ends[0])
    assert "hello again" in [row.get("content") for row in rows]
