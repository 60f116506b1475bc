"""Client tools over real HTTP and SSE: the model calls a tool the browser runs, the turn waits, the
client posts its result, the turn resumes with it. Also: a repeated result (a replay, stored once), a
different one (409), one for a call that never waited (409), a session that is not there (404), and the
expiry (the model reads a timeout error, a late result gets 410)."""

from __future__ import annotations

import asyncio

import pytest

from tests.fakes.upstream import FakeUpstream, Script
from tests.interrupt.session import chat_requests, open_session
from tests.support.server import LiveServer
from tests.tool_requests.helpers import (
    LOCATION,
    answer,
    awaiting,
    calls,
    next_turn_is_valid,
    pending,
    tool_messages,
    tool_rows,
)

pytestmark = pytest.mark.anyio


async def test_a_client_tool_call_suspends_the_turn_and_its_result_resumes_it(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(calls(("call_loc", "get_location", '{"precise": true}'), text="Let me look."))
    upstream.enqueue(Script.text("You are in Paris."))
    async with open_session(server, client_tools=[LOCATION]) as session:
        posted = await session.accepted("where am I?")
        [requested] = await awaiting(session, "client_tool_requested")
        assert (requested["tool_call_id"], requested["name"]) == ("call_loc", "get_location")
        assert requested["arguments"] == {"precise": True}
        assert requested["turn_id"] == posted["turn_id"] and requested["expires_at"]
        # Suspended: the model was asked once, the session says so, the request is listed for a reload.
        await asyncio.sleep(0.2)
        assert len(upstream.requests) == 1
        info = await session.info()
        assert (info["agent_status"], info["running_turn_id"]) == ("awaiting_input", posted["turn_id"])
        [waiting] = await pending(session)
        assert (waiting["kind"], waiting["tool_call_id"], waiting["id"]) == (
            "client_tool",
            "call_loc",
            requested["id"],
        )

        status, body = await answer(
            session, "tool_results", results=[{"tool_call_id": "call_loc", "output": {"city": "Paris"}}]
        )
        assert status == 200, body
        assert body["resolved"] == [{"tool_call_id": "call_loc", "resolution": "answered", "replayed": False}]
        done = await session.turn_done(posted["turn_id"])
        assert done["status"] == "completed"
        assert await pending(session) == []

        # The model read the client's result as the call's tool message.
        assert tool_messages(upstream, 2) == [
            {"role": "tool", "tool_call_id": "call_loc", "content": '{"city": "Paris"}'}
        ]
        types = [e.event for e in session.turn_events(posted["turn_id"])]
        start = types.index("tool_exec_start")
        assert types[start : start + 3] == ["tool_exec_start", "client_tool_requested", "agent_status"]
        assert types.index("client_tool_resolved") < types.index("tool_exec_end")
        [resolved] = session.events("client_tool_resolved")
        assert (resolved["resolution"], resolved["is_error"]) == ("answered", False)

        # The same result again is a replay: 200, nothing stored or sent twice.
        status, body = await answer(
            session, "tool_results", results=[{"tool_call_id": "call_loc", "output": {"city": "Paris"}}]
        )
        assert (status, body["resolved"][0]["replayed"]) == (200, True)
        # Another result for it: 409; a call that never waited: 409.
        status, body = await answer(
            session, "tool_results", results=[{"tool_call_id": "call_loc", "output": "Lyon"}]
        )
        assert (status, body["error"]["code"]) == (409, "answer_conflict")
        status, body = await answer(
            session, "tool_results", results=[{"tool_call_id": "call_nope", "output": "x"}]
        )
        assert (status, body["error"]["code"]) == (409, "no_pending_call")
        await next_turn_is_valid(session, upstream)
        history = await session.history()
    [row] = tool_rows(history)
    assert (row["executed_by"], row["result"], row["is_error"]) == ("client", '{"city": "Paris"}', False)
    assert len(session.events("client_tool_resolved")) == 1
    assert len(session.events("tool_exec_end")) == 1


async def test_an_error_result_reaches_the_model_as_an_error(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(calls(("call_loc", "get_location", "{}")), Script.text("I could not find you."))
    async with open_session(server, client_tools=[LOCATION]) as session:
        posted = await session.accepted("where am I?")
        await awaiting(session, "client_tool_requested")
        status, _ = await answer(
            session, "tool_results", results=[{"tool_call_id": "call_loc", "error": "permission denied"}]
        )
        assert status == 200
        await session.turn_done(posted["turn_id"])
        assert tool_messages(upstream, 2)[0]["content"] == "permission denied"
        [end] = session.events("tool_exec_end")
        assert end["tool_result"]["is_error"] is True
        await next_turn_is_valid(session, upstream)


async def test_bad_answers_store_nothing(server: LiveServer, upstream: FakeUpstream) -> None:
    """Both output and error, neither, an unknown session: refused before anything is stored; the call
    still waits and a good answer afterwards resumes the turn."""
    upstream.enqueue(calls(("call_loc", "get_location", "{}")), Script.text("Found you."))
    async with open_session(server, client_tools=[LOCATION]) as session:
        posted = await session.accepted("where am I?")
        await awaiting(session, "client_tool_requested")
        both = {"tool_call_id": "call_loc", "output": "a", "error": "b"}
        assert (await answer(session, "tool_results", results=[both]))[0] == 422
        assert (await answer(session, "tool_results", results=[{"tool_call_id": "call_loc"}]))[0] == 422
        gone = await session.client.post(
            "/v1/sessions/s_missing/tool_results",
            json={"results": [{"tool_call_id": "call_loc", "output": "a"}]},
        )
        assert gone.status_code == 404
        assert [p["tool_call_id"] for p in await pending(session)] == ["call_loc"]
        assert session.events("client_tool_resolved") == []
        assert (await answer(session, "tool_results", results=[{"tool_call_id": "call_loc", "output": "x"}]))[
            0
        ] == 200
        await session.turn_done(posted["turn_id"])
        await next_turn_is_valid(session, upstream)


async def test_an_answer_for_another_session_is_not_taken(server: LiveServer, upstream: FakeUpstream) -> None:
    """The call waits in session A: posting its result to session B is a 409 there (B waits for nothing),
    to a session that does not exist a 404, and A still waits, then resumes with A's answer."""
    upstream.enqueue(calls(("call_loc", "get_location", "{}")), Script.text("Found you."))
    async with open_session(server, client_tools=[LOCATION]) as a, open_session(server) as b:
        posted = await a.accepted("where am I?")
        await awaiting(a, "client_tool_requested")
        result = {"tool_call_id": "call_loc", "output": "Paris"}
        assert (await answer(b, "tool_results", results=[result]))[0] == 409
        assert (await b.client.post(f"{a.base}x/tool_results", json={"results": [result]})).status_code == 404
        assert len(await pending(a)) == 1
        assert (await answer(a, "tool_results", results=[result]))[0] == 200
        await a.turn_done(posted["turn_id"])
        await next_turn_is_valid(a, upstream)


async def test_an_expired_client_tool_gives_the_model_a_timeout_and_a_late_result_410(
    short_expiry: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(calls(("call_loc", "get_location", "{}")), Script.text("The browser did not answer."))
    async with open_session(short_expiry, client_tools=[LOCATION]) as session:
        posted = await session.accepted("where am I?")
        await awaiting(session, "client_tool_requested")
        done = await session.turn_done(posted["turn_id"])  # no answer: it expires after 1 s
        assert done["status"] == "completed"
        [resolved] = session.events("client_tool_resolved")
        assert (resolved["resolution"], resolved["is_error"]) == ("expired", True)
        assert "timed out" in tool_messages(upstream, 2)[0]["content"]
        status, body = await answer(
            session, "tool_results", results=[{"tool_call_id": "call_loc", "output": "Paris"}]
        )
        assert (status, body["error"]["code"]) == (410, "expired")
        await next_turn_is_valid(session, upstream)


async def test_message_level_client_tools_are_offered_to_that_turn_only(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(calls(("call_loc", "get_location", "{}")), Script.text("Found you."))
    async with open_session(server) as session:
        response = await session.post("where am I?", client_tools=[LOCATION])
        assert response.status_code == 202, response.text
        turn_id = response.json()["turn_id"]
        await awaiting(session, "client_tool_requested")
        assert (await answer(session, "tool_results", results=[{"tool_call_id": "call_loc", "output": "x"}]))[
            0
        ] == 200
        await session.turn_done(turn_id)
        await next_turn_is_valid(session, upstream)

    offered = [[t["function"]["name"] for t in r.body.get("tools", [])] for r in chat_requests(upstream)]
    assert "get_location" in offered[0] and "get_location" not in offered[-1]


async def test_a_client_tool_may_not_shadow_a_server_tool(server: LiveServer) -> None:
    async with open_session(server) as session:
        clash = {"name": "calculate", "parameters": {"type": "object"}}
        created = await session.client.post("/v1/sessions", json={"client_tools": [clash]})
        assert (created.status_code, created.json()["error"]["code"]) == (400, "tool_name_clash")
        twice = await session.client.post("/v1/sessions", json={"client_tools": [LOCATION, LOCATION]})
        assert twice.status_code == 422


@pytest.mark.parametrize(
    ("parameters", "where"),
    [
        ({"type": "object", "properties": {"city": {"type": "nonsense"}}}, "parameters.properties.city.type"),
        ({"type": "object", "required": "notalist"}, "parameters.required"),
    ],
)
async def test_a_client_tool_with_an_invalid_schema_is_a_422_and_nothing_is_stored(
    server: LiveServer, upstream: FakeUpstream, parameters: dict[str, object], where: str
) -> None:
    """Checked against the JSON Schema metaschema where client tools are set (a session, a message), not
    at a provider that would then fail every turn."""
    bad = {"name": "pick_city", "parameters": parameters}
    async with open_session(server) as session:
        before = (await session.client.get("/v1/sessions")).json()
        created = await session.client.post("/v1/sessions", json={"client_tools": [LOCATION, bad]})
        assert created.status_code == 422, created.text
        assert f"client_tools[1].{where} is not a valid JSON Schema" in created.text
        assert (await session.client.get("/v1/sessions")).json() == before
        history = (await session.client.get(f"/v1/sessions/{session.id}/messages")).json()
        posted = await session.client.post(
            f"/v1/sessions/{session.id}/messages", json={"content": "hi", "client_tools": [bad]}
        )
        assert posted.status_code == 422, posted.text
        assert f"client_tools[0].{where} is not a valid JSON Schema" in posted.text
        assert (await session.client.get(f"/v1/sessions/{session.id}/messages")).json() == history
    assert chat_requests(upstream) == []
