"""Human approval over real HTTP and SSE: a call of a tool the session marks for approval waits for a
person's decision. Approve runs it, edit runs it with checked arguments (422 when they do not fit),
reject gives the model an error with the reason, expiry rejects it with "approval timed out"; one answer
decides the whole round, and the same answer twice is a replay. Each test ends with a further turn the
strict upstream accepts, so the history a suspension leaves is valid."""

from __future__ import annotations

import json

import pytest

from tests.fakes.upstream import FakeUpstream, Script
from tests.interrupt.session import Session, chat_requests, open_session
from tests.support.server import LiveServer
from tests.tool_requests.helpers import (
    answer,
    awaiting,
    calls,
    next_turn_is_valid,
    pending,
    tool_messages,
    tool_rows,
)

pytestmark = pytest.mark.anyio

GUARDED = {"tools": ["calculate", "current_time", "slow"], "approval": ["calculate"]}


async def test_an_approved_call_runs_and_the_turn_goes_on(server: LiveServer, upstream: FakeUpstream) -> None:
    upstream.enqueue(calls(("call_c", "calculate", '{"expression": "6*7"}'), text="Let me compute."))
    upstream.enqueue(Script.text("It is 42."))
    async with open_session(server, **GUARDED) as session:
        assert (await session.info())["approval"] == ["calculate"]
        posted = await session.accepted("what is 6*7?")
        [requested] = await awaiting(session, "approval_requested")
        assert requested["decisions"] == ["approve", "edit", "reject"]
        assert requested["arguments"] == {"expression": "6*7"}
        [waiting] = await pending(session)
        assert (waiting["kind"], waiting["decisions"]) == ("approval", ["approve", "edit", "reject"])
        assert len(chat_requests(upstream)) == 1  # nothing ran: the model waits with the call

        decision = {"tool_call_id": "call_c", "decision": "approve"}
        status, body = await answer(session, "approvals", decisions=[decision])
        assert (status, body["resolved"][0]["resolution"]) == (200, "approve")
        done = await session.turn_done(posted["turn_id"])
        assert done["status"] == "completed"
        assert tool_messages(upstream, 2)[0]["content"] == "42"
        [resolved] = session.events("approval_resolved")
        assert (resolved["decision"], resolved["wait_ms"] >= 0) == ("approve", True)
        # The same decision again: a replay; another one now: 409.
        status, body = await answer(session, "approvals", decisions=[decision])
        assert (status, body["resolved"][0]["replayed"]) == (200, True)
        status, body = await answer(session, "approvals", decisions=[{**decision, "decision": "reject"}])
        assert status == 409
        await next_turn_is_valid(session, upstream)
        [row] = tool_rows(await session.history())
    # The row says who ran it, the decision, and the wait apart from the execution.
    assert (row["executed_by"], row["decision"], row["result"]) == ("server", "approve", "42")
    assert row["wait_ms"] is not None and row["duration_ms"] is not None
    assert len(session.events("approval_resolved")) == 1


async def test_edit_runs_checked_arguments_and_refuses_ones_that_do_not_fit(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(calls(("call_c", "calculate", '{"expression": "6*7"}')), Script.text("It is 9."))
    async with open_session(server, **GUARDED) as session:
        posted = await session.accepted("what is 6*7?")
        await awaiting(session, "approval_requested")
        wrong = {"tool_call_id": "call_c", "decision": "edit", "arguments": {"expression": 5}}
        status, body = await answer(session, "approvals", decisions=[wrong])
        assert (status, body["error"]["code"]) == (422, "invalid_answer")
        unknown = {"tool_call_id": "call_c", "decision": "edit", "arguments": {"expr": "1"}}
        assert (await answer(session, "approvals", decisions=[unknown]))[0] == 422
        assert len(await pending(session)) == 1  # refused: nothing taken, it still waits
        edited = {"tool_call_id": "call_c", "decision": "edit", "arguments": {"expression": "3*3"}}
        assert (await answer(session, "approvals", decisions=[edited]))[0] == 200
        await session.turn_done(posted["turn_id"])
        # The model reads the edited call and its result.
        second = chat_requests(upstream)[1].body["messages"]
        [assistant] = [m for m in second if m.get("tool_calls")]
        assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"expression": "3*3"}
        assert tool_messages(upstream, 2)[0]["content"] == "9"
        [resolved] = session.events("approval_resolved")
        assert (resolved["decision"], resolved["arguments"]) == ("edit", {"expression": "3*3"})
        await next_turn_is_valid(session, upstream)


