"""Steer and interrupt posted on a replica that does not run the session's turn (issue 16): the owner
acts on them as it does on messages posted to it, whether the posting replica reaches it through Redis
(a notice on the control channel) or not (the owner reads its waiting line at each heartbeat).

How it is proven: the strict fake upstream records what the model was sent (so a steer taken at the
breakpoint shows as a second request that ends with the steer, and no third one), and the event log and
history rows of the database both replicas share say how each turn ended and that the owner announced
its cancel once.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.fakes.upstream import FakeUpstream, Script
from tests.interrupt.session import assert_strictly_valid, chat_requests, roles
from tests.replicas.conftest import UNREACHABLE_REDIS_URL, Replicas, clients, rows, until
from tests.replicas.test_ownership import history, new_session, streaming_started, turn_status
from tests.support.postgres import ScratchDatabase
from tests.support.redis import require_redis

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def _tool_started(pg: ScratchDatabase, turn_id: str) -> bool:
    found = rows(pg, "SELECT count(*) FROM chat_messages WHERE turn_id = %s AND type = 'tool_group'", turn_id)
    return int(found[0][0]) > 0


async def _answered(pg: ScratchDatabase, message_id: str) -> str | None:
    """The status of the turn that took the message, once that turn ended."""
    found = rows(pg, "SELECT turn_id FROM chat_messages WHERE id = %s", message_id)
    return turn_status(pg, str(found[0][0])) if found else None


def _logged(pg: ScratchDatabase, sid: str, type_: str) -> list[dict[str, Any]]:
    found = rows(pg, "SELECT data FROM events WHERE session_id = %s AND type = %s ORDER BY seq", sid, type_)
    return [json.loads(data) for (data,) in found]


async def test_a_steer_posted_where_redis_is_unreachable_is_taken_at_the_owners_next_breakpoint(
    replicas: Replicas, pg: ScratchDatabase, upstream: FakeUpstream
) -> None:
    """The turn runs on A, inside a four-second tool call; the steer goes to B, which cannot reach Redis
    (so no notice reaches A). A reads it at a heartbeat and ends its turn at the breakpoint after the
    tool round, as one process does: the model is not called again for the old turn, and the next turn
    sends it the history with the tool's result and then the steer."""
    [owner] = await replicas(1)
    [cut_off] = await replicas(1, PARLEY_REDIS_URL=UNREACHABLE_REDIS_URL)
    upstream.enqueue(
        Script.tool_calls([("call_slow", "slow", json.dumps({"seconds": 4}))], text_before="Working on it."),
        Script.text("Steered answer."),
    )
    async with clients(owner, cut_off) as (a, b):
        sid = await new_session(a, tools=["slow"])
        first = (await a.post(f"/v1/sessions/{sid}/messages", json={"content": "go"})).json()
        await until(lambda: _tool_started(pg, first["turn_id"]))
        response = await b.post(
            f"/v1/sessions/{sid}/messages", json={"content": "change of plan", "delivery": "steer"}
        )
        assert response.status_code == 202, response.text
        steer = response.json()
        assert (steer["queued"], steer["turn_id"]) == (True, None)
        assert await until(lambda: _answered(pg, steer["id"]), seconds=30) == "completed"
    assert turn_status(pg, first["turn_id"]) == "completed"
    requests = chat_requests(upstream)
    assert len(requests) == 2
    seen = requests[1].body["messages"]
    assert roles(seen) == ["user", "assistant", "tool", "user"]
    assert seen[2]["content"] == "waited 4.0 s"
    assert seen[3] == {"role": "user", "content": "change of plan"}
    assert_strictly_valid(upstream)
    old = [m["type"] for m in history(pg, sid) if m["turn_id"] == first["turn_id"]]
    assert old == ["turn_start", "text", "text", "tool_group", "turn_done"]


async def test_an_interrupt_posted_on_another_replica_stops_the_owners_turn_and_starts_the_message(
    replicas: Replicas, pg: ScratchDatabase, upstream: FakeUpstream
) -> None:
    """The turn streams a long answer on A; an interrupt goes to B. A stops its turn as a user's stop
    (cancelled, one agent_cancelled, the partial text kept and marked, the model's connection closed)
    and its end starts the interrupt as the next turn; B answers, as one process does, with that turn."""
    require_redis()
    owner, other = await replicas(2)
    upstream.enqueue(Script.words(3000, delay=0.01), Script.text("Interrupted, answering."))
    async with clients(owner, other) as (a, b):
        sid = await new_session(a)
        first = (await a.post(f"/v1/sessions/{sid}/messages", json={"content": "tell me a story"})).json()
        await until(lambda: streaming_started(pg, first["turn_id"]))
        response = await b.post(
            f"/v1/sessions/{sid}/messages", json={"content": "stop that", "delivery": "interrupt"}
        )
        assert response.status_code == 202, response.text
        body = response.json()
        assert await until(lambda: _answered(pg, body["id"]), seconds=30) == "completed"
    assert (body["queued"], body["delivery"]) == (False, "interrupt")
    assert body["turn_id"] not in (None, first["turn_id"])
    assert turn_status(pg, first["turn_id"]) == "cancelled"
    assert [e["turn_id"] for e in _logged(pg, sid, "agent_cancelled")] == [first["turn_id"]]
    assert [e["turn_id"] for e in _logged(pg, sid, "turn_start")] == [first["turn_id"], body["turn_id"]]
    requests = chat_requests(upstream)
    assert len(requests) == 2 and requests[0].disconnected
    seen = requests[1].body["messages"]
    assert roles(seen) == ["user", "assistant", "user"]
    assert seen[1]["content"].endswith("[interrupted]")
    assert seen[2] == {"role": "user", "content": "stop that"}
    assert_strictly_valid(upstream)
