"""Stop (and interrupt) at every point of a turn, against a strict upstream; the next turn must complete.

Each case stops a turn at one point (before the first token, mid-text, while tool-call arguments stream,
during tool execution with one of two parallel tools done, between rounds), then checks:
- the upstream saw the disconnect (when a request was in flight), well within a second;
- the events end the turn with agent_status idle → agent_cancelled → turn_done(cancelled);
- the 202 lists exactly what agent_cancelled lists, and the partial state is committed;
- a following message gets a turn that COMPLETES: the strict fake would answer 400 to an invalid history.
`interrupt` cases do the same with a message posted with `delivery: interrupt` instead of a cancel.
A provider error mid-stream (the stream is cut) is checked the same way, without a stop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest
from sqlmodel.ext.asyncio.session import AsyncSession

from app.storage import repository
from app.storage.tables import ChatMessageRow, QueuedMessageRow
from tests.fakes.upstream import FakeUpstream, Script
from tests.interrupt.session import (
    INTERRUPTED_MARK,
    TOOL_INTERRUPTED_BY_USER,
    Session,
    assert_stop_events,
    assert_strictly_valid,
    chat_requests,
    disconnect_after,
    open_session,
    request_number,
    roles,
)
from tests.support.server import LiveServer
from tests.support.slow_tool import SlowTool

pytestmark = pytest.mark.anyio

HOW = pytest.mark.parametrize("how", ["cancel", "interrupt"])


@pytest.fixture(params=["auto", "litellm"])
def stream_adapter(request: pytest.FixtureRequest) -> str:
    """Every stop point with both stream adapters: the lean reader and LiteLLM's stream on its thread."""
    adapter: str = request.param
    return adapter


LONG_TEXT = " ".join(f"word{n}" for n in range(60))


async def _stop(session: Session, how: str, turn_id: str) -> tuple[float, dict[str, Any], str]:
    """Stops the running turn; returns when the stop was sent, the stop's answer, and the next turn."""
    since = time.monotonic()
    if how == "cancel":
        response = await session.cancel()
        assert response.status_code == 202, response.text
        body: dict[str, Any] = response.json()
        assert body["cancelled"] is True
        assert body["turn_id"] == turn_id
        assert body["withdrawn"] == []
        await session.turn_done(turn_id)
        follow = await session.accepted("and now?")
        return since, body, str(follow["turn_id"])
    response = await session.post("and now?", "interrupt")
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["queued"] is False, body
    assert body["turn_id"] not in (None, turn_id)
    await session.turn_done(turn_id)
    return since, body, str(body["turn_id"])


async def _next_turn_completes(
    session: Session, upstream: FakeUpstream, turn_id: str
) -> list[dict[str, Any]]:
    """The turn after the stop completes; returns the history the upstream got for it."""
    done = await session.turn_done(turn_id)
    errors = [e.data for e in session.turn_events(turn_id) if e.event == "error"]
    assert (done["status"], errors) == ("completed", [])
    assert_strictly_valid(upstream)
    last: list[dict[str, Any]] = chat_requests(upstream)[-1].body["messages"]
    assert last[-1]["role"] == "user"
    assert last[-1]["content"].endswith("and now?")
    return last


def _check_answer(how: str, body: dict[str, Any], cancelled: dict[str, Any]) -> None:
    """The cancel's 202 lists exactly what the event lists."""
    if how == "cancel":
        assert body["interrupted_message_ids"] == cancelled["interrupted_message_ids"]
        assert body["interrupted_tool_call_ids"] == cancelled["interrupted_tool_call_ids"]


async def _start(session: Session, content: str = "go") -> str:
    posted = await session.accepted(content)
    assert posted["queued"] is False
    return str(posted["turn_id"])


@HOW
async def test_stop_before_the_first_token(server: LiveServer, upstream: FakeUpstream, how: str) -> None:
    upstream.enqueue(Script.hang(30), Script.text("Fresh answer."))
    async with open_session(server) as session:
        turn_id = await _start(session)
        request = await request_number(upstream, 1)
        since, body, next_turn = await _stop(session, how, turn_id)
        await disconnect_after(upstream, request, since, f"before the first token ({how})")
        assert request.chunks_sent == 0
        cancelled = assert_stop_events(session, turn_id)
        assert cancelled["interrupted_message_ids"] == [] == cancelled["interrupted_tool_call_ids"]
        _check_answer(how, body, cancelled)
        assert "text_delta" not in [e.event for e in session.turn_events(turn_id)]

        seen = await _next_turn_completes(session, upstream, next_turn)
        # Nothing of the model reached the history: both user messages form one user turn.
        assert seen == [{"role": "user", "content": "go\n\nand now?"}]


