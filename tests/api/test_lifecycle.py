"""Waiting messages, stop, restart: the session's life over a real socket with the paced demo model."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from app.settings import Settings
from tests.support.server import LiveServer, live_server
from tests.support.sse import EventReader

pytestmark = pytest.mark.anyio


@pytest.fixture
def paced(settings: Settings) -> Iterator[LiveServer]:
    """The demo model at 5 ms a token: a `[long]` answer takes about two seconds."""
    with live_server(settings.model_copy(update={"demo_token_delay": 0.005})) as running:
        yield running


async def _session(client: httpx.AsyncClient) -> str:
    response = await client.post("/v1/sessions", json={})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def test_message_posted_while_busy_waits_for_the_next_turn(paced: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=paced.base_url, timeout=30) as client:
        sid = await _session(client)
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            first = (
                await client.post(f"/v1/sessions/{sid}/messages", json={"content": "[long] tell me"})
            ).json()
            await reader.wait_type("text_delta")
            busy = (await client.get(f"/v1/sessions/{sid}")).json()
            assert busy["agent_status"] == "thinking"
            assert busy["running_turn_id"] == first["turn_id"]
            second = await client.post(
                f"/v1/sessions/{sid}/messages", json={"content": "and then?", "sender": "Ann"}
            )
            assert second.status_code == 202
            waiting = second.json()
            assert waiting["queued"] is True
            assert waiting["turn_id"] is None
            await reader.wait_type("turn_done", count=2)

        announced = [u for u in reader.of_type("user_message") if u["id"] == waiting["id"]]
        assert [(u["queued"], u["turn_id"] is None) for u in announced] == [(True, True), (False, False)]
        dones = reader.of_type("turn_done")
        assert [d["status"] for d in dones] == ["completed", "completed"]
        starts = reader.of_type("turn_start")
        assert starts[1]["turn_id"] == announced[1]["turn_id"] != first["turn_id"]

        history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
        users = [m for m in history if m["type"] == "text" and m["role"] == "user"]
        assert [(u["id"], u["sender"]) for u in users] == [(first["id"], "User"), (waiting["id"], "Ann")]
        turn_markers = [m["type"] for m in history if m["type"] in ("turn_start", "turn_done")]
        assert turn_markers == ["turn_start", "turn_done", "turn_start", "turn_done"]


async def test_cancel_keeps_partial_text_and_the_session_stays_usable(paced: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=paced.base_url, timeout=30) as client:
        sid = await _session(client)
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            posted = (await client.post(f"/v1/sessions/{sid}/messages", json={"content": "[long] go"})).json()
            await reader.wait_type("text_delta", count=5)
            stopped = await client.post(f"/v1/sessions/{sid}/cancel")
            assert stopped.status_code == 202
            result = stopped.json()
            assert (result["cancelled"], result["turn_id"], result["withdrawn"]) == (
                True,
                posted["turn_id"],
                [],
            )
            await reader.wait_type("turn_done")
            again = await client.post(f"/v1/sessions/{sid}/cancel")
            assert again.status_code == 200
            assert again.json()["cancelled"] is False

            types = [e.event for e in reader.events]
            tail = types[types.index("agent_cancelled") - 1 :]
            assert tail == ["agent_status", "agent_cancelled", "turn_done"]
            cancelled = reader.of_type("agent_cancelled")[0]
            deltas = reader.of_type("text_delta")
            text_id = deltas[0]["id"]
            assert cancelled["interrupted_message_ids"] == [text_id] == result["interrupted_message_ids"]
            assert cancelled["interrupted_tool_call_ids"] == [] == result["interrupted_tool_call_ids"]
            assert reader.of_type("turn_done")[0]["status"] == "cancelled"

            history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
            partial = next(m for m in history if m["id"] == text_id)
            assert partial["interrupted"] is True
            assert partial["content"] == "".join(d["text"] for d in deltas)
            assert history[-1]["type"] == "turn_done"
            assert history[-1]["status"] == "cancelled"

            reader.events.clear()
            await client.post(f"/v1/sessions/{sid}/messages", json={"content": "hello again"})
            await reader.wait_type("turn_done")
            assert reader.of_type("turn_done")[0]["status"] == "completed"
            assert (await client.get(f"/v1/sessions/{sid}")).json()["agent_status"] == "idle"


async def test_history_and_sequence_survive_a_restart(settings: Settings) -> None:
    with live_server(settings) as first:
        async with httpx.AsyncClient(base_url=first.base_url, timeout=30) as client:
            sid = await _session(client)
            async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
                await client.post(
                    f"/v1/sessions/{sid}/messages", json={"content": "what time is it? and 2+3*4"}
                )
                await reader.wait_type("turn_done")
            before = (await client.get(f"/v1/sessions/{sid}/messages")).content
            last_seq = int(reader.events[-1].id)
    with live_server(settings) as second:
        async with httpx.AsyncClient(base_url=second.base_url, timeout=30) as client:
            after = (await client.get(f"/v1/sessions/{sid}/messages")).content
            assert after == before
            async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
                await client.post(f"/v1/sessions/{sid}/messages", json={"content": "thanks"})
                await reader.wait_type("turn_done")
            assert int(reader.events[0].id) == last_seq + 1


async def test_streamed_text_is_flushed_within_a_second_but_never_per_delta(paced: LiveServer) -> None:
    statements: list[str] = []

    def count(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if "chat_messages" in statement and statement.lstrip().upper().startswith(("UPDATE", "INSERT")):
            statements.append(statement)

    event.listen(Engine, "before_cursor_execute", count)
    try:
        async with httpx.AsyncClient(base_url=paced.base_url, timeout=30) as client:
            sid = await _session(client)
            async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
                await client.post(f"/v1/sessions/{sid}/messages", json={"content": "[long] please"})
                first = (await reader.wait_type("text_delta"))[0]
                await asyncio.sleep(1.4)
                mid = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
                streamed_by_then = len(reader.of_type("text_delta"))
                await reader.wait_type("turn_done")
    finally:
        event.remove(Engine, "before_cursor_execute", count)

    deltas = reader.of_type("text_delta")
    final = "".join(d["text"] for d in deltas)
    partial = next(m for m in mid if m["id"] == first.data["id"])
    # A crash at this moment would have kept what was flushed: more than the first delta, less than all.
    assert len(first.data["text"]) < len(partial["content"]) < len(final)
    assert final.startswith(partial["content"])
    assert streamed_by_then < len(deltas)
    # ~400 deltas; rows are written at turn start, first delta, each flush (≤ 1/s) and the response end.
    assert len(deltas) > 300
    assert len(statements) <= 10, statements


async def test_history_pages_forward_and_backward(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = await _session(client)
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            for n in range(3):
                await client.post(f"/v1/sessions/{sid}/messages", json={"content": f"message {n}"})
                await reader.wait_type("turn_done", count=n + 1)
        everything = (await client.get(f"/v1/sessions/{sid}/messages")).json()
        assert everything["next_cursor"] is None
        ids = [m["id"] for m in everything["chat_messages"]]
        assert len(ids) == 12

        forward: list[str] = []
        params: dict[str, str | int] = {"limit": 5}
        while True:
            page = (await client.get(f"/v1/sessions/{sid}/messages", params=params)).json()
            forward += [m["id"] for m in page["chat_messages"]]
            if page["next_cursor"] is None:
                break
            params = {"limit": 5, "after": page["next_cursor"]}
        assert forward == ids

        last = (
            await client.get(f"/v1/sessions/{sid}/messages", params={"limit": 5, "before": ids[-1]})
        ).json()
        assert [m["id"] for m in last["chat_messages"]] == ids[-6:-1]
        assert last["next_cursor"] == ids[-6]
        unknown = await client.get(f"/v1/sessions/{sid}/messages", params={"after": "m_000000000000"})
        assert unknown.status_code == 422
        assert unknown.json()["error"]["code"] == "invalid_cursor"
