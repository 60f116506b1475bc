"""Turn ownership across real replica processes on one PostgreSQL database (issue 16, first half).

How each test proves its point: everything is read back from the database the replicas share (history
rows, event log, lease rows) or over HTTP, never from a replica's memory; the fake upstream is strict,
so every request a replica makes after a takeover proves the history it rebuilt is valid for a strict
provider; messages are counted by id, so a duplicate or a loss fails the test.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from app.turns.recorder.stop import TOOL_INTERRUPTED_BY_RESTART
from tests.fakes.upstream import FakeUpstream, Script, validate_history
from tests.interrupt.session import assert_strictly_valid, chat_requests
from tests.replicas.conftest import LEASE_SECONDS, Replicas, clients, rows, until
from tests.support.postgres import ScratchDatabase

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def new_session(client: httpx.AsyncClient, **body: Any) -> str:
    response = await client.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def post(client: httpx.AsyncClient, sid: str, content: str, **headers: str) -> dict[str, Any]:
    response = await client.post(f"/v1/sessions/{sid}/messages", json={"content": content}, headers=headers)
    assert response.status_code == 202, response.text
    data: dict[str, Any] = response.json()
    return data


def turn_status(pg: ScratchDatabase, turn_id: str) -> str | None:
    found = rows(pg, "SELECT status FROM chat_messages WHERE turn_id = %s AND type = 'turn_done'", turn_id)
    return str(found[0][0]) if found else None


def history(pg: ScratchDatabase, sid: str) -> list[dict[str, Any]]:
    names = ["id", "turn_id", "type", "role", "content", "result", "interrupted", "status", "tool_call_id"]
    found = rows(
        pg, f"SELECT {', '.join(names)} FROM chat_messages WHERE session_id = %s ORDER BY position", sid
    )
    return [dict(zip(names, row, strict=True)) for row in found]


def running_leases(pg: ScratchDatabase, sid: str) -> int:
    return int(
        rows(pg, "SELECT count(*) FROM turn_leases WHERE session_id = %s AND state = 'running'", sid)[0][0]
    )


def snapshot(pg: ScratchDatabase, sid: str) -> tuple[Any, ...]:
    events = rows(pg, "SELECT seq, type, data FROM events WHERE session_id = %s ORDER BY seq", sid)
    return (events, history(pg, sid), rows(pg, "SELECT * FROM turn_leases WHERE session_id = %s", sid))


async def streaming_started(pg: ScratchDatabase, turn_id: str) -> bool:
    found = rows(
        pg,
        "SELECT count(*) FROM chat_messages WHERE turn_id = %s"
        " AND type IN ('text', 'tool_group') AND role = 'assistant'",
        turn_id,
    )
    return int(found[0][0]) > 0


@pytest.mark.parametrize("where", ["mid_text", "mid_tool"])
async def test_kill_9_of_the_owner_a_survivor_closes_the_turn_and_takes_the_next_message(
    replicas: Replicas, pg: ScratchDatabase, upstream: FakeUpstream, where: str
) -> None:
    """kill -9 of the replica running a turn: a survivor closes it (interrupted, partial text kept and
    marked, the open tool call given the interrupted result) once the lease expires, then answers the
    message acknowledged meanwhile; each acknowledged message is in the history exactly once."""
    owner, survivor = await replicas(2)
    if where == "mid_text":
        upstream.enqueue(Script.words(3000, delay=0.01))
    else:
        upstream.enqueue(
            Script.tool_calls([("call_slow", "slow", json.dumps({"seconds": 60}))], text_before="Wait.")
        )
    upstream.enqueue(Script.text("Here is the rest."))
    async with clients(owner, survivor) as (a, b):
        sid = await new_session(a, tools=["slow"])
        first = await post(a, sid, "tell me a long story")
        turn_id = first["turn_id"]
        assert turn_id is not None
        if where == "mid_tool":
            await until(lambda: _tool_started(pg, turn_id))
        else:
            await until(lambda: streaming_started(pg, turn_id))
        second = await post(b, sid, "and then?")
        assert second["queued"] is True and second["turn_id"] is None  # the lease is the owner's
        await asyncio.to_thread(owner.kill)
        status = await until(lambda: _status(pg, turn_id), seconds=LEASE_SECONDS * 5)
        assert status == "interrupted"
        # The survivor takes the waiting message as the session's next turn.
        await until(lambda: _answered(pg, sid, second["id"]), seconds=30)
    found = history(pg, sid)
    users = [m["id"] for m in found if m["type"] == "text" and m["role"] == "user"]
    assert users == [first["id"], second["id"]]
    cut = [m for m in found if m["turn_id"] == turn_id and m["interrupted"]]
    if where == "mid_tool":
        assert [(m["type"], m["result"]) for m in cut] == [("tool_group", TOOL_INTERRUPTED_BY_RESTART)]
    else:
        assert [m["type"] for m in cut] == ["text"] and cut[0]["content"]
    assert [m["status"] for m in found if m["type"] == "turn_done"] == ["interrupted", "completed"]
    assert running_leases(pg, sid) == 0
    requests = chat_requests(upstream)
    assert len(requests) == 2
    assert_strictly_valid(upstream)
    assert validate_history(requests[1].body["messages"]) == []
    assert "closed turn" in survivor.log() and turn_id in survivor.log()


async def _tool_started(pg: ScratchDatabase, turn_id: str) -> bool:
    found = rows(pg, "SELECT count(*) FROM chat_messages WHERE turn_id = %s AND type = 'tool_group'", turn_id)
    return int(found[0][0]) > 0


async def _status(pg: ScratchDatabase, turn_id: str) -> str | None:
    return turn_status(pg, turn_id)


async def _answered(pg: ScratchDatabase, sid: str, message_id: str) -> bool:
    found = rows(pg, "SELECT turn_id FROM chat_messages WHERE id = %s", message_id)
    return bool(found) and turn_status(pg, str(found[0][0])) == "completed"


async def test_a_zombie_owner_writes_nothing_after_a_survivor_took_its_turn_over(
    replicas: Replicas, pg: ScratchDatabase, upstream: FakeUpstream
) -> None:
    """SIGSTOP the owner past its lease: a survivor takes the lease over (new token) and closes the turn.
    SIGCONT: the zombie's pending text and its stop's writes are refused by the fence (counted in its log),
    the database is byte-for-byte what the survivor left, and the zombie stops its model call. Its
    /metrics counts the refusals (parley_fenced_writes_total), the survivor's none."""
    owner, survivor = await replicas(2, PARLEY_METRICS="1")
    upstream.enqueue(Script.words(3000, delay=0.01))
    async with clients(owner, survivor) as (a, b):
        sid = await new_session(a)
        turn_id = (await post(a, sid, "tell me a long story"))["turn_id"]
        await until(lambda: streaming_started(pg, turn_id))
        owner.pause()
        assert await until(lambda: _status(pg, turn_id), seconds=LEASE_SECONDS * 5) == "interrupted"
        closed = snapshot(pg, sid)
        owner.resume()
        # Its heartbeat (a third of the lease) and its write-behind both run well within this.
        await until(
            lambda: _logged(owner.log(), "rejected write of turn " + turn_id), seconds=LEASE_SECONDS * 3
        )
        await asyncio.sleep(LEASE_SECONDS)
        after = snapshot(pg, sid)
        for part_after, part_closed in zip(after, closed, strict=True):
            assert [x for x in part_after if x not in part_closed] == []
        assert after == closed
        assert sum((await fenced_writes(a)).values()) > 0
        assert sum((await fenced_writes(b)).values()) == 0
    assert "lost its lease" in owner.log()
    [request] = chat_requests(upstream)
    await until(lambda: _true(request.disconnected), seconds=LEASE_SECONDS * 3)