@pytest.mark.both_backends
@HOW
async def test_stop_mid_text_keeps_the_partial_text(
    server: LiveServer, upstream: FakeUpstream, how: str
) -> None:
    upstream.enqueue(Script.text(LONG_TEXT, chunks=60, delay=0.02), Script.text("Fresh answer."))
    async with open_session(server) as session:
        turn_id = await _start(session)
        await session.wait_type("text_delta", count=4)
        request = chat_requests(upstream)[0]
        since, body, next_turn = await _stop(session, how, turn_id)
        await disconnect_after(upstream, request, since, f"mid-text ({how})")
        cancelled = assert_stop_events(session, turn_id)
        deltas = [e.data for e in session.turn_events(turn_id) if e.event == "text_delta"]
        text_id = deltas[0]["id"]
        streamed = "".join(d["text"] for d in deltas)
        assert 0 < len(streamed) < len(LONG_TEXT)
        assert cancelled["interrupted_message_ids"] == [text_id]
        assert cancelled["interrupted_tool_call_ids"] == []
        _check_answer(how, body, cancelled)

        seen = await _next_turn_completes(session, upstream, next_turn)
        assert seen[:2] == [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": f"{streamed}\n\n{INTERRUPTED_MARK}"},
        ]
        partial = next(m for m in await session.history() if m["id"] == text_id)
        assert (partial["content"], partial["interrupted"]) == (streamed, True)


@HOW
@pytest.mark.parametrize("text_before", ["Let me compute that.", None])
async def test_stop_while_tool_call_arguments_stream(
    server: LiveServer, upstream: FakeUpstream, how: str, text_before: str | None
) -> None:
    arguments = '{"expression": "' + "+".join(str(n) for n in range(1, 40)) + '"}'
    upstream.enqueue(
        Script.tool_calls(
            [("call_args", "calculate", arguments)], fragments=40, text_before=text_before, delay=0.02
        ),
        Script.text("Fresh answer."),
    )
    async with open_session(server) as session:
        turn_id = await _start(session)
        request = await request_number(upstream, 1)
        # role chunk + text chunks + the call's first fragment (name, id) + a few argument fragments
        await upstream.await_request(lambda r: r is request and r.chunks_sent >= 10, within=5)
        since, body, next_turn = await _stop(session, how, turn_id)
        await disconnect_after(
            upstream, request, since, f"tool-call arguments ({how}, text {bool(text_before)})"
        )
        assert request.chunks_sent < 40
        cancelled = assert_stop_events(session, turn_id)
        assert session.events("tool_exec_start") == []
        assert cancelled["interrupted_tool_call_ids"] == []
        _check_answer(how, body, cancelled)

        seen = await _next_turn_completes(session, upstream, next_turn)
        history = await session.history()
        assert [m for m in history if m["type"] == "tool_group"] == []
        if text_before is None:
            assert cancelled["interrupted_message_ids"] == []
            assert seen == [{"role": "user", "content": "go\n\nand now?"}]
        else:
            [text] = [m for m in history if m["type"] == "text" and m["role"] == "assistant"][:1]
            assert cancelled["interrupted_message_ids"] == [text["id"]]
            assert (text["content"], text["interrupted"]) == (text_before, True)
            assert seen[1] == {"role": "assistant", "content": f"{text_before}\n\n{INTERRUPTED_MARK}"}
            assert "tool_calls" not in seen[1]


