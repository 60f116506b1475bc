"""A cancel sent to a replica that does not run the turn (issue 16): durable first (the flag on the turn's
lease, committed before anything is broadcast), then fast (the broadcast its owner hears), and the turn
is stopped exactly once whichever reaches the owner first, or both.

How it is proven: the lease row shows the flag, the event log the one agent_cancelled and the turn's
end, the fake upstream the model's connection closed; an owner that cannot reach Redis neither hears the
broadcast nor can answer it, and the cancel is still answered as soon as its flag stopped the turn.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from app.turns.replicas.turns import CONTROL_TIMEOUT
from tests.fakes.upstream import FakeUpstream, Script
from tests.interrupt.session import chat_requests
from tests.replicas.conftest import LEASE_SECONDS, UNREACHABLE_REDIS_URL, Replicas, clients, rows, until
from tests.replicas.test_ownership import history, new_session, post, streaming_started, turn_status
from tests.support.postgres import ScratchDatabase
from tests.support.redis import require_redis

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def _cancels(pg: ScratchDatabase, sid: str) -> list[str]:
    found = rows(
        pg, "SELECT data FROM events WHERE session_id = %s AND type = 'agent_cancelled' ORDER BY seq", sid
    )
    return [json.loads(data)["turn_id"] for (data,) in found]


def _flagged(pg: ScratchDatabase, turn_id: str) -> list[tuple[Any, ...]]:
    return rows(pg, "SELECT cancel_requested, state FROM turn_leases WHERE turn_id = %s", turn_id)


async def _disconnected(upstream: FakeUpstream) -> bool:
    return chat_requests(upstream)[0].disconnected


async def test_a_broadcast_cancel_is_flagged_first_and_stops_the_turn_once(
    replicas: Replicas, pg: ScratchDatabase, upstream: FakeUpstream
) -> None:
    """Both replicas reach Redis: the owner hears the broadcast and answers, and its next heartbeat also
    reads the flag set before it. The turn ends cancelled with one agent_cancelled, and the answer is
    the owner's (the turn and its cut text named)."""
    require_redis()
    owner, other = await replicas(2)
    upstream.enqueue(Script.words(3000, delay=0.01))
    async with clients(owner, other) as (a, b):
        sid = await new_session(a)
        turn_id = (await post(a, sid, "tell me a long story"))["turn_id"]
        await until(lambda: streaming_started(pg, turn_id))
        response = await b.post(f"/v1/sessions/{sid}/cancel", json={})
        assert response.status_code == 202, response.text
        result = response.json()
        await until(lambda: _disconnected(upstream), seconds=10)
        # Three heartbeats (a third of the lease each) after the answer: the flag was read, and ignored.
        await asyncio.sleep(LEASE_SECONDS)
    assert (result["cancelled"], result["turn_id"]) == (True, turn_id)
    text = [m["id"] for m in history(pg, sid) if m["type"] == "text" and m["role"] == "assistant"]
    assert result["interrupted_message_ids"] == text
    assert turn_status(pg, turn_id) == "cancelled"
    assert _flagged(pg, turn_id) == [(True, "done")]
    assert _cancels(pg, sid) == [turn_id]


async def test_a_cancel_whose_owner_cannot_hear_or_answer_lands_through_the_flag(
    replicas: Replicas, pg: ScratchDatabase, upstream: FakeUpstream
) -> None:
    """The owner cannot reach Redis: the broadcast is lost, so is any reply. The cancel still stops the
    turn once (its owner reads the flag at its next heartbeat), and the replica that took the cancel
    answers with what the flag did as soon as the turn has ended, not after waiting out the broadcast's
    timeout."""
    require_redis()
    [owner] = await replicas(1, PARLEY_REDIS_URL=UNREACHABLE_REDIS_URL)
    [other] = await replicas(1)
    upstream.enqueue(Script.words(3000, delay=0.01))
    async with clients(owner, other) as (a, b):
        sid = await new_session(a)
        turn_id = (await post(a, sid, "tell me a long story"))["turn_id"]
        await until(lambda: streaming_started(pg, turn_id))
        asked = time.monotonic()
        response = await b.post(f"/v1/sessions/{sid}/cancel", json={})
        answered = time.monotonic() - asked
        assert response.status_code == 202, response.text
        result = response.json()
        await until(lambda: _disconnected(upstream), seconds=10)
    assert (result["cancelled"], result["turn_id"]) == (True, turn_id)
    text = [m["id"] for m in history(pg, sid) if m["type"] == "text" and m["role"] == "assistant"]
    assert result["interrupted_message_ids"] == text
    assert turn_status(pg, turn_id) == "cancelled"
    assert _cancels(pg, sid) == [turn_id]
    # Not a timing claim: the answer followed the turn's end, not the broadcast's unanswered timeout.
    assert answered < CONTROL_TIMEOUT
