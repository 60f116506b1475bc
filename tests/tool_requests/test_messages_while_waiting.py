"""Messages and stops while calls wait: steer and queue wait until the calls are answered (or expire),
interrupt and cancel end the turn at once with every waiting call given an interrupted result. Each is
followed by a turn the strict upstream accepts: the history a stop leaves in a suspended round is valid.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.fakes.upstream import FakeUpstream, Script
from tests.interrupt.session import TOOL_INTERRUPTED_BY_USER, assert_stop_events, chat_requests, open_session
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

GUARDED = {"tools": ["calculate"], "approval": ["calculate"], "client_tools": [LOCATION]}


@pytest.mark.parametrize("delivery", ["steer", "queue"])
async def test_steer_and_queue_wait_until_the_calls_are_answered(
    server: LiveServer, upstream: FakeUpstream, delivery: str
) -> None:
    upstream.enqueue(calls(("call_loc", "get_location", "{}")))
    # steer: the turn ends at the breakpoint after the round; queue: the turn finishes first.
    upstream.enqueue(Script.text("You are in Paris." if delivery == "queue" else "Steered."))
    if delivery == "queue":
        upstream.enqueue(Script.text("Queued answer."))
    async with open_session(server, **GUARDED) as session:
        posted = await session.accepted("where am I?")
        await awaiting(session, "client_tool_requested")
        waiting = await session.accepted("and the weather?", delivery)
        assert waiting["queued"] is True
        await asyncio.sleep(0.3)
        assert len(chat_requests(upstream)) == 1  # still waiting: nothing taken, nothing asked
        assert [m["id"] for m in await session.queue()] == [waiting["id"]]
        assert (await session.info())["agent_status"] == "awaiting_input"

        assert (
            await answer(session, "tool_results", results=[{"tool_call_id": "call_loc", "output": "Paris"}])
        )[0] == 200
        first = await session.turn_done(posted["turn_id"])
        assert first["status"] == "completed"
        second = await session.next_turn_after(posted["turn_id"])
        assert (await session.turn_done(second))["status"] == "completed"
        # The model saw the client's result, then the message, in order.
        last = chat_requests(upstream)[-1].body["messages"]
        assert [m["role"] for m in last][-2:] == (
            ["tool", "user"] if delivery == "steer" else ["assistant", "user"]
        )
        await next_turn_is_valid(session, upstream)


@pytest.mark.parametrize("how", ["cancel", "interrupt"])
async def test_cancel_and_interrupt_give_every_waiting_call_an_interrupted_result(
    server: LiveServer, upstream: FakeUpstream, how: str
) -> None:
    upstream.enqueue(
        calls(
            ("call_loc", "get_location", "{}"), ("call_c", "calculate", '{"expression": "1+1"}'), text="Two."
        )
    )
    async with open_session(server, **GUARDED) as session:
        posted = await session.accepted("where and how much?")
        await awaiting(session, "approval_requested")
        await awaiting(session, "client_tool_requested")
        if how == "cancel":
            response = await session.cancel()
            assert response.status_code == 202, response.text
            assert sorted(response.json()["interrupted_tool_call_ids"]) == ["call_c", "call_loc"]
        else:
            upstream.enqueue(Script.text("Interrupted, then answered."))
            await session.accepted("never mind", "interrupt")
        cancelled = assert_stop_events(session, posted["turn_id"])
        assert sorted(cancelled["interrupted_tool_call_ids"]) == ["call_c", "call_loc"]
        assert [e["resolution"] for e in session.events("client_tool_resolved")] == ["interrupted"]
        assert [e["decision"] for e in session.events("approval_resolved")] == ["interrupted"]
        assert await pending(session) == []
        # Answers after the stop: the calls no longer wait.
        status, _ = await answer(
            session, "approvals", decisions=[{"tool_call_id": "call_c", "decision": "approve"}]
        )
        assert status == 409
        if how == "interrupt":
            taker = await session.next_turn_after(posted["turn_id"])
            assert (await session.turn_done(taker))["status"] == "completed"
            results = tool_messages(upstream, 2)
            assert [m["content"] for m in results] == [TOOL_INTERRUPTED_BY_USER] * 2
        await next_turn_is_valid(session, upstream)
        rows = tool_rows(await session.history())
    assert {r["tool_call_id"]: (r["interrupted"], r["is_error"]) for r in rows} == {
        "call_loc": (True, True),
        "call_c": (True, True),
    }
    assert next(r for r in rows if r["tool_call_id"] == "call_c")["decision"] == "interrupted"
