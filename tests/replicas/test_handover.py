"""A turn whose replica is gone while it waits outside the service (a client tool's result, a person's
decision), or after a user asked to cancel it (issue 16): handed over, not lost.

How each test proves its point: the turn's rows and lease are read from the database the replicas share;
the answer goes to the survivor over HTTP and must be taken there (200, resolved) and reach the model
(the strict fake upstream's next request carries it, and every history it saw is valid); a cancel
flagged while the owner is frozen ends the turn as that cancel would have (cancelled, the call given the
user's interrupted result, one agent_cancelled), not as a crash would (interrupted).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from app.turns.recorder.stop import TOOL_INTERRUPTED_BY_USER
from tests.fakes.upstream import FakeUpstream, Script
from tests.interrupt.session import assert_strictly_valid, chat_requests
from tests.replicas.conftest import LEASE_SECONDS, Replicas, clients, rows, until
from tests.replicas.test_ownership import history, running_leases, turn_status
from tests.support.postgres import ScratchDatabase
from tests.tool_requests.helpers import LOCATION, calls

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

# A lease far longer than any wait below: a takeover within it can only come from the lease let go.
LONG_LEASE = "120"


async def waiting_session(
    client: httpx.AsyncClient, pg: ScratchDatabase, upstream: FakeUpstream
) -> tuple[str, str]:
    """A session whose turn waits for the browser's get_location: (session id, turn id)."""
    upstream.enqueue(calls(("call_loc", "get_location", '{"precise": true}'), text="Let me look."))
    upstream.enqueue(Script.text("You are in Paris."))
    created = await client.post("/v1/sessions", json={"client_tools": [LOCATION]})
    assert created.status_code == 201, created.text
    sid = str(created.json()["id"])
    posted = await client.post(f"/v1/sessions/{sid}/messages", json={"content": "where am I?"})
    assert posted.status_code == 202, posted.text
    turn_id = str(posted.json()["turn_id"])
    await until(lambda: _waiting(pg, turn_id), seconds=60)
    return sid, turn_id


async def _waiting(pg: ScratchDatabase, turn_id: str) -> bool:
    found = rows(
        pg, "SELECT count(*) FROM pending_tool_requests WHERE turn_id = %s AND state = 'pending'", turn_id
    )
    return int(found[0][0]) == 1


def owner_of(pg: ScratchDatabase, turn_id: str) -> str:
    return str(rows(pg, "SELECT owner FROM turn_leases WHERE turn_id = %s", turn_id)[0][0])


async def answered_on(
    client: httpx.AsyncClient, pg: ScratchDatabase, sid: str, turn_id: str
) -> dict[str, Any]:
    response = await client.post(
        f"/v1/sessions/{sid}/tool_results",
        json={"results": [{"tool_call_id": "call_loc", "output": "Paris"}]},
    )
    assert response.status_code == 200, response.text
    await until(lambda: _status(pg, turn_id), seconds=30)
    body: dict[str, Any] = response.json()
    return body


async def _status(pg: ScratchDatabase, turn_id: str) -> str | None:
    return turn_status(pg, turn_id)


def assert_resumed_with_the_answer(
    pg: ScratchDatabase, upstream: FakeUpstream, sid: str, turn_id: str
) -> None:
    assert turn_status(pg, turn_id) == "completed"
    requests = chat_requests(upstream)
    assert len(requests) == 2  # the call before the handover, the answer's after it: nothing run twice
    tool = [m for m in requests[1].body["messages"] if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in tool] == [("call_loc", "Paris")]
    assert_strictly_valid(upstream)
    users = [m for m in history(pg, sid) if m["type"] == "text" and m["role"] == "user"]
    assert len(users) == 1
    assert running_leases(pg, sid) == 0