@HOW
async def test_stop_during_tools_with_one_of_two_done(
    server: LiveServer, upstream: FakeUpstream, slow_tool: SlowTool, how: str
) -> None:
    upstream.enqueue(
        Script.tool_calls(
            [
                ("call_fast", "calculate", '{"expression": "6*7"}'),
                ("call_slow", "slow", '{"gate": "never"}'),
            ],
            text_before="Two things.",
        ),
        Script.text("Fresh answer."),
    )
    async with open_session(server) as session:
        turn_id = await _start(session)
        await session.reader.wait_for(
            lambda e: e.event == "tool_exec_end" and e.data["tool_result"]["tool_call_id"] == "call_fast"
        )
        await session.reader.wait_for(
            lambda e: e.event == "agent_status" and e.data["tool_name"] == "slow", timeout=5
        )
        assert slow_tool.started == ["never"]
        _, body, next_turn = await _stop(session, how, turn_id)
        cancelled = assert_stop_events(session, turn_id)
        # The running tool was cancelled (not left running, not finished).
        assert (slow_tool.cancelled, slow_tool.finished) == (["never"], [])
        slow_row = next(
            e["id"] for e in session.events("tool_exec_start") if e["tool_call"]["id"] == "call_slow"
        )
        assert cancelled["interrupted_tool_call_ids"] == ["call_slow"]
        assert cancelled["interrupted_message_ids"] == [slow_row]
        _check_answer(how, body, cancelled)
        ends = [e["tool_result"]["tool_call_id"] for e in session.events("tool_exec_end")]
        assert ends == ["call_fast"]

        seen = await _next_turn_completes(session, upstream, next_turn)
        groups = {m["tool_call_id"]: m for m in await session.history() if m["type"] == "tool_group"}
        assert (groups["call_fast"]["result"], groups["call_fast"]["is_error"]) == ("42", False)
        assert (groups["call_slow"]["result"], groups["call_slow"]["is_error"]) == (
            TOOL_INTERRUPTED_BY_USER,
            True,
        )
        assert roles(seen) == ["user", "assistant", "tool", "tool", "user"]
        assert [c["id"] for c in seen[1]["tool_calls"]] == ["call_fast", "call_slow"]
        assert seen[2] == {"role": "tool", "tool_call_id": "call_fast", "content": "42"}
        assert seen[3] == {"role": "tool", "tool_call_id": "call_slow", "content": TOOL_INTERRUPTED_BY_USER}


@HOW
async def test_stop_between_rounds(server: LiveServer, upstream: FakeUpstream, how: str) -> None:
    upstream.enqueue(
        Script.tool_calls([("call_calc", "calculate", '{"expression": "2+3"}')]),
        Script.hang(30),
        Script.text("Fresh answer."),
    )
    async with open_session(server) as session:
        turn_id = await _start(session)
        second = await request_number(upstream, 2)
        since, body, next_turn = await _stop(session, how, turn_id)
        await disconnect_after(upstream, second, since, f"between rounds ({how})")
        cancelled = assert_stop_events(session, turn_id)
        assert cancelled["interrupted_message_ids"] == [] == cancelled["interrupted_tool_call_ids"]
        _check_answer(how, body, cancelled)

        seen = await _next_turn_completes(session, upstream, next_turn)
        assert roles(seen) == ["user", "assistant", "tool", "user"]
        assert seen[2] == {"role": "tool", "tool_call_id": "call_calc", "content": "5"}


async def _failed_turn(session: Session, turn_id: str) -> dict[str, Any]:
    done = await session.turn_done(turn_id)
    assert done["status"] == "failed"
    types = [e.event for e in session.turn_events(turn_id)]
    assert types[-3:] == ["error", "agent_status", "turn_done"], types
    assert "agent_cancelled" not in types
    [error] = session.events("error")
    return error


@pytest.mark.parametrize("where", ["text", "tool_call_arguments"])
async def test_provider_error_mid_stream(server: LiveServer, upstream: FakeUpstream, where: str) -> None:
    if where == "text":
        upstream.enqueue(Script.cut(LONG_TEXT, after=4, chunks=20))
    else:
        upstream.enqueue(
            Script.tool_calls(
                [("call_cut", "calculate", '{"expression": "1+1+1+1+1+1"}')],
                fragments=10,
                text_before="Computing.",
                text_chunks=2,
                cut_after=6,
            )
        )
    upstream.enqueue(Script.text("Fresh answer."))
    async with open_session(server) as session:
        turn_id = await _start(session)
        error = await _failed_turn(session, turn_id)
        assert error["code"] == "provider_stream_interrupted"
        streamed = "".join(e.data["text"] for e in session.turn_events(turn_id) if e.event == "text_delta")
        assert streamed
        follow = await session.accepted("and now?")
        seen = await _next_turn_completes(session, upstream, str(follow["turn_id"]))
        assert seen[1] == {"role": "assistant", "content": f"{streamed}\n\n{INTERRUPTED_MARK}"}
        assert roles(seen) == ["user", "assistant", "user"]


