"""Answers racing for one waiting call across two replicas (issue 31 §5): twenty identical requests at
once, half to the replica that runs the turn and half to the other, get one fresh answer and nineteen
replays of it, for a client tool's result and for an approval; the turn resumes once, with that answer."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.fakes.upstream import FakeUpstream, Script
from tests.interrupt.session import assert_strictly_valid
from tests.replicas.conftest import Replicas, clients, rows, until
from tests.replicas.test_ownership import history, new_session, turn_status
from tests.support.postgres import ScratchDatabase
from tests.tool_requests.helpers import LOCATION, calls

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

RACERS = 20


async def _waits(pg: ScratchDatabase, turn_id: str) -> bool:
    found = rows(
        pg, "SELECT count(*) FROM pending_tool_requests WHERE turn_id = %s AND state = 'pending'", turn_id
    )
    return int(found[0][0]) == 1


async def _waiting_turn(client: httpx.AsyncClient, pg: ScratchDatabase, sid: str) -> str:
    posted = await client.post(f"/v1/sessions/{sid}/messages", json={"content": "go"})
    assert posted.status_code == 202, posted.text
    turn_id = str(posted.json()["turn_id"])
    await until(lambda: _waits(pg, turn_id), seconds=60)
    return turn_id


async def _race(
    pair: tuple[httpx.AsyncClient, httpx.AsyncClient], path: str, body: dict[str, Any]
) -> list[tuple[int, dict[str, Any]]]:
    async def one(client: httpx.AsyncClient) -> tuple[int, dict[str, Any]]:
        response = await client.post(path, json=body)
        return response.status_code, response.json()

    return list(await asyncio.gather(*(one(pair[i % 2]) for i in range(RACERS))))


def _one_fresh_rest_replayed(answers: list[tuple[int, dict[str, Any]]], resolution: str) -> None:
    assert [status for status, _ in answers] == [200] * RACERS, answers
    resolved = [body["resolved"] for _, body in answers]
    assert all(len(r) == 1 and r[0]["resolution"] == resolution for r in resolved), resolved
    assert sorted(r[0]["replayed"] for r in resolved) == [False] + [True] * (RACERS - 1), resolved


async def _completed(pg: ScratchDatabase, turn_id: str) -> bool:
    return turn_status(pg, turn_id) == "completed"


async def test_identical_answers_racing_on_two_replicas_get_one_fresh_answer_and_replays(
    replicas: Replicas, pg: ScratchDatabase, upstream: FakeUpstream
) -> None:
    a_replica, b_replica = await replicas(2)
    upstream.enqueue(calls(("call_loc", "get_location", "{}")), Script.text("You are in Paris."))
    upstream.enqueue(calls(("call_c", "calculate", '{"expression": "6*7"}')), Script.text("It is 42."))
    async with clients(a_replica, b_replica) as (a, b):
        located = await new_session(a, client_tools=[LOCATION])
        turn_id = await _waiting_turn(a, pg, located)
        result = {"results": [{"tool_call_id": "call_loc", "output": "Paris"}]}
        answers = await _race((a, b), f"/v1/sessions/{located}/tool_results", result)
        _one_fresh_rest_replayed(answers, "answered")
        await until(lambda: _completed(pg, turn_id), seconds=30)

        guarded = await new_session(a, tools=["calculate"], approval=["calculate"])
        turn_id = await _waiting_turn(a, pg, guarded)
        decision = {"decisions": [{"tool_call_id": "call_c", "decision": "approve"}]}
        answers = await _race((b, a), f"/v1/sessions/{guarded}/approvals", decision)
        _one_fresh_rest_replayed(answers, "approve")
        await until(lambda: _completed(pg, turn_id), seconds=30)
    assert_strictly_valid(upstream)
    for sid, stored in ((located, "Paris"), (guarded, "42")):
        assert [m["result"] for m in history(pg, sid) if m["type"] == "tool_group"] == [stored]


async def test_an_answer_the_owner_refuses_gets_the_same_error_on_either_replica(
    replicas: Replicas, pg: ScratchDatabase, upstream: FakeUpstream
) -> None:
    """The owner's refusal crosses replicas as its code (issue 32): the other replica answers the status,
    body and headers the owner itself answers, and nothing of the answer is taken."""
    a_replica, b_replica = await replicas(2)
    upstream.enqueue(calls(("call_loc", "get_location", "{}")), Script.text("You are in Paris."))
    async with clients(a_replica, b_replica) as (a, b):
        sid = await new_session(a, client_tools=[LOCATION])
        turn_id = await _waiting_turn(a, pg, sid)
        twice = {"tool_call_id": "call_loc", "output": "Paris"}
        path = f"/v1/sessions/{sid}/tool_results"
        seen = []
        for client in (a, b):  # a runs the turn; b asks it over the control channel
            refused = await client.post(path, json={"results": [twice, twice]})
            error = refused.json()["error"]
            assert error.pop("request_id")
            seen.append((refused.status_code, error, refused.headers.get("retry-after")))
        assert seen[0] == seen[1], seen
        assert seen[0][0] == 422 and seen[0][1]["code"] == "invalid_answer", seen
        assert await _waits(pg, turn_id)  # nothing taken: the call still waits
        answered = await b.post(path, json={"results": [twice]})
        assert answered.status_code == 200, answered.text
        await until(lambda: _completed(pg, turn_id), seconds=30)
