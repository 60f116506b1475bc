"""client_message_id: stored and echoed everywhere the message appears, so the sending tab can match it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from app.settings import Settings
from tests.support.server import LiveServer, live_server
from tests.support.sse import EventReader

pytestmark = pytest.mark.anyio


@pytest.fixture
def paced(settings: Settings) -> Iterator[LiveServer]:
    """The demo model at 5 ms a token: a `[long]` answer takes about two seconds."""
    with live_server(settings.model_copy(update={"demo_token_delay": 0.005})) as running:
        yield running


async def test_echoed_on_the_answer_the_event_the_history_and_the_turn(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            posted = await client.post(
                f"/v1/sessions/{sid}/messages", json={"content": "hi", "client_message_id": "tab1-7"}
            )
            await reader.wait_type("turn_done")
        accepted = posted.json()
        assert posted.status_code == 202 and accepted["client_message_id"] == "tab1-7"
        [event] = reader.of_type("user_message")
        assert (event["id"], event["client_message_id"], event["queued"]) == (accepted["id"], "tab1-7", False)
        history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
        [user] = [m for m in history if m["type"] == "text" and m["role"] == "user"]
        assert (user["id"], user["client_message_id"]) == (accepted["id"], "tab1-7")
        turn = (await client.get(f"/v1/sessions/{sid}/turns/{accepted['turn_id']}")).json()
        assert turn["user_messages"][0]["client_message_id"] == "tab1-7"

        # Without one it is null everywhere.
        plain = await client.post(f"/v1/sessions/{sid}/messages", json={"content": "again"})
        assert plain.json()["client_message_id"] is None


async def test_a_waiting_message_carries_it_while_queued_and_when_taken(paced: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=paced.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            await client.post(f"/v1/sessions/{sid}/messages", json={"content": "[long] go"})
            await reader.wait_type("text_delta")
            waiting = await client.post(
                f"/v1/sessions/{sid}/messages",
                json={"content": "and then?", "delivery": "queue", "client_message_id": "opt-42"},
            )
            assert waiting.status_code == 202, waiting.text
            assert (waiting.json()["queued"], waiting.json()["client_message_id"]) == (True, "opt-42")
            queue = (await client.get(f"/v1/sessions/{sid}/queue")).json()["queue"]
            assert [(m["id"], m["client_message_id"]) for m in queue] == [(waiting.json()["id"], "opt-42")]
            await reader.wait_type("turn_done", count=2)

        announced = [e for e in reader.of_type("user_message") if e["id"] == waiting.json()["id"]]
        assert [(e["queued"], e["client_message_id"]) for e in announced] == [
            (True, "opt-42"),
            (False, "opt-42"),
        ]
        listed = [item for e in reader.of_type("queue_updated") for item in e["queue"]]
        assert {item["client_message_id"] for item in listed} == {"opt-42"}
        history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
        assert [m["client_message_id"] for m in history if m["type"] == "text" and m["role"] == "user"] == [
            None,
            "opt-42",
        ]


async def test_a_retry_with_the_same_idempotency_key_and_client_message_id_is_one_message(
    server: LiveServer,
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        body = {"content": "once", "client_message_id": "c-1"}
        headers = {"Idempotency-Key": "k-1"}
        first = await client.post(f"/v1/sessions/{sid}/messages", json=body, headers=headers)
        second = await client.post(f"/v1/sessions/{sid}/messages", json=body, headers=headers)
        assert second.json() == first.json() and second.headers["idempotent-replayed"] == "true"
        other = await client.post(
            f"/v1/sessions/{sid}/messages", json={**body, "client_message_id": "c-2"}, headers=headers
        )
        assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"
