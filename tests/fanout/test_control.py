"""Control and live status across two replica processes (tests/fanout/conftest.py): a session's turn runs
on one replica while its status is read, its stream followed to idle, and steer, interrupt and cancel
are sent on the other. What each test checks is read over HTTP or from the database both share, never
from a replica's memory."""

from __future__ import annotations

import asyncio

import pytest

from app.turns.replicas.turns import ReplicaTurns
from tests.fakes.directive import bench_content
from tests.fanout.conftest import Cluster
from tests.support.client import new_session, post
from tests.support.stream import Frame, StreamClient, assert_contiguous

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

# Class under test, reached over HTTP (the replicas run it in their own processes).
__all__ = ["ReplicaTurns"]


def as_log(frames: list[Frame]) -> list[tuple[int, str, str]]:
    return [(f.id, f.event, f.data) for f in frames]


async def test_the_replica_that_does_not_run_the_turn_shows_it_and_streams_to_its_end(
    cluster: Cluster,
) -> None:
    """The turn runs on A (a slow answer). B's GET names the same running turn with a working status, as
    A's does; a stream on B with `until_idle=true`, opened live mid-turn, ends only after the turn's
    `turn_done`, every frame from its first one on contiguous and byte-identical to the log; once the
    turn is over B's GET shows the session idle."""
    a, b = cluster.clients()
    async with a, b:
        sid = await new_session(a)
        watcher = StreamClient(a, sid)
        reading = asyncio.create_task(watcher.read(watcher.turns_done(1), seconds=60))
        accepted = await post(a, sid, bench_content("status", chunks=300, delay_ms=10))
        await watcher.wait(lambda frames: sum(f.event == "text_delta" for f in frames) >= 3)
        on_a = (await a.get(f"/v1/sessions/{sid}")).json()
        on_b = (await b.get(f"/v1/sessions/{sid}")).json()
        listed = (await b.get("/v1/sessions")).json()["sessions"]
        follower = StreamClient(b, sid)
        outcome = await follower.read(params={"until_idle": "true"}, seconds=60)
        assert await reading == "matched"
        after = (await b.get(f"/v1/sessions/{sid}")).json()
    assert on_a["running_turn_id"] == accepted["turn_id"]
    assert (on_b["running_turn_id"], on_b["agent_status"]) == (accepted["turn_id"], on_a["agent_status"])
    assert on_b["agent_status"] != "idle"
    assert [s["running_turn_id"] for s in listed if s["id"] == sid] == [accepted["turn_id"]]
    assert outcome == "ended"
    assert follower.frames and follower.frames[-1].event == "turn_done"
    assert sum(f.event == "text_delta" for f in follower.frames) >= 10
    first = follower.frames[0].id
    assert_contiguous(follower.frames, first=first)
    assert as_log(follower.frames) == cluster.logged(sid)[first - 1 :]
    assert (after["running_turn_id"], after["agent_status"]) == (None, "idle")
