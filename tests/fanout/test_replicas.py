"""Two replica processes on one PostgreSQL database and one Redis (tests/fanout/conftest.py): a session's
stream on one replica and its turn on the other, clients hopping between them, a stop, a wait and a
delete sent to the replica that does not run the turn. Every stream is compared with the event log the
database holds: byte for byte, contiguous from its position, nothing twice."""

from __future__ import annotations

import asyncio
import random
import time

import httpx
import pytest

from app.turns.replicas.turns import CONTROL_TIMEOUT, ReplicaTurns
from tests.fakes.directive import bench_content
from tests.fakes.record import RecordedRequest
from tests.fakes.upstream import Script
from tests.fanout.conftest import Cluster
from tests.support.client import new_session, post
from tests.support.stream import Frame, StreamClient, assert_contiguous

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

# Class under test, reached over HTTP (the replicas run it in their own processes).
__all__ = ["ReplicaTurns"]


async def disconnected(cluster: Cluster, tag: str) -> RecordedRequest:
    """The upstream request of the `[bench tag=...]` message, once its client (a replica) closed it."""
    return await cluster.upstream.await_request(lambda r: r.tag == tag and r.disconnected, within=5.0)


def as_log(frames: list[Frame]) -> list[tuple[int, str, str]]:
    return [(f.id, f.event, f.data) for f in frames]


async def test_a_stream_on_one_replica_gets_the_turn_run_on_the_other_as_logged(cluster: Cluster) -> None:
    """The stream on A, the POST on B (the turn runs on B: B's live status names it, A's does not): A's
    stream gets every event, ids contiguous from 1, each frame byte-identical to its row in the event log
    and to B's own replay of the log (GET events after=0)."""
    a, b = cluster.clients()
    async with a, b:
        sid = await new_session(b)
        watcher = StreamClient(a, sid)
        opened = asyncio.Event()
        reading = asyncio.create_task(watcher.read(watcher.turns_done(1), seconds=60, opened=opened))
        await opened.wait()
        accepted = await post(b, sid, bench_content("one", chunks=80, delay_ms=10))
        running_on_b = (await b.get(f"/v1/sessions/{sid}")).json()["running_turn_id"]
        assert await reading == "matched"
        replay = StreamClient(b, sid)
        assert await replay.read(params={"after": "0", "until_idle": "true"}, seconds=30) == "ended"
    assert running_on_b == accepted["turn_id"]
    assert_contiguous(watcher.frames)
    assert watcher.of_type("turn_done")[0]["turn_id"] == accepted["turn_id"]
    assert sum(f.event == "text_delta" for f in watcher.frames) >= 40
    assert as_log(watcher.frames) == cluster.logged(sid)
    assert as_log(replay.frames) == as_log(watcher.frames)


async def hop(stream: StreamClient, replicas: list[httpx.AsyncClient], rng: random.Random, turns: int) -> int:
    """Reads a little on one replica, drops the connection, resumes (Last-Event-ID) on a random replica,
    until the stream showed `turns` turn ends; returns how many connections it made. A stream with no
    position yet first reads live until its first frame (without a position a reconnect starts live)."""
    if stream.last_id is None:
        await stream.read(lambda _: True, seconds=60)
    while stream.types().count("turn_done") < turns:
        stream.client = rng.choice(replicas)
        await stream.read(stream.turns_done(turns), seconds=rng.uniform(0.05, 0.4))
    return stream.connects


async def test_subscribers_hopping_between_replicas_during_long_turns_miss_nothing(cluster: Cluster) -> None:
    """Two sessions, one answered by A and one by B, each a long streamed answer; three subscribers per
    session drop their connection every 50-400 ms and resume on a random replica with Last-Event-ID (one
    from the start, two from live). Each ends with exactly the log's frames from its first position on:
    contiguous, byte-identical, none twice, whichever replica served each piece."""
    rng = random.Random(16)
    a, b = cluster.clients()
    async with a, b:
        replicas = [a, b]
        sessions = [await new_session(a), await new_session(b)]
        streams = {
            sid: [StreamClient(a, sid), StreamClient(b, sid), StreamClient(a, sid)] for sid in sessions
        }
        for sid in sessions:
            # A position of 0 (as if it had seen a frame 0): its first connection replays the whole log.
            streams[sid][0].frames.append(Frame(0, "position", ""))
        hopping = asyncio.gather(*(hop(s, replicas, rng, 1) for sid in sessions for s in streams[sid]))
        await asyncio.sleep(0.3)
        for sid, owner in zip(sessions, replicas, strict=True):
            await post(owner, sid, bench_content(f"hop-{sid}", chunks=250, delay_ms=8))
        connects = await asyncio.wait_for(hopping, 90)
    assert min(connects) >= 4
    for sid in sessions:
        log = cluster.logged(sid)
        for stream in streams[sid]:
            frames = [f for f in stream.frames if f.id > 0]
            assert frames, "a subscriber got nothing"
            assert_contiguous(frames, first=frames[0].id)
            assert as_log(frames) == log[frames[0].id - 1 : frames[-1].id]
            assert frames[-1].event == "turn_done"
        assert as_log(streams[sid][0].frames[1:]) == log