async def test_provider_error_before_any_output(server: LiveServer, upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.error(400, "no"), Script.text("Fresh answer."))
    async with open_session(server) as session:
        turn_id = await _start(session)
        error = await _failed_turn(session, turn_id)
        assert error["code"] == "provider_bad_request"
        follow = await session.accepted("and now?")
        seen = await _next_turn_completes(session, upstream, str(follow["turn_id"]))
        assert seen == [{"role": "user", "content": "go\n\nand now?"}]


async def test_stop_then_steer_waiting_is_taken_with_the_strict_history(
    server: LiveServer, upstream: FakeUpstream, slow_tool: SlowTool
) -> None:
    """A stop during a tool round while a steer message waits: the steer message is the next turn."""
    upstream.enqueue(
        Script.tool_calls([("call_wait", "slow", '{"gate": "held"}')]),
        Script.text("Fresh answer."),
    )
    async with open_session(server) as session:
        turn_id = await _start(session)
        await session.reader.wait_for(lambda e: e.event == "agent_status" and e.data["tool_name"] == "slow")
        waiting = await session.accepted("and now?", "steer")
        assert waiting["queued"] is True
        response = await session.cancel()
        assert response.status_code == 202
        next_turn = await session.next_turn_after(turn_id)
        assert_stop_events(session, turn_id)
        seen = await _next_turn_completes(session, upstream, next_turn)
        assert roles(seen) == ["user", "assistant", "tool", "user"]
        assert seen[2]["content"] == TOOL_INTERRUPTED_BY_USER
        starts = [e for e in session.events("user_message") if e["id"] == waiting["id"]]
        assert [s["turn_id"] for s in starts] == [None, next_turn]


# --- stops at the edges of a turn ------------------------------------------------------------------------
# A slow database write (SQLite under load: a WAL checkpoint, a busy disk) widens race windows that exist
# anyway, so these cases are deterministic. The wrappers only add a delay around the real write. The
# randomized test (test_random.py) ran into each of these without any delay, before a stop was made to
# take effect only between the recorder's writes (TurnRecorder.request_stop).


