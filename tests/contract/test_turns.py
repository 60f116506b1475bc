"""The turn view over a real socket: chat_messages grouped by turn, paged, and 404s. The grouping rules on
rows (app.chat.views): tests/chat/test_views.py."""

from __future__ import annotations

import httpx
import pytest

from tests.support.server import LiveServer
from tests.support.sse import EventReader

pytestmark = pytest.mark.anyio


async def _session(client: httpx.AsyncClient) -> str:
    response = await client.post("/v1/sessions", json={})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def _turn(client: httpx.AsyncClient, sid: str, content: str) -> tuple[str, EventReader]:
    """Posts a message and waits for its turn to end; returns the turn id and what the stream showed."""
    async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
        posted = await client.post(f"/v1/sessions/{sid}/messages", json={"content": content})
        assert posted.status_code == 202, posted.text
        turn_id = str(posted.json()["turn_id"])
        await reader.wait_for(lambda e: e.event == "turn_done" and e.data["turn_id"] == turn_id)
    return turn_id, reader


def _texts(reader: EventReader) -> dict[str, str]:
    """Each assistant message's text, put together from its deltas."""
    texts: dict[str, str] = {}
    for delta in reader.of_type("text_delta"):
        texts[delta["id"]] = texts.get(delta["id"], "") + delta["text"]
    return texts


async def test_a_tool_round_groups_into_one_turn(contract_server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=contract_server.base_url, timeout=30) as client:
        sid = await _session(client)
        turn_id, reader = await _turn(client, sid, "what time is it?")
        page = await client.get(f"/v1/sessions/{sid}/turns")
        assert page.status_code == 200, page.text
        one = await client.get(f"/v1/sessions/{sid}/turns/{turn_id}")
        assert one.status_code == 200, one.text
        history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]

    assert page.json()["next_cursor"] is None
    assert page.json()["turns"] == [one.json()]
    turn = one.json()
    start, done = reader.of_type("turn_start")[0], reader.of_type("turn_done")[0]
    assert (turn["turn_id"], turn["status"]) == (turn_id, "completed")
    assert (turn["started_at"], turn["ended_at"]) == (start["timestamp"], done["timestamp"])
    assert turn["duration_seconds"] == done["duration_seconds"]
    assert turn["error"] is None

    user = reader.of_type("user_message")[0]
    assert turn["user_messages"] == [
        {
            "id": user["id"],
            "content": "what time is it?",
            "sender": "User",
            "client_message_id": None,
            "timestamp": user["timestamp"],
            "attachments": [],
        }
    ]
    assert [n["kind"] for n in turn["nodes"]] == ["llm", "tool", "llm"]
    # The nodes are the assistant's chat messages, in history order, with their final content.
    stored = [m for m in history if m.get("role") == "assistant"]
    assert [n["id"] for n in turn["nodes"]] == [m["id"] for m in stored]
    first, tool, answer = turn["nodes"]
    texts = _texts(reader)
    for node in (first, answer):
        assert node["content"] == texts[node["id"]] != ""
        assert node["model"] == "parley/demo" and isinstance(node["duration_ms"], int)
        assert node["interrupted"] is False
    end = reader.of_type("tool_exec_end")[0]
    assert tool["tool_name"] == "current_time" and tool["arguments"] == {"timezone": "UTC"}
    assert tool["id"] == end["id"] and tool["tool_call_id"] == end["tool_result"]["tool_call_id"]
    assert (tool["result"], tool["is_error"]) == (end["tool_result"]["content"], False)
    assert (tool["duration_ms"], tool["interrupted"]) == (end["duration_ms"], False)
    assert turn["final_answer"] == answer["content"]

    # The chunk rule (docs/protocol.md, Turns): many deltas were streamed, one final node per message was
    # stored.
    assert len(reader.of_type("text_delta")) > len(texts) == 2


async def test_a_stopped_turn_is_cancelled_with_its_cut_node(paced_server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=paced_server.base_url, timeout=30) as client:
        sid = await _session(client)
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            posted = (await client.post(f"/v1/sessions/{sid}/messages", json={"content": "[long] x"})).json()
            turn_id = posted["turn_id"]
            await reader.wait_type("text_delta", count=5)
            running = (await client.get(f"/v1/sessions/{sid}/turns/{turn_id}")).json()
            stopped = await client.post(f"/v1/sessions/{sid}/cancel")
            assert stopped.status_code == 202, stopped.text
            await reader.wait_type("turn_done")
        turn = (await client.get(f"/v1/sessions/{sid}/turns/{turn_id}")).json()

    assert (running["status"], running["ended_at"], running["duration_seconds"]) == ("running", None, None)
    assert turn["status"] == "cancelled"
    assert turn["ended_at"] == reader.of_type("turn_done")[0]["timestamp"]
    cancelled = reader.of_type("agent_cancelled")[0]
    [node] = turn["nodes"]
    assert node["kind"] == "llm" and node["interrupted"] is True
    assert [node["id"]] == cancelled["interrupted_message_ids"]
    assert node["content"] == _texts(reader)[node["id"]]
    assert turn["final_answer"] == node["content"]


async def test_turns_page_back_from_the_newest(contract_server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=contract_server.base_url, timeout=30) as client:
        sid = await _session(client)
        ids = [(await _turn(client, sid, f"hello {n}"))[0] for n in range(3)]
        newest = (await client.get(f"/v1/sessions/{sid}/turns", params={"limit": 2})).json()
        older = (
            await client.get(
                f"/v1/sessions/{sid}/turns", params={"limit": 2, "before": newest["next_cursor"]}
            )
        ).json()
        unknown = await client.get(f"/v1/sessions/{sid}/turns", params={"before": "t_000000000000"})

    assert [t["turn_id"] for t in newest["turns"]] == ids[1:]
    assert newest["next_cursor"] == ids[1]
    assert [t["turn_id"] for t in older["turns"]] == ids[:1]
    assert older["next_cursor"] is None
    assert [t["user_messages"][0]["content"] for t in newest["turns"]] == ["hello 1", "hello 2"]
    assert unknown.status_code == 422
    assert unknown.json()["error"]["code"] == "invalid_cursor"


async def test_unknown_sessions_and_turns_are_404(contract_server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=contract_server.base_url, timeout=30) as client:
        sid, other = await _session(client), await _session(client)
        turn_id, _ = await _turn(client, sid, "hi")
        answers = [
            await client.get("/v1/sessions/s_nope/turns"),
            await client.get(f"/v1/sessions/s_nope/turns/{turn_id}"),
            await client.get(f"/v1/sessions/{sid}/turns/t_nope"),
            await client.get(f"/v1/sessions/{other}/turns/{turn_id}"),
        ]
        empty = (await client.get(f"/v1/sessions/{other}/turns")).json()

    for answer in answers:
        assert answer.status_code == 404, answer.text
        assert answer.json()["error"]["code"] == "not_found"
    assert empty == {"turns": [], "next_cursor": None}