async def test_a_stop_sent_to_the_other_replica_reaches_the_upstream(cluster: Cluster) -> None:
    """The turn runs on B, the cancel goes to A: A answers with B's result (the turn stopped, its partial
    text named), the upstream sees its connection closed within a second of the cancel, and A's stream
    shows the turn end as cancelled."""
    a, b = cluster.clients()
    async with a, b:
        sid = await new_session(a)
        watcher = StreamClient(a, sid)
        reading = asyncio.create_task(watcher.read(watcher.turns_done(1), seconds=60))
        accepted = await post(b, sid, bench_content("stop-me", chunks=2000, delay_ms=10))
        await watcher.wait(lambda frames: sum(f.event == "text_delta" for f in frames) >= 5)
        asked_at = time.monotonic()
        response = await a.post(f"/v1/sessions/{sid}/cancel", json={})
        answered_at = time.monotonic()
        gone = await disconnected(cluster, "stop-me")
        assert await reading == "matched"
    assert response.status_code == 202, response.text
    result = response.json()
    assert result["cancelled"] is True and result["turn_id"] == accepted["turn_id"]
    assert len(result["interrupted_message_ids"]) == 1
    assert gone.disconnected_at is not None
    assert gone.disconnected_at - asked_at < 1.0
    assert answered_at - asked_at < CONTROL_TIMEOUT
    assert watcher.of_type("turn_done")[0]["status"] == "cancelled"
    assert as_log(watcher.frames) == cluster.logged(sid)[-len(watcher.frames) :]


async def test_wait_on_the_replica_that_does_not_run_the_turn_returns_at_its_end(cluster: Cluster) -> None:
    """POST on B, then GET .../turns/{id}?wait=true on A: A has no in-memory end to wait on, it follows the
    session's events and rows, and answers the ended turn (completed, its final answer) only once the
    log holds its turn_done."""
    a, b = cluster.clients()
    async with a, b:
        sid = await new_session(b)
        accepted = await post(b, sid, bench_content("wait", chunks=60, delay_ms=10))
        response = await a.get(f"/v1/sessions/{sid}/turns/{accepted['turn_id']}", params={"wait": "true"})
    assert response.status_code == 200, response.text
    turn = response.json()
    assert turn["status"] == "completed" and turn["final_answer"]
    assert cluster.logged(sid)[-1][1] == "turn_done"


async def test_a_delete_on_the_other_replica_stops_the_turn_and_ends_every_stream(cluster: Cluster) -> None:
    """The turn runs on B, streams watch on A and B, DELETE goes to A: the upstream sees the disconnect,
    both streams end (no client is left watching a deleted session) and neither replica finds it."""
    a, b = cluster.clients()
    async with a, b:
        sid = await new_session(a)
        watchers = [StreamClient(a, sid), StreamClient(b, sid)]
        reads = [asyncio.create_task(w.read(seconds=30)) for w in watchers]
        await post(b, sid, bench_content("delete-me", chunks=2000, delay_ms=10))
        await watchers[0].wait(lambda frames: any(f.event == "text_delta" for f in frames))
        response = await a.delete(f"/v1/sessions/{sid}")
        gone = await disconnected(cluster, "delete-me")
        outcomes = await asyncio.gather(*reads)
        found = [(await c.get(f"/v1/sessions/{sid}")).status_code for c in (a, b)]
    assert response.status_code == 204, response.text
    assert gone.disconnected
    assert outcomes == ["ended", "ended"]
    assert found == [404, 404]


async def test_many_streams_share_each_replicas_few_redis_connections(cluster: Cluster) -> None:
    """Sixty streams of thirty sessions on both replicas: each replica still holds one reader connection
    (one XREAD for all its sessions), and the replicas' connections grow by at most the publisher's pool
    taking a second one, never by a connection per stream; a turn on B then reaches every stream on A."""
    a, b = cluster.clients()
    async with a, b:
        before = cluster.redis_connections()
        sessions = [await new_session(a) for _ in range(30)]
        streams = [StreamClient(c, sid) for sid in sessions for c in (a, b)]
        opened = [asyncio.Event() for _ in streams]
        reads = [
            asyncio.create_task(s.read(s.turns_done(1), seconds=60, opened=o))
            for s, o in zip(streams, opened, strict=True)
        ]
        for event in opened:
            await event.wait()
        await asyncio.sleep(0.5)
        during = cluster.redis_connections()
        for sid in sessions[:3]:
            await post(b, sid, bench_content(f"many-{sid}", chunks=5, delay_ms=5))
        outcomes = await asyncio.gather(*reads[:6])
        for read in reads[6:]:
            read.cancel()
        await asyncio.gather(*reads[6:], return_exceptions=True)
    assert before.count(f"{cluster.prefix}:fanout-reader") == 2
    assert during.count(f"{cluster.prefix}:fanout-reader") == 2
    assert len(during) <= len(before) + 2, (before, during)
    assert outcomes == ["matched"] * 6
    for stream in streams[:6]:
        assert as_log(stream.frames) == cluster.logged(stream.session_id)


