"""Messages posted while a turn runs: steer, queue, interrupt, reject, the waiting line, and Stop's edges.

Every test runs against the strict upstream, so each history the model is sent is also checked the way
Anthropic's Messages API would check it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.fakes.upstream import FakeUpstream, Script
from tests.interrupt.session import (
    TOOL_INTERRUPTED_BY_USER,
    Session,
    assert_stop_events,
    assert_strictly_valid,
    chat_requests,
    open_session,
    roles,
)
from tests.support.server import LiveServer
from tests.support.slow_tool import SlowTool
from tests.support.sse import EventReader

pytestmark = pytest.mark.anyio

LONG_TEXT = " ".join(f"word{n}" for n in range(40))


def _slow_round(gate: str, call_id: str = "call_slow", text: str | None = "Working on it.") -> Script:
    return Script.tool_calls([(call_id, "slow", f'{{"gate": "{gate}"}}')], text_before=text)


async def _in_slow_tool(session: Session) -> None:
    await session.reader.wait_for(lambda e: e.event == "agent_status" and e.data["tool_name"] == "slow")


async def _start(session: Session, content: str = "go") -> str:
    posted = await session.accepted(content)
    assert (posted["queued"], posted["delivery"]) == (False, "steer")
    return str(posted["turn_id"])


def _waiting(body: dict[str, Any], delivery: str) -> None:
    assert (body["queued"], body["turn_id"], body["delivery"]) == (True, None, delivery), body


def _queue_lists(session: Session) -> list[list[str]]:
    return [[m["content"] for m in e["queue"]] for e in session.events("queue_updated")]


def _taken_by(session: Session, turn_id: str) -> list[str]:
    return [
        e.data["text"]
        for e in session.turn_events(turn_id)
        if e.event == "user_message" and not e.data["queued"]
    ]


async def _completed(session: Session, turn_id: str) -> None:
    done = await session.turn_done(turn_id)
    errors = [e.data for e in session.turn_events(turn_id) if e.event == "error"]
    assert (done["status"], errors) == ("completed", [])


# --- steer -----------------------------------------------------------------------------------------------


@pytest.mark.both_backends
async def test_steer_is_taken_at_the_breakpoint_after_the_tool_round(
    server: LiveServer, upstream: FakeUpstream, slow_tool: SlowTool
) -> None:
    upstream.enqueue(_slow_round("g"), Script.text("Steered answer."))
    async with open_session(server) as session:
        turn_id = await _start(session)
        await _in_slow_tool(session)
        steer = await session.accepted("change of plan")  # steer is the default
        _waiting(steer, "steer")
        assert [m["id"] for m in await session.queue()] == [steer["id"]]  # durable from the 202
        slow_tool.release("g")

        next_turn = await session.next_turn_after(turn_id)
        assert (await session.turn_done(turn_id))["status"] == "completed"
        # The old turn ended right after its tool round: no model call, no text after the results.
        old = [e.event for e in session.turn_events(turn_id)]
        tail = old[old.index("tool_exec_end") + 1 :]
        assert set(tail[:-1]) == {"agent_status"}, tail
        assert tail[-1] == "turn_done"
        await _completed(session, next_turn)
        assert _taken_by(session, next_turn) == ["change of plan"]

        assert len(chat_requests(upstream)) == 2
        seen = chat_requests(upstream)[1].body["messages"]
        assert roles(seen) == ["user", "assistant", "tool", "user"]
        assert [c["id"] for c in seen[1]["tool_calls"]] == ["call_slow"]
        assert seen[2] == {"role": "tool", "tool_call_id": "call_slow", "content": "slow done: g"}
        assert seen[3] == {"role": "user", "content": "change of plan"}
        assert_strictly_valid(upstream)

        history = await session.history()
        assert [m["type"] for m in history] == [
            "turn_start", "text", "text", "tool_group", "turn_done",
            "turn_start", "text", "text", "turn_done",
        ]  # fmt: skip
        assert history[6]["id"] == steer["id"]
        assert await session.queue() == []


async def test_steer_when_the_model_answers_without_tools_starts_the_next_turn(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(Script.text(LONG_TEXT, chunks=20, delay=0.02), Script.text("Second answer."))
    async with open_session(server) as session:
        turn_id = await _start(session)
        await session.wait_type("text_delta", count=2)
        _waiting(await session.accepted("one more thing", "steer"), "steer")
        next_turn = await session.next_turn_after(turn_id)
        # The answer was not cut short: the turn completed with the whole text.
        assert (await session.turn_done(turn_id))["status"] == "completed"
        assert (
            "".join(e.data["text"] for e in session.turn_events(turn_id) if e.event == "text_delta")
            == LONG_TEXT
        )
        await _completed(session, next_turn)
        seen = chat_requests(upstream)[1].body["messages"]
        assert seen == [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": LONG_TEXT},
            {"role": "user", "content": "one more thing"},
        ]
        assert_strictly_valid(upstream)


async def test_several_waiting_messages_are_taken_together_in_order(
    server: LiveServer, upstream: FakeUpstream, slow_tool: SlowTool
) -> None:
    upstream.enqueue(_slow_round("g"), Script.text("All three at once."))
    async with open_session(server) as session:
        turn_id = await _start(session)
        await _in_slow_tool(session)
        posted = [
            await session.accepted("first", "queue"),
            await session.accepted("second", "steer"),
            await session.accepted("third", "queue"),
        ]
        for body, delivery in zip(posted, ["queue", "steer", "queue"], strict=True):
            _waiting(body, delivery)
        assert [m["content"] for m in await session.queue()] == ["first", "second", "third"]
        slow_tool.release("g")

        next_turn = await session.next_turn_after(turn_id)
        await _completed(session, next_turn)
        assert _taken_by(session, next_turn) == ["first", "second", "third"]
        assert [e["turn_id"] for e in session.events("turn_start")] == [turn_id, next_turn]
        assert _queue_lists(session) == [
            ["first"], ["first", "second"], ["first", "second", "third"], []
        ]  # fmt: skip

        # The history's order is the order the model saw; the upstream got them as one user turn.
        history = await session.history()
        start = next(i for i, m in enumerate(history) if m.get("turn_id") == next_turn)
        assert [m["id"] for m in history[start + 1 : start + 4]] == [p["id"] for p in posted]
        seen = chat_requests(upstream)[-1].body["messages"]
        assert roles(seen) == ["user", "assistant", "tool", "user"]
        assert seen[-1] == {"role": "user", "content": "first\n\nsecond\n\nthird"}
        assert_strictly_valid(upstream)


async def test_queue_does_not_end_the_turn_at_the_breakpoint(
    server: LiveServer, upstream: FakeUpstream, slow_tool: SlowTool
) -> None:
    upstream.enqueue(_slow_round("g"), Script.text("First turn's answer."), Script.text("Queued answer."))
    async with open_session(server) as session:
        turn_id = await _start(session)
        await _in_slow_tool(session)
        _waiting(await session.accepted("later please", "queue"), "queue")
        slow_tool.release("g")

        next_turn = await session.next_turn_after(turn_id)
        assert (await session.turn_done(turn_id))["status"] == "completed"
        await _completed(session, next_turn)
        # The model's next round of the first turn still happened, without the waiting message.
        first_turn_texts = [e.data["text"] for e in session.turn_events(turn_id) if e.event == "text_delta"]
        assert "".join(first_turn_texts).endswith("First turn's answer.")
        requests = chat_requests(upstream)
        assert len(requests) == 3
        assert roles(requests[1].body["messages"]) == ["user", "assistant", "tool"]
        assert roles(requests[2].body["messages"]) == ["user", "assistant", "tool", "assistant", "user"]
        assert requests[2].body["messages"][-1] == {"role": "user", "content": "later please"}
        assert_strictly_valid(upstream)


# --- the waiting line ------------------------------------------------------------------------------------


async def test_withdraw_a_waiting_message(
    server: LiveServer, upstream: FakeUpstream, slow_tool: SlowTool
) -> None:
    upstream.enqueue(_slow_round("g"), Script.text("Only a and c."))
    async with open_session(server) as session:
        turn_id = await _start(session)
        await _in_slow_tool(session)
        a, b, c = [await session.accepted(text, "queue") for text in ("a", "b", "c")]
        assert [m["id"] for m in await session.queue()] == [a["id"], b["id"], c["id"]]

        withdrawn = await session.withdraw(b["id"])
        assert withdrawn.status_code == 200, withdrawn.text
        assert withdrawn.json() == {
            k: b[k] for k in ("id", "content", "sender", "client_message_id", "timestamp", "delivery")
        }
        assert [m["id"] for m in await session.queue()] == [a["id"], c["id"]]
        again = await session.withdraw(b["id"])
        assert again.status_code == 404
        assert again.json()["error"]["code"] == "not_found"
        unknown = await session.withdraw("m_0000000000")
        assert unknown.status_code == 404

        slow_tool.release("g")
        await session.wait_idle()
        [_, next_turn] = [e["turn_id"] for e in session.events("turn_start")]
        assert _taken_by(session, next_turn) == ["a", "c"]
        taken = await session.withdraw(a["id"])
        assert taken.status_code == 409
        assert taken.json()["error"]["code"] == "already_taken"
        assert taken.json()["error"]["details"] == {"message_id": a["id"]}

        # Every change told every client the whole list.
        assert _queue_lists(session) == [["a"], ["a", "b"], ["a", "b", "c"], ["a", "c"], []]
        assert await session.user_texts() == ["go", "a", "c"]
        assert chat_requests(upstream)[-1].body["messages"][-1] == {"role": "user", "content": "a\n\nc"}
        assert_strictly_valid(upstream)
        assert next_turn != turn_id


# --- interrupt and reject --------------------------------------------------------------------------------


async def test_interrupt_stops_the_turn_and_answers_the_new_message(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(Script.text(LONG_TEXT, chunks=40, delay=0.03), Script.text("Interrupted, answering."))
    async with open_session(server) as session:
        turn_id = await _start(session)
        await session.wait_type("text_delta", count=2)
        _waiting(await session.accepted("was waiting", "queue"), "queue")
        response = await session.post("stop that", "interrupt")
        assert response.status_code == 202, response.text
        body = response.json()
        assert (body["queued"], body["delivery"]) == (False, "interrupt")
        next_turn = body["turn_id"]
        assert next_turn not in (None, turn_id)

        assert (await session.turn_done(turn_id))["status"] == "cancelled"
        assert_stop_events(session, turn_id)
        await _completed(session, next_turn)
        assert [e["turn_id"] for e in session.events("turn_start")] == [turn_id, next_turn]
        # What waited before the interrupt is taken with it, in order.
        assert _taken_by(session, next_turn) == ["was waiting", "stop that"]
        seen = chat_requests(upstream)[-1].body["messages"]
        assert roles(seen) == ["user", "assistant", "user"]
        assert seen[1]["content"].endswith("[interrupted]")
        assert seen[2] == {"role": "user", "content": "was waiting\n\nstop that"}
        assert chat_requests(upstream)[0].disconnected
        assert_strictly_valid(upstream)


async def test_interrupt_on_an_idle_session_just_starts_a_turn(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    async with open_session(server) as session:
        body = await session.accepted("hello", "interrupt")
        assert body["queued"] is False
        await _completed(session, body["turn_id"])
        assert session.events("agent_cancelled") == []
        assert_strictly_valid(upstream)


async def test_reject_answers_409_and_stores_nothing(
    server: LiveServer, upstream: FakeUpstream, slow_tool: SlowTool
) -> None:
    upstream.enqueue(_slow_round("g"), Script.text("Done."), Script.text("Queued answer."))
    async with open_session(server) as session:
        turn_id = await _start(session)
        await _in_slow_tool(session)
        queued = await session.accepted("queued before", "queue")
        await session.reader.wait_for(lambda e: e.event == "queue_updated" and len(e.data["queue"]) == 1)
        history_before = await session.history()
        events_before = len(session.reader.events)

        response = await session.post("not now", "reject")
        assert response.status_code == 409, response.text
        error = response.json()["error"]
        assert (error["code"], error["details"]) == ("turn_running", {"turn_id": turn_id})

        assert [m["id"] for m in await session.queue()] == [queued["id"]]
        assert await session.history() == history_before
        await asyncio.sleep(0.2)  # events are delivered in batches: give a wrong one the time to show
        assert [e.event for e in session.reader.events[events_before:]] == []
        slow_tool.release("g")
        await session.wait_idle()
        assert "not now" not in await session.user_texts()
        assert [e["text"] for e in session.events("user_message")].count("not now") == 0
        assert len(session.events("turn_start")) == 2
        assert_strictly_valid(upstream)

        # On an idle session, reject starts a turn like any other delivery.
        idle = await session.accepted("now is fine", "reject")
        assert idle["queued"] is False
        await _completed(session, idle["turn_id"])


# --- stop ------------------------------------------------------------------------------------------------


async def test_cancel_with_clear_queue_withdraws_the_waiting_messages(
    server: LiveServer, upstream: FakeUpstream, slow_tool: SlowTool
) -> None:
    upstream.enqueue(_slow_round("g"), Script.text("After the clear."))
    async with open_session(server) as session:
        turn_id = await _start(session)
        await _in_slow_tool(session)
        a = await session.accepted("restore me", "queue")
        b = await session.accepted("and me", "steer")
        response = await session.cancel(clear_queue=True)
        assert response.status_code == 202, response.text
        result = response.json()
        assert (result["cancelled"], result["turn_id"]) == (True, turn_id)
        fields = ("id", "content", "sender", "client_message_id", "timestamp", "delivery")
        assert result["withdrawn"] == [{k: m[k] for k in fields} for m in (a, b)]
        assert result["interrupted_tool_call_ids"] == ["call_slow"]

        await session.turn_done(turn_id)
        cancelled = assert_stop_events(session, turn_id)
        assert cancelled["interrupted_tool_call_ids"] == result["interrupted_tool_call_ids"]
        assert cancelled["interrupted_message_ids"] == result["interrupted_message_ids"]
        await asyncio.sleep(0.3)
        assert [e["turn_id"] for e in session.events("turn_start")] == [turn_id]  # no new turn
        assert await session.queue() == []
        assert _queue_lists(session)[-1] == []
        info = await session.info()
        assert (info["agent_status"], info["running_turn_id"]) == ("idle", None)
        assert await session.user_texts() == ["go"]
        assert (await session.withdraw(a["id"])).status_code == 404

        follow = await session.accepted("fresh start")
        await _completed(session, follow["turn_id"])
        seen = chat_requests(upstream)[-1].body["messages"]
        assert roles(seen) == ["user", "assistant", "tool", "user"]
        assert seen[2]["content"] == TOOL_INTERRUPTED_BY_USER
        assert_strictly_valid(upstream)


async def test_cancel_without_clear_queue_takes_the_waiting_messages(
    server: LiveServer, upstream: FakeUpstream, slow_tool: SlowTool
) -> None:
    upstream.enqueue(_slow_round("g"), Script.text("Taking them."))
    async with open_session(server) as session:
        turn_id = await _start(session)
        await _in_slow_tool(session)
        await session.accepted("a", "queue")
        await session.accepted("b", "queue")
        result = (await session.cancel(clear_queue=False)).json()
        assert (result["cancelled"], result["withdrawn"]) == (True, [])
        next_turn = await session.next_turn_after(turn_id)
        await _completed(session, next_turn)
        assert _taken_by(session, next_turn) == ["a", "b"]
        assert_strictly_valid(upstream)


async def test_concurrent_cancels_stop_the_turn_once(server: LiveServer, upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.text(LONG_TEXT, chunks=40, delay=0.03), Script.text("After."))
    async with open_session(server) as session:
        turn_id = await _start(session)
        await session.wait_type("text_delta", count=2)
        responses = await asyncio.gather(*(session.cancel() for _ in range(5)))
        bodies = [r.json() for r in responses]
        stopped = [b for r, b in zip(responses, bodies, strict=True) if r.status_code == 202]
        idle = [b for r, b in zip(responses, bodies, strict=True) if r.status_code == 200]
        assert stopped, bodies
        assert all(b == stopped[0] for b in stopped), bodies
        assert all(b["cancelled"] is False for b in idle), bodies
        assert stopped[0]["turn_id"] == turn_id
        assert len(stopped[0]["interrupted_message_ids"]) == 1

        await session.turn_done(turn_id)
        cancelled = assert_stop_events(session, turn_id)
        assert cancelled["interrupted_message_ids"] == stopped[0]["interrupted_message_ids"]
        await asyncio.sleep(0.2)
        assert len(session.events("agent_cancelled")) == 1
        assert len(session.events("turn_done")) == 1
        history = await session.history()
        assert [m["type"] for m in history] == ["turn_start", "text", "text", "turn_done"]
        await session.wait_idle()

        again = await session.cancel()
        assert (again.status_code, again.json()["cancelled"]) == (200, False)
        follow = await session.accepted("still usable?")
        await _completed(session, follow["turn_id"])
        assert_strictly_valid(upstream)


async def test_cancel_on_an_idle_session(server: LiveServer, upstream: FakeUpstream) -> None:
    async with open_session(server) as session:
        empty: dict[str, Any] = {
            "cancelled": False,
            "turn_id": None,
            "interrupted_message_ids": [],
            "interrupted_tool_call_ids": [],
            "withdrawn": [],
        }
        for body in (None, {"clear_queue": True}):
            response = await session.client.post(f"{session.base}/cancel", json=body)
            assert response.status_code == 200, response.text
            assert response.json() == empty
        turn_id = await _start(session)
        await _completed(session, turn_id)
        await session.wait_idle()
        after = await session.cancel()
        assert (after.status_code, after.json()) == (200, empty)
        assert session.events("agent_cancelled") == []
        unknown = await session.client.post("/v1/sessions/s_0000000000000000/cancel")
        assert unknown.status_code == 404


async def test_closing_an_event_stream_is_not_a_cancel(server: LiveServer, upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.text(LONG_TEXT, chunks=30, delay=0.02))
    async with open_session(server) as session:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as other_client:
            leaving = EventReader(other_client, f"{session.base}/events")
            await leaving.__aenter__()
            turn_id = await _start(session)
            await leaving.wait_type("text_delta", count=3)
            await leaving.__aexit__(None, None, None)  # the client goes away mid-turn
        await _completed(session, turn_id)
        text = "".join(e["text"] for e in session.events("text_delta"))
        assert text == LONG_TEXT
        assert session.events("agent_cancelled") == []
        [request] = chat_requests(upstream)
        assert not request.disconnected
        assistant = [m for m in await session.history() if m["type"] == "text" and m["role"] == "assistant"]
        assert [(m["content"], m["interrupted"]) for m in assistant] == [(LONG_TEXT, False)]
