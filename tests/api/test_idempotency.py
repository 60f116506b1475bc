"""Retries never duplicate: Idempotency-Key on session creation and on messages, racing and after a crash."""

from __future__ import annotations

import asyncio
import time
from contextlib import suppress
from typing import Any

import httpx
import pytest

from app.chat.idempotency import Idempotency, fingerprint
from app.settings import Settings
from app.storage.engine import Database
from app.storage.tables import IdempotencyKeyRow
from tests.support.server import LiveServer, live_server
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
        assert bad.status_code == 422
        assert bad.json()["error"]["details"][0]["field"] == "header.Idempotency-Key"


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


async def test_a_replay_after_the_session_was_deleted_is_410_and_creates_nothing(server: LiveServer) -> None:
    """The stored answer names a session that no longer exists: replaying it would hand out a deleted id,
    and creating another would not be what the first request did. Proof: 410 naming the deleted id, the
    session list stays empty, and a new key creates a session as usual."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        headers = {"Idempotency-Key": "create-then-delete"}
        created = await client.post("/v1/sessions", json={"title": "t"}, headers=headers)
        sid = created.json()["id"]
        assert (await client.delete(f"/v1/sessions/{sid}")).status_code == 204
        replay = await client.post("/v1/sessions", json={"title": "t"}, headers=headers)
        assert replay.status_code == 410, replay.text
        assert replay.json()["error"]["code"] == "session_deleted"
        assert replay.json()["error"]["details"] == {"session_id": sid}
        assert (await client.get("/v1/sessions")).json()["sessions"] == []
        fresh = await client.post("/v1/sessions", json={"title": "t"}, headers={"Idempotency-Key": "new"})
        assert fresh.status_code == 201
        assert fresh.json()["id"] != sid
        # A message replayed into the deleted session is a 404, as any request to it.
        gone = await client.post(
            f"/v1/sessions/{sid}/messages", json={"content": "hi"}, headers={"Idempotency-Key": "m"}
        )
        assert gone.status_code == 404


async def test_racers_share_the_first_answer_even_a_refusal(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three posts with one key and delivery=reject race a stop of the running turn, 20 groups over a real
    socket. Before, racers queued behind a lock and each redid the work after the first's 409, so one that
    ran after the stop got a 202: {409, 409, 202}. Now every racer of a group gets the first answer (three
    409s naming the turn, or three 202s with one message id), and the history holds the message once if
    the answer was a 202, never if it was a 409. A refusal frees the key: a retry after it is stored once.

    Racers are requests in flight together: the first attempt waits (up to 5 s) until all three reached
    the server. On a slow machine the third request otherwise came after the first's 409 had freed the
    key: a retry, rightly stored once the stop had landed, not a racer (CI saw {409, 202} so)."""
    arrived: dict[tuple[str, str], int] = {}
    all_came: dict[tuple[str, str], asyncio.Event] = {}
    join, reserve = Idempotency._join, Idempotency.reserve

    async def counted_join(self: Idempotency, slot: tuple[str, str], request_fingerprint: str) -> Any:
        arrived[slot] = arrived.get(slot, 0) + 1
        if arrived[slot] >= 3:
            all_came.setdefault(slot, asyncio.Event()).set()
        return await join(self, slot, request_fingerprint)

    async def reserve_once_all_came(self: Idempotency, principal: str, key: str, *args: Any) -> Any:
        if key.startswith("race-reject-"):
            with suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await all_came.setdefault((principal, key), asyncio.Event()).wait()
        return await reserve(self, principal, key, *args)

    monkeypatch.setattr(Idempotency, "_join", counted_join)
    monkeypatch.setattr(Idempotency, "reserve", reserve_once_all_came)
    slow = settings.model_copy(update={"demo_token_delay": 0.02, "messages_per_minute": 0})
    outcomes: set[int] = set()
    with live_server(slow) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            for group in range(20):
                sid = (await client.post("/v1/sessions", json={})).json()["id"]
                url = f"/v1/sessions/{sid}/messages"
                running = (await client.post(url, json={"content": "[long] a story"})).json()
                body = {"content": "racing", "delivery": "reject"}
                headers = {"Idempotency-Key": f"race-reject-{group}"}

                async def stop(sid: str = sid, delay: float = group % 5 * 0.002) -> None:
                    await asyncio.sleep(delay)
                    await client.post(f"/v1/sessions/{sid}/cancel")

                # Three connections open before the race, so that the racers' requests reach the server
                # together (two of them opening connections first came a millisecond or more after the
                # first attempt had ended: a retry after its refusal, not a racer).
                await asyncio.gather(*(client.get("/healthz") for _ in range(3)))
                racers = [asyncio.create_task(client.post(url, json=body, headers=headers)) for _ in range(3)]
                await stop()
                answers = await asyncio.gather(*racers)
                statuses = {a.status_code for a in answers}
                assert len(statuses) == 1, [a.text for a in answers]
                outcomes |= statuses
                stored = [running["id"]]
                if statuses == {409}:
                    assert {a.json()["error"]["details"]["turn_id"] for a in answers} == {running["turn_id"]}
                    retried = await client.post(url, json=body, headers=headers)
                    assert retried.status_code in (202, 409)  # the stop may still be finishing
                    if retried.status_code == 202:
                        stored.append(retried.json()["id"])
                else:
                    assert statuses == {202}
                    assert len({a.json()["id"] for a in answers}) == 1
                    stored.append(answers[0].json()["id"])
                assert await _user_texts(client, sid) == stored
    assert 409 in outcomes  # the race was run: at least one group met the running turn