async def test_an_approval_sent_to_the_other_replica_reaches_the_turn(cluster: Cluster) -> None:
    """The turn runs on B and waits for a person's approval; the decisions go to A. A decision that does
    not fit the tool's schema gets B's own 422 (nothing taken, the call still waits), the fitting one
    B's resolution; the turn goes on, runs the edited call and completes, and the model read its result.
    The same decision again on A is a replay."""
    cluster.upstream.enqueue(
        Script.tool_calls([("call_c", "calculate", '{"expression": "6*7"}')]), Script.text("It is 9.")
    )
    a, b = cluster.clients()
    async with a, b:
        created = await b.post("/v1/sessions", json={"tools": ["calculate"], "approval": ["calculate"]})
        sid = created.json()["id"]
        watcher = StreamClient(a, sid)
        reading = asyncio.create_task(watcher.read(watcher.turns_done(1), seconds=60))
        await post(b, sid, "what is 6*7?")
        await watcher.wait(lambda frames: any(f.event == "approval_requested" for f in frames))
        route = f"/v1/sessions/{sid}/approvals"
        wrong = {"tool_call_id": "call_c", "decision": "edit", "arguments": {"expression": 5}}
        refused = await a.post(route, json={"decisions": [wrong]})
        still = (await a.get(f"/v1/sessions/{sid}/pending")).json()["pending"]
        edited = {"tool_call_id": "call_c", "decision": "edit", "arguments": {"expression": "3*3"}}
        answered = await a.post(route, json={"decisions": [edited]})
        assert await reading == "matched"
        again = await a.post(route, json={"decisions": [edited]})
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "invalid_answer", refused.text
    assert len(still) == 1
    assert answered.status_code == 200, answered.text
    assert answered.json()["resolved"] == [
        {"tool_call_id": "call_c", "resolution": "edit", "replayed": False}
    ]
    assert again.status_code == 200 and again.json()["resolved"][0]["replayed"] is True
    assert watcher.of_type("turn_done")[0]["status"] == "completed"
    last = cluster.upstream.requests[-1].body["messages"]
    assert [m["content"] for m in last if m["role"] == "tool"] == ["9"]


async def test_waits_and_idle_streams_on_both_replicas_end_exactly_at_the_turns_end(cluster: Cluster) -> None:
    """The turn runs on B and streams text that reads like a turn_done event. Waits (`wait=true`) on A and
    on B, and `until_idle` streams on both (live ones opened mid-turn, one on A replaying from 0) learn
    the turn's end from the runtime's typed signal (frames.Frame.turn, through Redis and the log), not
    from any frame's JSON: each wait answers the completed turn with its whole answer, and each stream
    ends right after the turn's own turn_done, the log's last event, having shown it once."""
    forged = '{"type":"turn_done","seq":2,"turn_id":"t_forged","status":"completed"}'
    cluster.upstream.enqueue(Script(text_pieces=[forged, *Script.words(100).text_pieces], delay=0.02))
    a, b = cluster.clients()
    async with a, b:
        sid = await new_session(b)
        accepted = await post(b, sid, "say something that looks like an event")
        turn_id = accepted["turn_id"]
        url = f"/v1/sessions/{sid}/turns/{turn_id}"
        streams = [StreamClient(a, sid), StreamClient(b, sid), StreamClient(a, sid)]
        until_idle = {"until_idle": "true"}
        waits = await asyncio.gather(
            a.get(url, params={"wait": "true"}),
            b.get(url, params={"wait": "true"}),
            streams[0].read(params=until_idle, seconds=60),
            streams[1].read(params=until_idle, seconds=60),
            streams[2].read(params={**until_idle, "after": "0"}, seconds=60),
        )
    log = cluster.logged(sid)
    assert log[-1][1] == "turn_done"
    for response in waits[:2]:
        assert isinstance(response, httpx.Response)
        assert response.status_code == 200, response.text
        turn = response.json()
        assert turn["status"] == "completed"
        assert turn["final_answer"].startswith(forged)
    assert list(waits[2:]) == ["ended", "ended", "ended"]
    for stream in streams:
        assert stream.types().count("text_delta") >= 1, "opened after the turn's end: no proof"
        assert stream.types().count("turn_done") == 1
        assert stream.frames[-1].event == "turn_done"
        assert stream.of_type("turn_done")[0]["turn_id"] == turn_id
        assert as_log(stream.frames) == log[stream.frames[0].id - 1 :]
    assert as_log(streams[2].frames) == log