async def test_interrupt_posted_while_the_turn_ends_by_itself(
    server: LiveServer, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interrupt's row is written slowly (the session lock held) while the turn would finish on its
    own. The row and its events commit in one transaction of the write-behind, and the turn's own writes
    wait for it: the turn cannot end between the interrupt's row and its stop, so the stop lands, and the
    interrupting message starts the next turn."""
    original = repository.enqueue

    async def slow_enqueue(db: AsyncSession, row: QueuedMessageRow, new_id: Callable[[], str]) -> None:
        await asyncio.sleep(0.5)
        await original(db, row, new_id)

    monkeypatch.setattr(repository, "enqueue", slow_enqueue)
    upstream.enqueue(Script.text("Short answer.", chunks=3, delay=0.05), Script.text("Fresh answer."))
    async with open_session(server) as session:
        turn_id = await _start(session)
        await session.wait_type("text_delta")
        body = await session.accepted("and now?", "interrupt")
        assert (await session.turn_done(turn_id))["status"] == "cancelled"
        # The interrupting message must get its turn, and the session must not stay busy.
        await session.wait_idle(timeout=3)
        next_turn = session.events("turn_start")[-1]["turn_id"]
        assert body["turn_id"] in (None, next_turn)
        assert _taken(session, next_turn) == ["and now?"]
        await _next_turn_completes(session, upstream, next_turn)


async def test_cancel_with_clear_queue_while_the_turn_ends_by_itself(
    server: LiveServer, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """clear_queue withdraws (the session lock held) while the turn finishes on its own, then cancels."""
    original = repository.dequeue

    async def slow_dequeue(db: AsyncSession, message_ids: Sequence[str]) -> None:
        await asyncio.sleep(0.5)
        await original(db, message_ids)

    monkeypatch.setattr(repository, "dequeue", slow_dequeue)
    upstream.enqueue(Script.text("Short answer.", chunks=3, delay=0.05), Script.text("Fresh answer."))
    async with open_session(server) as session:
        turn_id = await _start(session)
        await session.wait_type("text_delta")
        waiting = await session.accepted("never mind", "queue")
        result = (await session.cancel(clear_queue=True)).json()
        assert [m["id"] for m in result["withdrawn"]] == [waiting["id"]]
        done = await session.turn_done(turn_id)
        monkeypatch.undo()
        # The session takes the next message at once...
        follow = await session.accepted("and now?")
        assert follow["queued"] is False, follow
        await _next_turn_completes(session, upstream, str(follow["turn_id"]))
        # ...and the 202/200 said what happened: a turn that completed by itself was not cancelled.
        assert result["cancelled"] is (done["status"] == "cancelled"), (result, done)


@pytest.mark.parametrize("ending", ["completed", "failed"])
async def test_cancel_while_the_turn_writes_its_end(
    server: LiveServer, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch, ending: str
) -> None:
    """A cancel that arrives while the turn writes its turn_done row (after a final answer or an error)."""
    original = repository.insert_messages

    async def slow_turn_done(
        db: AsyncSession, rows: Iterable[ChatMessageRow], new_id: Callable[[], str] | None = None
    ) -> dict[str, str]:
        rows = list(rows)
        if any(r.type == "turn_done" for r in rows):
            await asyncio.sleep(0.5)
        return await original(db, rows, new_id)

    monkeypatch.setattr(repository, "insert_messages", slow_turn_done)
    upstream.enqueue(Script.text("Quick answer.") if ending == "completed" else Script.error(400, "no"))
    upstream.enqueue(Script.text("Fresh answer."))
    async with open_session(server) as session:
        turn_id = await _start(session)
        await session.wait_type("response_done" if ending == "completed" else "error")
        response = await session.cancel()
        assert response.status_code in (200, 202), response.text
        await session.reader.wait_for(lambda e: e.event in ("turn_done", "agent_cancelled"))
        await asyncio.sleep(0.7)
        # Exactly one turn_done, in the stream and in the history, whatever its status.
        assert [e["turn_id"] for e in session.events("turn_done")] == [turn_id], session.types()
        dones = [m for m in await session.history() if m["type"] == "turn_done"]
        assert [m["turn_id"] for m in dones] == [turn_id]
        await session.wait_idle(timeout=3)


async def test_cancel_while_a_tool_start_is_written(
    server: LiveServer, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tool's row is durable, but the cancel reaches the recorder before it noted the call as started
    (the commit completes in aiosqlite's thread even when the task awaiting it is cancelled, and the
    session close after the commit is one more await)."""
    original = repository.insert_messages

    async def slow_ack(
        db: AsyncSession, rows: Iterable[ChatMessageRow], new_id: Callable[[], str] | None = None
    ) -> dict[str, str]:
        rows = list(rows)
        renamed = await original(db, rows, new_id)
        if any(r.type == "tool_group" and r.result is None for r in rows):
            await db.commit()
            await asyncio.sleep(0.5)
        return renamed

    monkeypatch.setattr(repository, "insert_messages", slow_ack)
    upstream.enqueue(
        Script.tool_calls([("call_calc", "calculate", '{"expression": "1+1"}')]), Script.text("Fresh answer.")
    )
    async with open_session(server) as session:
        turn_id = await _start(session)
        for _ in range(500):  # until the tool's row is durable
            if [m for m in await session.history() if m["type"] == "tool_group"]:
                break
            await asyncio.sleep(0.01)
        assert (await session.cancel()).status_code == 202
        await session.turn_done(turn_id)
        # Exactly one stored result for the call...
        groups = [m for m in await session.history() if m["type"] == "tool_group"]
        assert [(g["tool_call_id"], g["result"]) for g in groups] == [("call_calc", TOOL_INTERRUPTED_BY_USER)]
        # ...so the next turn's history is valid for a strict provider.
        follow = await session.accepted("and now?")
        await _next_turn_completes(session, upstream, str(follow["turn_id"]))


async def test_cancel_while_a_tool_result_is_written(
    server: LiveServer, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel that reaches the recorder while it writes a finished tool's result."""
    original = repository.update_message

    async def slow_result(db: AsyncSession, message_id: str, values: dict[str, Any]) -> None:
        if "result" in values and "duration_ms" in values:
            await asyncio.sleep(0.5)
        await original(db, message_id, values)

    monkeypatch.setattr(repository, "update_message", slow_result)
    upstream.enqueue(
        Script.tool_calls([("call_calc", "calculate", '{"expression": "1+1"}')]), Script.text("Fresh answer.")
    )
    async with open_session(server) as session:
        turn_id = await _start(session)
        await session.wait_type("tool_exec_start")
        await asyncio.sleep(0.1)
        response = await session.cancel()
        assert response.status_code == 202
        await session.turn_done(turn_id)
        cancelled = assert_stop_events(session, turn_id)
        [group] = [m for m in await session.history() if m["type"] == "tool_group"]
        # The call keeps exactly one stored result: its own ("2"), or the interrupted marker, then listed.
        assert group["result"] in ("2", TOOL_INTERRUPTED_BY_USER), group
        assert (group["result"] == TOOL_INTERRUPTED_BY_USER) is (
            cancelled["interrupted_tool_call_ids"] == ["call_calc"]
        )
        follow = await session.accepted("and now?")
        await _next_turn_completes(session, upstream, str(follow["turn_id"]))


def _taken(session: Session, turn_id: str) -> list[str]:
    return [
        e.data["text"]
        for e in session.turn_events(turn_id)
        if e.event == "user_message" and not e.data["queued"]
    ]


async def test_stop_after_the_model_asked_for_tools_before_they_start(
    server: LiveServer, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The response with two tool calls is complete and being recorded (its usage is being written); no
    tool has started. Both calls get the interrupted result, and the response's text is kept."""
    original = repository.add_usage
    # Set by the server's thread once the response is being recorded: the stop lands inside that write
    # however slowly a loaded machine gets there (a fixed sleep after the upstream's end did not).
    recording = threading.Event()

    async def slow_usage(*args: Any, **kwargs: Any) -> Any:
        recording.set()
        await asyncio.sleep(0.5)
        return await original(*args, **kwargs)

    monkeypatch.setattr(repository, "add_usage", slow_usage)
    upstream.enqueue(
        Script.tool_calls(
            [("call_a", "calculate", '{"expression": "1+1"}'), ("call_b", "current_time", "{}")],
            text_before="Two tools.",
        ),
        Script.text("Fresh answer."),
    )
    async with open_session(server) as session:
        turn_id = await _start(session)
        await request_number(upstream, 1)
        assert await asyncio.to_thread(recording.wait, 20), "the response was never recorded"
        _, body, next_turn = await _stop(session, "cancel", turn_id)
        cancelled = assert_stop_events(session, turn_id)
        assert cancelled["interrupted_tool_call_ids"] == ["call_a", "call_b"]
        _check_answer("cancel", body, cancelled)
        assert "tool_exec_start" not in [e.event for e in session.turn_events(turn_id)]
        monkeypatch.undo()

        seen = await _next_turn_completes(session, upstream, next_turn)
        history = await session.history()
        groups = [m for m in history if m["type"] == "tool_group"]
        assert [(g["tool_call_id"], g["result"], g["is_error"]) for g in groups] == [
            ("call_a", TOOL_INTERRUPTED_BY_USER, True),
            ("call_b", TOOL_INTERRUPTED_BY_USER, True),
        ]
        assert set(cancelled["interrupted_message_ids"]) >= {g["id"] for g in groups}
        assert roles(seen) == ["user", "assistant", "tool", "tool", "user"]
        streamed = "".join(e.data["text"] for e in session.turn_events(turn_id) if e.event == "text_delta")
        assert streamed == "Two tools."
        [text] = [m for m in history if m["type"] == "text" and m["role"] == "assistant"][:1]
        assert text["content"] == streamed, text
        assert seen[1]["content"] in (streamed, f"{streamed}\n\n{INTERRUPTED_MARK}")
