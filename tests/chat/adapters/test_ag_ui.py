"""The AG-UI adapter over a real socket, each event read back into the official package's models: a run's
events in order, the thread bound per principal, an attach with Parley's history as a snapshot, and what
a run may not bring (a clear 422 that stores nothing). tests/kits drives the same through HttpAgent."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from ag_ui.core import Event, EventType
from pydantic import TypeAdapter

from app.chat.adapters.ag_ui import ag_ui_messages
from app.protocol.ag_ui import RunInput
from tests.support.server import LiveServer

pytestmark = pytest.mark.anyio
EVENTS: TypeAdapter[Event] = TypeAdapter(Event)


def run(thread_id: str, *messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"threadId": thread_id, "runId": "run-1", "messages": list(messages), **extra}


def user(text: str) -> dict[str, Any]:
    return {"id": f"u-{len(text)}", "role": "user", "content": text}


async def events_of(client: httpx.AsyncClient, body: dict[str, Any]) -> list[Any]:
    async with client.stream("POST", "/v1/ag-ui", json=body) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line async for line in response.aiter_lines() if line]
    assert all(line.startswith("data: ") for line in lines), lines
    return [EVENTS.validate_python(json.loads(line.removeprefix("data: "))) for line in lines]


@pytest.mark.both_backends
async def test_a_run_with_text_and_a_server_tool(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        events = await events_of(client, run("thread-1", user("what time is it?")))
        types = [e.type for e in events]
        assert types[0] == EventType.RUN_STARTED and types[-1] == EventType.RUN_FINISHED
        assert types.count(EventType.STEP_STARTED) == types.count(EventType.STEP_FINISHED) == 2
        assert types.count(EventType.TEXT_MESSAGE_START) == types.count(EventType.TEXT_MESSAGE_END) == 2
        start = next(e for e in events if e.type == EventType.TOOL_CALL_START)
        assert start.tool_call_name == "current_time"
        assert (
            start.parent_message_id
            == next(e for e in events if e.type == EventType.TEXT_MESSAGE_START).message_id
        )
        result = next(e for e in events if e.type == EventType.TOOL_CALL_RESULT)
        assert result.tool_call_id == start.tool_call_id and '"timezone": "UTC"' in result.content
        session = next(e for e in events if e.type == EventType.CUSTOM and e.name == "parley.session").value
        text = "".join(e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT)

        history = (await client.get(f"/v1/sessions/{session['sessionId']}/messages")).json()["chat_messages"]
        assert (
            "".join(m["content"] for m in history if m["type"] == "text" and m["role"] == "assistant") == text
        )

        # A run with nothing new attaches: the history as a snapshot, nothing else to follow.
        attach = await events_of(client, run("thread-1"))
        assert [e.type for e in attach] == [
            EventType.RUN_STARTED,
            EventType.MESSAGES_SNAPSHOT,
            EventType.RUN_FINISHED,
        ]
        roles = [m.role for m in attach[1].messages]
        assert roles == ["user", "assistant", "tool", "assistant"]


async def test_the_snapshot_is_the_history(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        await events_of(client, run("thread-2", user('[call:calculate {"expression": "2+2"}]')))
        attach = await events_of(client, run("thread-2"))
        session = (await client.get("/v1/sessions")).json()["sessions"][0]["id"]
        rows = (await client.get(f"/v1/sessions/{session}/messages")).json()["chat_messages"]
    from app.protocol.schemas import MessagePage

    page = MessagePage.model_validate({"chat_messages": rows, "next_cursor": None, "last_event_id": 0})
    assert attach[1].messages == ag_ui_messages(page.chat_messages)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"tools": [{"name": "has space", "description": "x"}]}, "pattern"),
        ({"tools": [{"name": "t", "description": "x", "parameters": {"type": "string"}}]}, "object"),
        ({"tools": [{"name": "t", "description": "x"}, {"name": "t", "description": "y"}]}, "unique"),
        ({"threadId": 5}, "string"),
        ({"messages": [{"id": "u", "role": "robot", "content": "x"}]}, "role"),
    ],
)
async def test_what_a_run_may_not_bring_is_a_clear_422_that_stores_nothing(
    server: LiveServer, change: dict[str, Any], says: str
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        refused = await client.post("/v1/ag-ui", json={**run("bad", user("hello")), **change})
        assert refused.status_code == 422, refused.text
        assert says in json.dumps(refused.json()["error"]["details"])
        assert (await client.get("/v1/sessions")).json()["sessions"] == []


def test_the_input_model_is_the_packages() -> None:
    from ag_ui.core import RunAgentInput

    assert issubclass(RunInput, RunAgentInput)
