"""Retries never duplicate: Idempotency-Key on session creation and on messages, racing and after a crash."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from app.chat.idempotency import fingerprint
from app.settings import Settings
from app.storage.engine import Database
from app.storage.tables import IdempotencyKeyRow
from tests.support.server import LiveServer
from tests.support.sse import EventReader

pytestmark = pytest.mark.anyio


async def _user_texts(client: httpx.AsyncClient, sid: str) -> list[str]:
    history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
    return [m["id"] for m in history if m["type"] == "text" and m["role"] == "user"]


async def test_a_retried_message_is_stored_and_answered_once(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        headers = {"Idempotency-Key": "retry-1"}
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            first = await client.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"}, headers=headers)
            await reader.wait_type("turn_done")
            second = await client.post(
                f"/v1/sessions/{sid}/messages", json={"content": "hi"}, headers=headers
            )
            await asyncio.sleep(0.2)
        assert first.status_code == second.status_code == 202
        assert second.json() == first.json()
        assert second.headers["idempotent-replayed"] == "true"
        assert "idempotent-replayed" not in first.headers
        assert await _user_texts(client, sid) == [first.json()["id"]]
        assert len(reader.of_type("turn_start")) == 1


async def test_racing_duplicates_get_the_first_answer(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        posts = [
            client.post(
                f"/v1/sessions/{sid}/messages", json={"content": "once"}, headers={"Idempotency-Key": "race"}
            )
            for _ in range(6)
        ]
        answers = await asyncio.gather(*posts)
        assert {a.status_code for a in answers} == {202}
        assert len({a.json()["id"] for a in answers}) == 1
        assert await _user_texts(client, sid) == [answers[0].json()["id"]]


async def test_same_key_with_another_body_is_refused_and_stores_nothing(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        headers = {"Idempotency-Key": "k"}
        ok = await client.post(f"/v1/sessions/{sid}/messages", json={"content": "a"}, headers=headers)
        other = await client.post(f"/v1/sessions/{sid}/messages", json={"content": "b"}, headers=headers)
        assert other.status_code == 422
        assert other.json()["error"]["code"] == "idempotency_key_reused"
        assert await _user_texts(client, sid) == [ok.json()["id"]]
        bad = await client.post(
            f"/v1/sessions/{sid}/messages", json={"content": "c"}, headers={"Idempotency-Key": "x" * 300}
        )
        assert bad.status_code == 400
        assert bad.json()["error"]["code"] == "invalid_idempotency_key"


async def test_session_creation_is_idempotent(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        headers = {"Idempotency-Key": "create-1"}
        answers = await asyncio.gather(
            *(client.post("/v1/sessions", json={"title": "t"}, headers=headers) for _ in range(4))
        )
        assert {a.status_code for a in answers} == {201}
        assert len({a.json()["id"] for a in answers}) == 1
        listed = (await client.get("/v1/sessions")).json()["sessions"]
        assert [s["id"] for s in listed] == [answers[0].json()["id"]]


async def test_a_retry_after_a_crash_between_store_and_answer_finds_the_stored_message(
    server: LiveServer, settings: Settings
) -> None:
    """The first attempt reserved an id and stored the message, then died before answering."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        done = await client.post(f"/v1/sessions/{sid}/messages", json={"content": "first"})
        stored_id = done.json()["id"]
        body = {"content": "first", "sender": "User", "delivery": "steer"}
        database = Database(settings.database_url)
        async with database.session() as db:
            db.add(
                IdempotencyKeyRow(
                    principal="",
                    key="crashed",
                    fingerprint=fingerprint("POST", f"/v1/sessions/{sid}/messages", body),
                    resource_id=stored_id,
                    created_at=time.time(),
                )
            )
            await db.commit()
        await database.dispose()
        retried = await client.post(
            f"/v1/sessions/{sid}/messages", json={"content": "first"}, headers={"Idempotency-Key": "crashed"}
        )
        assert retried.status_code == 202
        assert retried.json()["id"] == stored_id
        assert retried.json()["turn_id"] == done.json()["turn_id"]
        assert await _user_texts(client, sid) == [stored_id]


async def test_message_limits(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        too_long = await client.post(f"/v1/sessions/{sid}/messages", json={"content": "x" * 100_001})
        assert too_long.status_code == 413
        assert too_long.json()["error"]["details"]["limit"] == 100_000
        blank = await client.post(f"/v1/sessions/{sid}/messages", json={"content": "   \n"})
        assert blank.status_code == 422
        assert await _user_texts(client, sid) == []
