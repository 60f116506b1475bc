"""The AG-UI adapter over a real socket, each event read back into the official package's models: a run's
events in order, the thread bound per principal, an attach with Parley's history as a snapshot, and what
a run may not bring (a clear 422 that stores nothing). tests/kits drives the same through HttpAgent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ag_ui.core import Event, EventType
from pydantic import TypeAdapter

from app.chat.adapters.ag_ui import AgUiRun, ag_ui_messages
from app.protocol.ag_ui import CONTEXT_HEADING, RunInput
from app.settings import Settings
from app.streaming.frames import Frame
from tests.fakes.upstream import FakeUpstream, Script
from tests.interrupt.conftest import MODEL, write_models_file
from tests.interrupt.session import assert_strictly_valid, chat_requests
from tests.support.server import LiveServer, live_server

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
        ({"context": [{"description": "no value"}]}, "value"),
        ({"context": [{"description": "d", "value": {"not": "text"}}]}, "string"),
        ({"context": [{"description": "d", "value": "v"}] * 101}, "at most 100"),
        ({"forwardedProps": "text"}, "forwardedProps"),
        ({"forwardedProps": {"parley": "gpt"}}, "parley"),
        ({"forwardedProps": {"parley": {"model": 3}}}, "string"),
        ({"forwardedProps": {"parley": {"delivery": "later"}}}, "steer"),
        ({"forwardedProps": {"parley": {"temperature": 0}}}, "temperature"),
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


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(strict=True) as running:
        yield running


@pytest.fixture
def strict_server(settings: Settings, upstream: FakeUpstream, tmp_path: Path) -> Iterator[LiveServer]:
    models = write_models_file(tmp_path, upstream.base_url)
    with live_server(settings.model_copy(update={"models_file": models, "default_model": MODEL})) as running:
        yield running


async def test_the_context_reaches_the_model_for_that_turn_only(
    strict_server: LiveServer, upstream: FakeUpstream
) -> None:
    """CopilotKit's readables join the system prompt of the turn the run starts: the model reads them,
    a strict provider takes the prompt, the next turn's prompt is without them, and the history never
    holds them."""
    context = [
        {"description": "The user's todo list", "value": '[{"title": "call Ana", "done": false}]'},
        {"description": "Current page", "value": "settings\nsection: billing"},
    ]
    async with httpx.AsyncClient(base_url=strict_server.base_url, timeout=30) as client:
        created = await client.post("/v1/sessions", json={"system_prompt": "You help with todos."})
        thread = created.json()["id"]
        upstream.enqueue(Script.text("You have one todo."))
        first = await events_of(client, run(thread, user("what is left?"), context=context))
        assert first[-1].type == EventType.RUN_FINISHED
        upstream.enqueue(Script.text("Nothing else."))
        await events_of(client, run(thread, user("what is left?"), user("and now?")))

        history = (await client.get(f"/v1/sessions/{thread}/messages")).json()["chat_messages"]
    prompts = [r.body["messages"] for r in chat_requests(upstream)]
    assert len(prompts) == 2
    system = prompts[0][0]
    assert system["role"] == "system"
    assert system["content"] == (
        "You help with todos.\n\n"
        f"{CONTEXT_HEADING}\n"
        '- The user\'s todo list: [{"title": "call Ana", "done": false}]\n'
        "- Current page: settings\n  section: billing"
    )
    assert [m["role"] for m in prompts[0][1:]] == ["user"]
    assert prompts[0][1]["content"] == "what is left?"
    # The next turn's prompt: the system prompt alone, the first turn as it was stored.
    assert prompts[1][0] == {"role": "system", "content": "You help with todos."}
    assert "call Ana" not in json.dumps(prompts[1])
    assert "call Ana" not in json.dumps(history) and CONTEXT_HEADING not in json.dumps(history)
    assert_strictly_valid(upstream)


async def test_forwarded_props_choose_the_sessions_model(
    strict_server: LiveServer, upstream: FakeUpstream
) -> None:
    props = {"parley": {"model": "parley/demo"}}
    async with httpx.AsyncClient(base_url=strict_server.base_url, timeout=30) as client:
        events = await events_of(client, run("picked", user("what time is it?"), forwardedProps=props))
        session = next(e for e in events if e.type == EventType.CUSTOM and e.name == "parley.session")
        got = (await client.get(f"/v1/sessions/{session.value['sessionId']}")).json()
    assert got["model"] == "parley/demo"
    assert chat_requests(upstream) == []  # the demo model answered


async def test_bad_extras_store_nothing(server: LiveServer) -> None:
    """A context past the message limit (413) and a model no one serves (422): refused before the thread
    is bound, so there is no session."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        huge = [{"description": "page", "value": "x" * 40_000}] * 3
        refused = await client.post("/v1/ag-ui", json=run("big", user("hello"), context=huge))
        assert refused.status_code == 413, refused.text
        assert refused.json()["error"]["details"]["field"] == "context"
        props = {"parley": {"model": "nobody/serves-this"}}
        refused = await client.post("/v1/ag-ui", json=run("model", user("hello"), forwardedProps=props))
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["code"] == "unknown_model"
        assert (await client.get("/v1/sessions")).json()["sessions"] == []


