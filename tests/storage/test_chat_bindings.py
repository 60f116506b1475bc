"""A kit's chat id bound to a session (app.storage.chat_bindings, used by app.chat.kit_chats): the first
binding wins and a racing one reads it back, per principal and kit; deleting the session deletes its
bindings; and where a running turn starts in the event log."""

from __future__ import annotations

import httpx
import pytest

from app.storage import chat_bindings
from app.storage.engine import Database
from tests.support.server import LiveServer

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

AT = "2026-11-29T00:00:00.000+00:00"


async def test_the_first_binding_wins(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        first = (await client.post("/v1/sessions", json={})).json()["id"]
        second = (await client.post("/v1/sessions", json={})).json()["id"]
    database = Database(server.settings.database_url)
    try:
        async with database.session() as db:
            assert await chat_bindings.bound_session(db, "", "ai-sdk", "k" * 64) is None
            assert await chat_bindings.bind_session(db, "", "ai-sdk", "k" * 64, first, AT) == first
            assert await chat_bindings.bind_session(db, "", "ai-sdk", "k" * 64, second, AT) == first
            # Another kit, another principal: other chats.
            assert await chat_bindings.bind_session(db, "", "ag-ui", "k" * 64, second, AT) == second
            assert await chat_bindings.bind_session(db, "bob", "ai-sdk", "k" * 64, second, AT) == second
            await db.commit()
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            assert (await client.delete(f"/v1/sessions/{first}")).status_code == 204
        async with database.read() as db:
            assert await chat_bindings.bound_session(db, "", "ai-sdk", "k" * 64) is None
            assert await chat_bindings.bound_session(db, "", "ag-ui", "k" * 64) == second
    finally:
        await database.dispose()


async def test_the_running_turns_start_is_found_in_the_log(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        session_id = (await client.post("/v1/sessions", json={})).json()["id"]
        done = await client.post(f"/v1/sessions/{session_id}/messages?wait=true", json={"content": "hello"})
        turn_id = done.json()["turn_id"]
        events = await client.get(f"/v1/sessions/{session_id}/events?after=0&format=ndjson&until_idle=true")
    starts = [line for line in events.text.splitlines() if '"type":"turn_start"' in line]
    database = Database(server.settings.database_url)
    try:
        async with database.read() as db:
            seq = await chat_bindings.turn_start_seq(db, session_id, turn_id)
            assert seq is not None and f'"seq":{seq},' in starts[0]
            assert await chat_bindings.turn_start_seq(db, session_id, "t_000000000000") is None
    finally:
        await database.dispose()