async def fenced_writes(client: httpx.AsyncClient) -> dict[str, float]:
    """parley_fenced_writes_total from the replica's /metrics, by what was refused."""
    text = (await client.get("/metrics")).text
    prefix = "parley_fenced_writes_total{"
    return {
        line[len(prefix) :].split("}")[0]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


async def _logged(log: str, text: str) -> bool:
    return text in log


async def _true(value: bool) -> bool:
    return value


async def test_racing_posts_on_two_replicas_start_exactly_one_turn(
    replicas: Replicas, pg: ScratchDatabase, upstream: FakeUpstream
) -> None:
    """Messages posted to one idle session on two replicas at once: the database admits one running turn
    (the unique partial index); the other message waits in the line and is answered next. An
    Idempotency-Key retried on both replicas at once stores one message."""
    first, second = await replicas(2)
    upstream.enqueue(Script.words(200, delay=0.01), Script.text("second answer"), Script.text("third"))
    async with clients(first, second) as (a, b):
        sid = await new_session(a)
        answers = await asyncio.gather(post(a, sid, "one"), post(b, sid, "two"))
        started = [x for x in answers if x["turn_id"] is not None]
        assert len(started) == 1, answers
        assert running_leases(pg, sid) == 1
        waiting = next(x for x in answers if x["turn_id"] is None)
        await until(lambda: _answered(pg, sid, waiting["id"]), seconds=30)
        same = await asyncio.gather(
            post(a, sid, "once", **{"Idempotency-Key": "k-1"}),
            post(b, sid, "once", **{"Idempotency-Key": "k-1"}),
        )
        assert same[0]["id"] == same[1]["id"]
        await until(lambda: _answered(pg, sid, same[0]["id"]), seconds=30)
    users = [m["content"] for m in history(pg, sid) if m["type"] == "text" and m["role"] == "user"]
    assert sorted(users[:2]) == ["one", "two"] and users[2:] == ["once"]
    assert_strictly_valid(upstream)


async def test_a_post_to_an_idle_session_goes_behind_messages_already_waiting(
    replicas: Replicas, pg: ScratchDatabase, upstream: FakeUpstream
) -> None:
    """A message left waiting with no turn to take it (stored by a replica that died before taking it):
    a post to the idle session must not run before it. The post's claim checks the line in the statement
    that claims the lease (no read of the line before it): refused, the post goes behind and both are
    taken, in order. Whichever takes the waiting message first (this post, or a sweep that found it),
    history has it before the posted one, and each is answered exactly once."""
    [replica] = await replicas(1)
    upstream.enqueue(Script.text("first answer"), Script.text("second answer"))
    async with clients(replica) as (client,):
        sid = await new_session(client)
        with pg.connect() as conn:
            conn.execute(
                "INSERT INTO queued_messages (id, session_id, content, sender, timestamp, delivery)"
                " VALUES ('m_leftwaiting', %s, 'left waiting', 'User', '2026-01-01T00:00:00.000+00:00',"
                " 'queue')",
                (sid,),
            )
        posted = await post(client, sid, "posted")
        await until(lambda: _answered(pg, sid, posted["id"]), seconds=30)
    users = [m for m in history(pg, sid) if m["type"] == "text" and m["role"] == "user"]
    assert [m["content"] for m in users] == ["left waiting", "posted"], users
    assert rows(pg, "SELECT count(*) FROM queued_messages WHERE session_id = %s", sid) == [(0,)]
    assert_strictly_valid(upstream)


async def test_a_cancel_on_another_replica_reaches_the_owner_through_the_flag(
    replicas: Replicas, pg: ScratchDatabase, upstream: FakeUpstream
) -> None:
    """POST /cancel on a replica that does not run the turn: the durable flag is set on the lease, the owner
    reads it at its next heartbeat and stops the turn as a user's cancel (status cancelled, the model's
    connection closed), and the cancel's answer names the turn and what was cut."""
    owner, other = await replicas(2)
    upstream.enqueue(Script.words(3000, delay=0.01))
    async with clients(owner, other) as (a, b):
        sid = await new_session(a)
        turn_id = (await post(a, sid, "tell me a long story"))["turn_id"]
        await until(lambda: streaming_started(pg, turn_id))
        response = await b.post(f"/v1/sessions/{sid}/cancel", json={})
        assert response.status_code == 202, response.text
        result = response.json()
        assert (result["cancelled"], result["turn_id"]) == (True, turn_id)
        assert turn_status(pg, turn_id) == "cancelled"
        text = [m["id"] for m in history(pg, sid) if m["type"] == "text" and m["role"] == "assistant"]
        assert result["interrupted_message_ids"] == text
    [request] = chat_requests(upstream)
    await until(lambda: _true(request.disconnected), seconds=10)


async def test_a_replica_starting_while_a_turn_runs_elsewhere_leaves_it_alone(
    replicas: Replicas, pg: ScratchDatabase, upstream: FakeUpstream
) -> None:
    """A replica's startup recovery closes only turns no lease names: started while another replica runs a
    turn, it leaves that turn running (no turn_done, the lease still its owner's), and the turn then ends
    normally on its owner."""
    [owner] = await replicas(1)
    # Long enough (40 s) to outlast the late replica's start on a loaded machine (it took over 15 s there,
    # and the turn had ended before the replica came up).
    upstream.enqueue(Script.words(4000, delay=0.01))
    async with clients(owner) as (a,):
        sid = await new_session(a)
        turn_id = (await post(a, sid, "tell me a story"))["turn_id"]
        await until(lambda: streaming_started(pg, turn_id))
        owner_id = rows(pg, "SELECT owner FROM turn_leases WHERE turn_id = %s", turn_id)[0][0]
        [late] = await replicas(1)
        assert turn_status(pg, turn_id) is None
        assert rows(pg, "SELECT owner, state FROM turn_leases WHERE turn_id = %s", turn_id) == [
            (owner_id, "running")
        ]
        assert await until(lambda: _status(pg, turn_id), seconds=90) == "completed"
    assert "closed turn" not in late.log()
    assert_strictly_valid(upstream)
