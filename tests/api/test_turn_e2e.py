"""A whole turn over a real socket: create, subscribe, post, and check every event and the history."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.support.server import LiveServer
from tests.support.sse import EventReader

pytestmark = pytest.mark.anyio

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00$")
MESSAGE_ID = re.compile(r"^m_[0-9a-f]{12}$")
TURN_ID = re.compile(r"^t_[0-9a-f]+$")


@pytest.mark.both_backends
async def test_time_question_runs_a_tool_round(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        created = await client.post("/v1/sessions", json={"title": "demo"})
        assert created.status_code == 201, created.text
        session = created.json()
        sid = session["id"]
        assert session["model"] == "parley/demo"
        assert session["agent_status"] == "idle"

        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            posted = await client.post(f"/v1/sessions/{sid}/messages", json={"content": "what time is it?"})
            assert posted.status_code == 202, posted.text
            accepted = posted.json()
            assert MESSAGE_ID.match(accepted["id"])
            assert TURN_ID.match(accepted["turn_id"])
            await reader.wait_type("turn_done")

        types = [e.event for e in reader.events]
        seqs = [int(e.id) for e in reader.events]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        for e in reader.events:
            assert e.data["type"] == e.event
            assert e.data["seq"] == int(e.id)
            assert e.data["session_id"] == sid

        assert types[:3] == ["turn_start", "user_message", "agent_status"]
        assert types[-2:] == ["agent_status", "turn_done"]
        turn_start = reader.of_type("turn_start")[0]
        assert turn_start["turn_id"] == accepted["turn_id"] and ISO.match(turn_start["timestamp"])
        user = reader.of_type("user_message")[0]
        assert user["id"] == accepted["id"] and user["model"] == "parley/demo" and user["sender"] == "User"

        deltas = reader.of_type("text_delta")
        assert deltas and ISO.match(deltas[0]["timestamp"]) and deltas[0]["model"] == "parley/demo"
        assert all("timestamp" not in d for d in deltas[1:] if d["id"] == deltas[0]["id"])

        start = reader.of_type("tool_exec_start")[0]
        end = reader.of_type("tool_exec_end")[0]
        assert start["tool_call"]["name"] == "current_time"
        assert start["tool_call"]["arguments"] == {"timezone": "UTC"}
        assert end["id"] == start["id"] and end["tool_result"]["tool_call_id"] == start["tool_call"]["id"]
        assert end["tool_result"]["is_error"] is False and isinstance(end["duration_ms"], int)
        statuses = [(s["status"], s.get("tool_name")) for s in reader.of_type("agent_status")]
        assert statuses == [
            ("thinking", None),
            ("tool_calling", "current_time"),
            ("thinking", None),
            ("idle", None),
        ]

        responses = reader.of_type("response_done")
        assert [r["response"]["finish_reason"] for r in responses] == ["tool_calls", "stop"]
        usage = reader.of_type("token_usage")
        assert len(usage) == 2
        assert usage[-1]["context_window"] == 32768
        assert usage[-1]["context_percent"] == round(usage[-1]["context_used"] * 100 / 32768, 1)
        assert usage[-1]["session_total_tokens"] > usage[0]["session_total_tokens"] > 0
        done = reader.of_type("turn_done")[0]
        assert done["status"] == "completed" and done["turn_id"] == accepted["turn_id"]

        history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
        kinds = [(m["type"], m.get("role")) for m in history]
        assert kinds == [
            ("turn_start", None),
            ("text", "user"),
            ("text", "assistant"),
            ("tool_group", "assistant"),
            ("text", "assistant"),
            ("turn_done", None),
        ]
        answer = history[4]
        streamed = "".join(d["text"] for d in deltas if d["id"] == answer["id"])
        assert answer["content"] == streamed and answer["model"] == "parley/demo"
        assert isinstance(answer["duration_ms"], int)
        tool = history[3]
        assert tool["id"] == start["id"] and tool["result"] == end["tool_result"]["content"]
        assert tool["duration_ms"] == end["duration_ms"]
        assert history[5]["id"] == done["id"] and history[0]["id"] == turn_start["id"]

        again = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
        assert again == history
        final = (await client.get(f"/v1/sessions/{sid}")).json()
        assert final["agent_status"] == "idle" and final["total_tokens"] == usage[-1]["session_total_tokens"]


@pytest.mark.both_backends
async def test_the_demos_think_streams_reasoning_before_its_text_and_stores_it(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            posted = await client.post(f"/v1/sessions/{sid}/messages", json={"content": "Hi [think]"})
            assert posted.status_code == 202, posted.text
            await reader.wait_type("turn_done")
        types = [e.event for e in reader.events if e.event in ("reasoning_delta", "text_delta")]
        assert types[0] == "reasoning_delta" and "text_delta" in types
        assert types.index("text_delta") == types.count("reasoning_delta")  # all reasoning first
        deltas = reader.of_type("reasoning_delta")
        assert ISO.match(deltas[0]["timestamp"]) and deltas[0]["model"] == "parley/demo"
        assert all("timestamp" not in d and "model" not in d for d in deltas[1:])
        assert {d["id"] for d in deltas} == {deltas[0]["id"]}
        reasoning = "".join(d["text"] for d in deltas)
        assert "answer directly" in reasoning

        rows = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
        assert [r["type"] for r in rows] == ["turn_start", "text", "reasoning", "text", "turn_done"]
        row = rows[2]
        assert row["id"] == deltas[0]["id"] and row["content"] == reasoning
        assert row["model"] == "parley/demo" and row["duration_ms"] is not None and not row["interrupted"]
        assert "arguments" not in row  # nothing for the provider: the demo signs nothing
        turn = (await client.get(f"/v1/sessions/{sid}/turns")).json()["turns"][-1]
        assert [n["kind"] for n in turn["nodes"]] == ["reasoning", "llm"]
        assert turn["nodes"][0]["content"] == reasoning
        assert turn["final_answer"].startswith("You said: Hi [think].")