async def test_a_turn_waiting_for_a_client_tool_is_resumed_by_a_survivor_of_a_kill_9(
    replicas: Replicas, pg: ScratchDatabase, upstream: FakeUpstream
) -> None:
    """kill -9 of the owner while its turn waits: once the lease expires a survivor takes it over and the
    turn waits there (same request); the result posted to the survivor resumes it to its end."""
    owner, survivor = await replicas(2)
    async with clients(owner, survivor) as (a, b):
        sid, turn_id = await waiting_session(a, pg, upstream)
        first_owner = owner_of(pg, turn_id)
        await asyncio.to_thread(owner.kill)
        await until(lambda: _taken_over(pg, turn_id, first_owner), seconds=LEASE_SECONDS * 10)
        pending = (await b.get(f"/v1/sessions/{sid}/pending")).json()["pending"]
        assert [p["tool_call_id"] for p in pending] == ["call_loc"]
        body = await answered_on(b, pg, sid, turn_id)
    assert body["resolved"] == [{"tool_call_id": "call_loc", "resolution": "answered", "replayed": False}]
    assert_resumed_with_the_answer(pg, upstream, sid, turn_id)
    assert "took over turn" in survivor.log() and turn_id in survivor.log()


async def _taken_over(pg: ScratchDatabase, turn_id: str, first_owner: str) -> bool:
    return owner_of(pg, turn_id) != first_owner


async def test_sigterm_while_a_turn_waits_hands_it_over_without_waiting_out_the_lease(
    replicas: Replicas, pg: ScratchDatabase, upstream: FakeUpstream
) -> None:
    """SIGTERM of the owner (a rolling deploy) while its turn waits: the turn is not closed, its lease is
    let go, and the survivor's next sweep takes it over, long before the 120 s lease would have ended;
    the answer posted to the survivor resumes it."""
    owner, survivor = await replicas(2, PARLEY_LEASE_SECONDS=LONG_LEASE, PARLEY_HEARTBEAT_INTERVAL="1")
    async with clients(owner, survivor) as (a, b):
        sid, turn_id = await waiting_session(a, pg, upstream)
        first_owner = owner_of(pg, turn_id)
        await asyncio.to_thread(owner.terminate)
        assert turn_status(pg, turn_id) is None  # not closed: it waits on
        await until(lambda: _taken_over(pg, turn_id, first_owner), seconds=30)
        await answered_on(b, pg, sid, turn_id)
    assert_resumed_with_the_answer(pg, upstream, sid, turn_id)


async def test_a_cancel_flagged_while_the_owner_is_frozen_closes_the_turn_as_cancelled(
    replicas: Replicas, pg: ScratchDatabase, upstream: FakeUpstream
) -> None:
    """The owner is frozen (SIGSTOP) mid-tool when a cancel reaches the other replica: the flag is set, and
    once the lease expires the survivor closes the turn as the user's cancel would have (cancelled, the
    call given the user's interrupted result), and the cancel's answer says so."""
    owner, survivor = await replicas(2)
    upstream.enqueue(
        Script.tool_calls([("call_slow", "slow", json.dumps({"seconds": 60}))], text_before="Wait.")
    )
    async with clients(owner, survivor) as (a, b):
        created = await a.post("/v1/sessions", json={"tools": ["slow"]})
        sid = str(created.json()["id"])
        posted = await a.post(f"/v1/sessions/{sid}/messages", json={"content": "take your time"})
        turn_id = str(posted.json()["turn_id"])
        await until(lambda: _tool_row(pg, turn_id), seconds=60)
        owner.pause()
        try:
            response = await b.post(f"/v1/sessions/{sid}/cancel", json={})
        finally:
            await asyncio.to_thread(owner.kill)
    assert response.status_code == 202, response.text
    result = response.json()
    assert (result["cancelled"], result["turn_id"]) == (True, turn_id)
    assert turn_status(pg, turn_id) == "cancelled"
    [tool] = [m for m in history(pg, sid) if m["type"] == "tool_group"]
    assert (tool["result"], tool["interrupted"]) == (TOOL_INTERRUPTED_BY_USER, True)
    assert result["interrupted_tool_call_ids"] == ["call_slow"]
    cancels = rows(pg, "SELECT count(*) FROM events WHERE session_id = %s AND type = 'agent_cancelled'", sid)
    assert cancels[0][0] == 1
    assert "cancelled, as its flag asked" in survivor.log()


async def _tool_row(pg: ScratchDatabase, turn_id: str) -> bool:
    found = rows(pg, "SELECT count(*) FROM chat_messages WHERE turn_id = %s AND type = 'tool_group'", turn_id)
    return int(found[0][0]) > 0