async def test_state_is_echoed_and_the_frameworks_props_are_left_alone(server: LiveServer) -> None:
    state = {"todos": [{"title": "call Ana", "done": False}]}
    props = {"copilotkit": {"anything": True}, "parley": {"delivery": "queue"}}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        events = await events_of(client, run("shared", user("hello"), state=state, forwardedProps=props))
        assert [e.type for e in events[:2]] == [EventType.RUN_STARTED, EventType.STATE_SNAPSHOT]
        assert events[1].snapshot == state
        assert events[-1].type == EventType.RUN_FINISHED
        # An attach echoes it too; an empty state has nothing to keep.
        attach = await events_of(client, run("shared", state=state))
        assert attach[1].type == EventType.STATE_SNAPSHOT
        plain = await events_of(client, run("shared", state={}))
        assert EventType.STATE_SNAPSHOT not in [e.type for e in plain]


def test_the_input_model_is_the_packages() -> None:
    from ag_ui.core import RunAgentInput

    assert issubclass(RunInput, RunAgentInput)


@pytest.mark.parametrize(("legacy", "outcome"), [(False, {"type": "cancelled"}), (True, None)])
def test_a_stop_for_a_client_before_1_0_is_a_plain_finish(legacy: bool, outcome: Any) -> None:
    """@ag-ui/client 0.0.x (CopilotKit 1.7x's) sends no protocolVersion and knows only `success` and
    `interrupt` outcomes: its stopped run just finishes."""
    agui = AgUiRun("thread", "run", "s_1", turn_id="t_1", continued=True, legacy=legacy)
    agui.begin(None)
    done = {"turn_id": "t_1", "status": "cancelled"}
    (finished,) = agui.feed(Frame(seq=9, type="turn_done", data=json.dumps(done)))
    assert finished.model_dump(by_alias=True, exclude_none=True).get("outcome") == outcome


async def test_delivery_queue_keeps_the_context_for_the_next_turn_and_reject_stores_nothing(
    strict_server: LiveServer, upstream: FakeUpstream
) -> None:
    """While a turn runs: `forwardedProps.parley.delivery` `reject` is a 409 that stores nothing; `queue`
    waits for the turn's end, and the turn it starts has the run's context in its prompt."""
    upstream.enqueue(Script.text("one two three four five six seven eight", chunks=8, delay=0.15))
    upstream.enqueue(Script.text("Queued answer."))
    context = [{"description": "Selected todo", "value": "call Ana"}]
    async with httpx.AsyncClient(base_url=strict_server.base_url, timeout=30) as client:
        body = run("busy", user("first"))
        async with client.stream("POST", "/v1/ag-ui", json=body) as first:
            lines = first.aiter_lines()
            async for line in lines:
                if "TEXT_MESSAGE_CONTENT" in line:
                    break  # the first turn is running
            rejected = await client.post(
                "/v1/ag-ui",
                json=run("busy", user("not now"), forwardedProps={"parley": {"delivery": "reject"}}),
            )
            assert rejected.status_code == 409, rejected.text
            queued = run(
                "busy", user("then this"), context=context, forwardedProps={"parley": {"delivery": "queue"}}
            )
            second = await events_of(client, queued)
            rest = [line async for line in lines if line]
        assert "RUN_FINISHED" in rest[-1]
        assert second[-1].type == EventType.RUN_FINISHED
        assert (
            "".join(e.delta for e in second if e.type == EventType.TEXT_MESSAGE_CONTENT) == "Queued answer."
        )
        session = next(e for e in second if e.type == EventType.CUSTOM and e.name == "parley.session")
        rows = (await client.get(f"/v1/sessions/{session.value['sessionId']}/messages")).json()
    users = [m["content"] for m in rows["chat_messages"] if m["type"] == "text" and m["role"] == "user"]
    assert users == ["first", "then this"]
    first_prompt, second_prompt = (r.body["messages"] for r in chat_requests(upstream))
    assert first_prompt[0]["role"] == "user"  # no system prompt, no context: no system message
    assert second_prompt[0] == {"role": "system", "content": f"{CONTEXT_HEADING}\n- Selected todo: call Ana"}
    assert_strictly_valid(upstream)
