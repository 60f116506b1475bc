"""Answers racing for one waiting call, over a real socket: twenty identical requests at once get one fresh
answer and nineteen replays of it (a client that retries after a timeout is told its answer was taken),
whether they reach the turn while it waits, while the approved call runs, between its rounds or after it
ended; a different answer racing them gets the conflict. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.fakes.upstream import FakeUpstream, Script
from tests.interrupt.session import Session, open_session
from tests.support.server import LiveServer
from tests.support.slow_tool import SlowTool
from tests.tool_requests.helpers import LOCATION, awaiting, calls, tool_rows

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

RACERS = 20


Answered = tuple[int, dict[str, Any]]


async def race(session: Session, route: str, bodies: list[dict[str, Any]]) -> list[Answered]:
    """Every body posted at once, each on a connection of its own."""

    async def one(body: dict[str, Any]) -> Answered:
        response = await session.client.post(f"{session.base}/{route}", json=body)
        return response.status_code, response.json()

    return list(await asyncio.gather(*(one(body) for body in bodies)))


def assert_one_fresh_rest_replayed(answers: list[Answered], resolution: str) -> None:
    assert [status for status, _ in answers] == [200] * len(answers), answers
    resolved = [body["resolved"] for _, body in answers]
    assert all(len(r) == 1 and r[0]["resolution"] == resolution for r in resolved), resolved
    assert sorted(r[0]["replayed"] for r in resolved) == [False] + [True] * (len(answers) - 1), resolved


async def test_identical_approvals_racing_get_one_fresh_answer_and_replays(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(calls(("call_c", "calculate", '{"expression": "6*7"}')), Script.text("It is 42."))
    async with open_session(server, tools=["calculate"], approval=["calculate"]) as session:
        posted = await session.accepted("what is 6*7?")
        await awaiting(session, "approval_requested")
        decision = {"decisions": [{"tool_call_id": "call_c", "decision": "approve"}]}
        answers = await race(session, "approvals", [decision] * RACERS)
        assert_one_fresh_rest_replayed(answers, "approve")
        assert (await session.turn_done(posted["turn_id"]))["status"] == "completed"
        # After the turn's end, too: the same answer is a replay, another one the conflict.
        answers = await race(session, "approvals", [decision] * 3)
        assert all(status == 200 and body["resolved"][0]["replayed"] for status, body in answers), answers
        other = {"decisions": [{"tool_call_id": "call_c", "decision": "reject"}]}
        status, body = (await race(session, "approvals", [other]))[0]
        assert (status, body["error"]["code"]) == (409, "answer_conflict")
        [row] = tool_rows(await session.history())
    assert (row["decision"], row["result"]) == ("approve", "42")
    assert len(session.events("approval_resolved")) == 1


async def test_identical_approvals_racing_while_the_approved_call_runs(
    server: LiveServer, upstream: FakeUpstream, slow_tool: SlowTool
) -> None:
    """The approved call runs long (the slow tool): the replays do not wait for it."""
    upstream.enqueue(calls(("call_s", "slow", '{"gate": "g"}')), Script.text("Done."))
    async with open_session(server, tools=["slow"], approval=["slow"]) as session:
        posted = await session.accepted("go slowly")
        await awaiting(session, "approval_requested")
        decision = {"decisions": [{"tool_call_id": "call_s", "decision": "approve"}]}
        answers = await race(session, "approvals", [decision] * RACERS)
        assert_one_fresh_rest_replayed(answers, "approve")
        # Every answer came while the tool still ran: none waited for the round to end.
        assert (await session.info())["running_turn_id"] == posted["turn_id"]
        assert session.events("turn_done") == []
        slow_tool.release("g")
        assert (await session.turn_done(posted["turn_id"]))["status"] == "completed"


async def test_identical_client_results_racing_get_one_fresh_answer_and_replays(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(calls(("call_loc", "get_location", "{}")), Script.text("You are in Paris."))
    async with open_session(server, client_tools=[LOCATION]) as session:
        posted = await session.accepted("where am I?")
        await awaiting(session, "client_tool_requested")
        result = {"results": [{"tool_call_id": "call_loc", "output": {"city": "Paris"}}]}
        answers = await race(session, "tool_results", [result] * RACERS)
        assert_one_fresh_rest_replayed(answers, "answered")
        assert (await session.turn_done(posted["turn_id"]))["status"] == "completed"
        [row] = tool_rows(await session.history())
    assert row["result"] == '{"city": "Paris"}'
    assert len(session.events("client_tool_resolved")) == 1


async def test_a_different_answer_racing_identical_ones_gets_the_conflict(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(calls(("call_loc", "get_location", "{}")), Script.text("You are somewhere."))
    async with open_session(server, client_tools=[LOCATION]) as session:
        posted = await session.accepted("where am I?")
        await awaiting(session, "client_tool_requested")
        paris = {"results": [{"tool_call_id": "call_loc", "output": "Paris"}]}
        rome = {"results": [{"tool_call_id": "call_loc", "output": "Rome"}]}
        answers = await race(session, "tool_results", [paris] * 10 + [rome] * 10)
        await session.turn_done(posted["turn_id"])
        [row] = tool_rows(await session.history())
    winner = paris if row["result"] == "Paris" else rome
    taken = [a for a, body in zip(answers, [paris] * 10 + [rome] * 10, strict=True) if body is winner]
    refused = [a for a, body in zip(answers, [paris] * 10 + [rome] * 10, strict=True) if body is not winner]
    assert_one_fresh_rest_replayed(taken, "answered")
    assert [(status, body["error"]["code"]) for status, body in refused] == [(409, "answer_conflict")] * 10