async def test_reject_gives_the_model_an_error_with_the_reason(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(calls(("call_c", "calculate", '{"expression": "1/0"}')), Script.text("Understood."))
    async with open_session(server, **GUARDED) as session:
        posted = await session.accepted("divide by zero")
        await awaiting(session, "approval_requested")
        decision = {"tool_call_id": "call_c", "decision": "reject", "reason": "not today"}
        assert (await answer(session, "approvals", decisions=[decision]))[0] == 200
        await session.turn_done(posted["turn_id"])
        [result] = tool_messages(upstream, 2)
        assert "rejected" in result["content"] and "not today" in result["content"]
        [end] = session.events("tool_exec_end")
        assert (end["tool_result"]["is_error"], end["duration_ms"]) == (True, 0)
        await next_turn_is_valid(session, upstream)


async def test_one_answer_decides_every_open_request_of_the_round(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(
        calls(
            ("call_a", "calculate", '{"expression": "1+1"}'), ("call_b", "calculate", '{"expression": "2+2"}')
        ),
        Script.text("2 and 4."),
    )
    async with open_session(server, **GUARDED) as session:
        posted = await session.accepted("two sums")
        await awaiting(session, "approval_requested", count=2)
        only_a = [{"tool_call_id": "call_a", "decision": "approve"}]
        status, body = await answer(session, "approvals", decisions=only_a)
        assert (status, body["error"]["details"]["missing"]) == (422, ["call_b"])
        both = [*only_a, {"tool_call_id": "call_b", "decision": "approve"}]
        assert (await answer(session, "approvals", decisions=both))[0] == 200
        await session.turn_done(posted["turn_id"])
        assert [m["content"] for m in tool_messages(upstream, 2)] == ["2", "4"]
        await next_turn_is_valid(session, upstream)


async def test_a_server_tool_of_the_round_runs_while_the_approval_waits(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(
        calls(("call_t", "current_time", "{}"), ("call_c", "calculate", '{"expression": "2*3"}')),
        Script.text("Done."),
    )
    async with open_session(server, **GUARDED) as session:
        posted = await session.accepted("time and a sum")
        await awaiting(session, "approval_requested")
        await session.reader.wait_for(lambda e: e.event == "tool_exec_end")  # current_time ran at once
        assert (
            await answer(session, "approvals", decisions=[{"tool_call_id": "call_c", "decision": "approve"}])
        )[0] == 200
        await session.turn_done(posted["turn_id"])
        results = tool_messages(upstream, 2)
        assert [m["tool_call_id"] for m in results] == ["call_t", "call_c"]  # call order
        await next_turn_is_valid(session, upstream)


async def test_an_expired_approval_rejects_the_call(short_expiry: LiveServer, upstream: FakeUpstream) -> None:
    upstream.enqueue(calls(("call_c", "calculate", '{"expression": "1+1"}')), Script.text("No approval."))
    async with open_session(short_expiry, **GUARDED) as session:
        posted = await session.accepted("1+1?")
        await awaiting(session, "approval_requested")
        done = await session.turn_done(posted["turn_id"])
        assert done["status"] == "completed"
        assert tool_messages(upstream, 2)[0]["content"] == "approval timed out"
        [resolved] = session.events("approval_resolved")
        assert resolved["decision"] == "expired"
        status, body = await answer(
            session, "approvals", decisions=[{"tool_call_id": "call_c", "decision": "approve"}]
        )
        assert (status, body["error"]["code"]) == (410, "expired")
        await next_turn_is_valid(session, upstream)
        [row] = tool_rows(await session.history())
        assert (row["decision"], row["is_error"]) == ("expired", True)


async def test_approval_of_an_unknown_tool_is_refused_at_creation(server: LiveServer) -> None:
    async with open_session(server) as session:
        created = await session.client.post(
            "/v1/sessions", json={"tools": ["calculate"], "approval": ["nope"]}
        )
        assert (created.status_code, created.json()["error"]["code"]) == (422, "unknown_tool")
        every = await session.client.post("/v1/sessions", json={"approval": {"calculate": "always"}})
        assert (every.status_code, every.json()["approval"]) == (201, ["calculate"])


def statuses(session: Session, turn_id: str) -> list[tuple[str, str | None]]:
    return [
        (e.data["status"], e.data["tool_name"])
        for e in session.turn_events(turn_id)
        if e.event == "agent_status"
    ]


async def test_an_approved_call_announces_tool_calling_once(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    """Each agent_status says something new: after a decision, `tool_calling` once, then `thinking`."""
    upstream.enqueue(calls(("call_c", "calculate", '{"expression": "6*7"}')), Script.text("It is 42."))
    async with open_session(server, **GUARDED) as session:
        posted = await session.accepted("what is 6*7?")
        await awaiting(session, "approval_requested")
        decision = {"tool_call_id": "call_c", "decision": "approve"}
        assert (await answer(session, "approvals", decisions=[decision]))[0] == 200
        await session.turn_done(posted["turn_id"])
        assert statuses(session, posted["turn_id"]) == [
            ("thinking", None),
            ("awaiting_input", None),
            ("tool_calling", "calculate"),
            ("thinking", None),
            ("idle", None),
        ]
