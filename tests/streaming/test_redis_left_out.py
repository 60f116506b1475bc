"""The relay leaves out of its XREAD the sessions whose turn runs on its replica (their frames reach the
local streams from the write-behind), and still gets what other replicas log for them (issue 16).

How it proves it: two replicas' event stacks over one database and a real Redis (as in
test_redis_fanout), each relay told which sessions "run" on its replica. The reader's replies are
recorded, so a frame read back from Redis is seen; the periodic sweep of the log is switched off (and the
XREAD's block made long where it matters), so a frame that arrives can only have come the way the test
names: the notice another replica sends, or the reader taking the stream in again once the turn is over.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.streaming.redis import relay as redis_fanout
from app.streaming.redis.entries import notice, noticed
from app.streaming.redis.relay import RedisRelay
from app.turns.runtime.notifier import Notifier
from tests.streaming.test_redis_fanout import SID, Reader, Replica, logged, pair
from tests.support.redis import redis_prefix

pytestmark = pytest.mark.anyio
__all__ = ["pair", "redis_prefix"]  # fixtures


def relay_of(replica: Replica) -> RedisRelay:
    assert replica.relay is not None
    notifier: Notifier = replica.relay  # the runner's notifier with Redis (turns.runtime.notifier)
    assert notifier is replica.relay
    return replica.relay


def recorded(relay: RedisRelay) -> list[str]:
    """The stream keys of every reply the reader gets from now on; the log's sweep switched off."""
    keys: list[str] = []
    apply = relay._apply

    def recording(reply: Any) -> None:
        keys.extend(key for key, _ in (reply.items() if isinstance(reply, dict) else reply))
        apply(reply)

    async def no_sweep() -> None:
        return None

    relay._apply = recording  # type: ignore[method-assign]
    relay._poll_log = no_sweep  # type: ignore[method-assign]
    return keys


async def left_out(relay: RedisRelay, session_id: str) -> None:
    """Until the reader's XREAD leaves the session out."""
    for _ in range(500):
        if session_id in relay._left_out:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the reader did not leave the session out")


async def test_a_turn_running_here_is_not_read_back_and_other_replicas_frames_come_by_notice(
    pair: tuple[Replica, Replica], redis_prefix: str
) -> None:
    """A runs the session's turn and streams it: its 30 frames reach A's stream, none comes back to A's
    reader. B, which does not run it, logs 5 more (a message posted there): they come with a notice, A
    reads the session's stream once, and its stream has all 35, contiguous, as logged."""
    a, b = pair
    relay_of(a).running(SID, True)
    keys = recorded(relay_of(a))
    live = Reader(await a.broker.subscribe(SID, 0))
    await left_out(relay_of(a), SID)
    a.publish(30)
    await live.until(30)
    b.publish(5)
    frames = await live.until(35)
    assert [(f.seq, f.type, f.data, f.turn) for f in frames] == await logged(a.database)
    stream = f"{redis_prefix}:events:{SID}"
    assert stream not in keys  # nothing read back by XREAD: the notice's read is an XRANGE of its own
    assert f"{redis_prefix}:notices" in keys


async def test_once_the_turn_is_over_here_the_reader_takes_the_stream_in_again(
    pair: tuple[Replica, Replica], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's turn ends (`turn_over`) and B runs the next one: B sends no notice for a turn it runs, and the
    XREAD blocks for a minute here, so B's frames reach A's stream only because turn_over woke the
    reader, which read the session's stream again."""
    a, b = pair
    relay_of(a).running(SID, True)
    relay_of(b).running(SID, True)
    recorded(relay_of(a))
    monkeypatch.setattr(redis_fanout, "BLOCK_MS", 60_000)
    live = Reader(await a.broker.subscribe(SID, 0))
    a.publish(3)
    await live.until(3)
    await left_out(relay_of(a), SID)
    await asyncio.sleep(0.2)  # the reader blocks again, the session left out
    relay_of(a).running(SID, False)
    relay_of(a).turn_over(SID)
    b.publish(4)
    frames = await live.until(7)
    assert [(f.seq, f.type, f.data, f.turn) for f in frames] == await logged(a.database)


def test_a_notice_names_its_sessions() -> None:
    command = notice("p:notices", ["s_1", "s_2"])
    assert command[:6] == ("XADD", "p:notices", "MAXLEN", "~", 1000, "*")
    fields = dict(zip(command[6::2], command[7::2], strict=True))
    assert noticed([("1-0", fields), ("2-0", {"s": "s_3"})]) == {"s_1", "s_2", "s_3"}
