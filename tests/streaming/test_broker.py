"""The broker (app.streaming.broker) on its own: delivery only after the log commit, atomic replay, resync,
slow subscribers. Its `Log` stands in for the write-behind; the frames themselves: test_frames.py."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.observability import hooks
from app.observability.metrics import Metrics
from app.protocol.events import AgentStatus
from app.streaming.broker import Broker, Subscription
from app.streaming.frames import Draft, Frame, Publisher

pytestmark = pytest.mark.anyio

SID = "s_1"


class Log:
    """A stand-in for the write-behind and the events table: numbers drafts as it commits them."""

    def __init__(self) -> None:
        self.pending: list[Draft] = []
        self.rows: dict[int, Frame] = {}
        self.last = 0
        self.broker: Broker | None = None
        self.during_load: list[int] = []
        self.events = Publisher(SID, self.pending.append)

    def commit(self) -> None:
        batch = []
        for draft in self.pending:
            self.last += 1
            batch.append((draft.session_id, draft.number(self.last)))
        self.pending.clear()
        for _, frame in batch:
            self.rows[frame.seq] = frame
        assert self.broker is not None
        self.broker.deliver(batch)

    def prune(self, keep_after: int) -> None:
        self.rows = {seq: f for seq, f in self.rows.items() if seq > keep_after}

    async def last_seq(self, _: str) -> int:
        return max(self.rows, default=0)

    async def load(self, _: str, after: int, before: int) -> list[Frame]:
        await asyncio.sleep(0)
        snapshot = [self.rows[s] for s in sorted(self.rows) if after < s < before]
        # Meanwhile the agent goes on: these frames must come live, once.
        for _step in self.during_load:
            await self.publish(1)
        await asyncio.sleep(0)
        return snapshot

    async def publish(self, count: int) -> None:
        for _n in range(count):
            self.events.emit(AgentStatus, status="thinking")
        self.commit()


def make(log: Log, *, limit: int = 1000, ring: int = 8) -> Broker:
    broker = Broker(log.last_seq, limit, load_frames=log.load, ring_size=ring)
    log.broker = broker
    return broker


async def take(subscription: Subscription, count: int) -> list[Frame]:
    got: list[Frame] = []
    async with asyncio.timeout(2):
        async for batch in subscription.batches():
            got += batch
            if len(got) >= count:
                break
    return got


async def test_subscribers_see_a_frame_only_once_it_is_committed() -> None:
    log = Log()
    broker = make(log)
    subscription = await broker.subscribe(SID, None)
    log.events.emit(AgentStatus, status="thinking")
    assert subscription.subscriber.buffer == []
    assert await broker.last_seq(SID) == 0
    log.commit()
    assert [f.seq for f in subscription.subscriber.buffer] == [1]
    assert await broker.last_seq(SID) == 1


async def test_replay_from_the_log_then_the_ring_then_live_without_gap_or_duplicate() -> None:
    log = Log()
    broker = make(log, ring=8)
    await log.publish(30)
    log.during_load = [1, 2, 3]  # three frames are delivered while the replay reads the log
    subscription = await broker.subscribe(SID, 4)
    await log.publish(2)
    got = await take(subscription, 31)
    assert [f.seq for f in got] == list(range(5, 36))


async def test_a_recent_position_is_served_from_the_ring_alone() -> None:
    log = Log()
    broker = make(log, ring=8)
    await broker.channel(SID)  # a channel exists (a client watched): it keeps the recent frames
    await log.publish(20)
    log.rows.clear()  # the log is not read at all
    subscription = await broker.subscribe(SID, 15)
    assert [f.seq for f in subscription.replay] == [16, 17, 18, 19, 20]


async def test_a_replay_from_the_ring_keeps_each_frames_turn() -> None:
    """The ring keeps a turn edge's `turn`: a stream that resumes from it (until_idle reads its replay)
    learns where the turn started and ended as a live one does."""
    log = Log()
    broker = make(log, ring=8)
    await broker.channel(SID)
    start, delta, done = (
        Frame(1, "turn_start", "{}", "t_1"),
        Frame(2, "text_delta", "{}"),
        Frame(3, "turn_done", "{}", "t_1"),
    )
    broker.deliver([(SID, start), (SID, delta), (SID, done)])
    subscription = await broker.subscribe(SID, 0)
    assert [(f.seq, f.type, f.turn) for f in subscription.replay] == [
        (1, "turn_start", "t_1"),
        (2, "text_delta", None),
        (3, "turn_done", "t_1"),
    ]


async def test_a_pruned_position_resyncs_at_the_head_it_replays_from() -> None:
    log = Log()
    broker = make(log, ring=4)
    await log.publish(20)
    log.prune(keep_after=10)
    log.during_load = [1]
    subscription = await broker.subscribe(SID, 3)
    got = await take(subscription, 2)
    assert [(f.type, f.seq) for f in got] == [("resync", 20), ("agent_status", 21)]
    assert '"last_event_id":20' in got[0].data
    assert '"reason":"expired"' in got[0].data
    # From the oldest kept position the replay works.
    subscription = await broker.subscribe(SID, 10)
    assert [f.seq for f in subscription.replay] == list(range(11, 22))


async def test_a_position_ahead_of_the_log_resyncs_without_taking_a_number() -> None:
    log = Log()
    broker = make(log)
    await log.publish(3)
    subscription = await broker.subscribe(SID, 7)
    assert [(f.type, f.seq) for f in subscription.replay] == [("resync", 3)]
    await log.publish(1)
    assert [f.seq for f in await take(subscription, 2)] == [3, 4]


async def test_a_subscriber_that_overflows_is_dropped_and_the_others_are_not() -> None:
    log = Log()
    broker = make(log, limit=16)
    stalled = await broker.subscribe(SID, None)
    reading = await broker.subscribe(SID, None)
    got: list[Frame] = []
    for _ in range(5):
        await log.publish(10)
        got += await take(reading, 10)
    assert [f.seq for f in got] == list(range(1, 51))
    channel = await broker.channel(SID)
    assert stalled.subscriber not in channel.subscribers
    # What it had buffered is still sent, then its stream ends: it resumes from the last one it got.
    kept = await take(stalled, 16)
    assert [f.seq for f in kept] == list(range(1, 17))
    assert await stalled.subscriber.next_batch() is None
    resumed = await broker.subscribe(SID, kept[-1].seq)
    assert [f.seq for f in resumed.replay] == list(range(17, 51))


async def test_after_close_all_streams_end_and_new_ones_are_refused() -> None:
    log = Log()
    broker = make(log)
    subscription = await broker.subscribe(SID, None)
    await log.publish(2)
    broker.close_all()
    assert [f.seq for f in await take(subscription, 2)] == [1, 2]
    assert await subscription.subscriber.next_batch() is None
    with pytest.raises(Exception, match="shutting down"):
        await broker.subscribe(SID, None)


async def test_frames_committed_while_a_channel_is_being_created_reach_it() -> None:
    """A channel starts at the log's last number; a frame committed after that read but delivered before
    the channel exists must still reach it (and its subscribers), not fall between the two."""
    log = Log()
    broker = make(log)
    await log.publish(3)  # no channel yet: nothing to deliver to
    reads = 0

    async def slow_last_seq(_: str) -> int:
        nonlocal reads
        reads += 1
        last = max(log.rows, default=0)
        await log.publish(2)  # committed and delivered after the read, before the channel exists
        return last

    broker._load_last_seq = slow_last_seq
    subscription = await broker.subscribe(SID, 3)
    assert reads == 1
    assert await broker.last_seq(SID) == 5
    assert [f.seq for f in await take(subscription, 2)] == [4, 5]


def numbered(*seqs: int) -> list[tuple[str, Frame]]:
    return [(SID, Frame(seq, "agent_status", f'{{"seq":{seq}}}')) for seq in seqs]


async def test_shared_mode_holds_frames_after_a_hole_until_it_is_filled() -> None:
    """Several replicas (on_gap set): frames 5 and 6 arriving before 3 and 4 wait, the hole is reported
    once per arrival that leaves it open, and all go out in order once the hole is filled; a frame
    delivered twice goes out once. Without on_gap (one process) the broker is as it always was."""
    log = Log()
    gaps: list[list[int]] = []
    broker = Broker(
        log.last_seq,
        1000,
        load_frames=log.load,
        on_gap=lambda ch: gaps.append(sorted(ch.held)),
        on_watch=lambda _: None,
    )
    log.broker = broker
    subscription = await broker.subscribe(SID, None)
    broker.deliver(numbered(1, 2))
    broker.deliver(numbered(5, 6))
    assert await take(subscription, 2) == [f for _, f in numbered(1, 2)]
    assert gaps == [[5, 6]]
    broker.deliver(numbered(2, 3))
    assert gaps == [[5, 6], [5, 6]]
    broker.deliver(numbered(4))
    assert [f.seq for f in await take(subscription, 4)] == [3, 4, 5, 6]
    channel = broker.existing(SID)
    assert channel is not None and channel.held == {}
    assert broker.watched() == {SID: 6}


async def test_shared_mode_rebuilds_a_channel_nobody_watched_from_the_log() -> None:
    """A channel whose streams all left is no longer fed by other replicas: the next stream of its session
    starts from the log's head, not from the stale channel, and the broker says it is watched again."""
    log = Log()
    watched: list[str] = []
    broker = make_shared(log, watched)
    first = await broker.subscribe(SID, None)
    await log.publish(2)
    assert len(await take(first, 2)) == 2
    first.close()
    # Committed by another replica while nobody here watched: this broker never saw them.
    log.rows.update({seq: Frame(seq, "agent_status", "{}") for seq in (3, 4)})
    assert await broker.last_seq(SID) == 4
    again = await broker.subscribe(SID, 2)
    assert [f.seq for f in again.replay] == [3, 4]
    assert watched == [SID, SID]


def make_shared(log: Log, watched: list[str]) -> Broker:
    broker = Broker(log.last_seq, 1000, load_frames=log.load, on_gap=lambda _: None, on_watch=watched.append)
    log.broker = broker
    return broker


async def test_shared_mode_catches_up_to_a_position_seen_on_another_replica() -> None:
    """A client that saw seq 4 on another replica resumes here while this channel (watched, so not
    rebuilt) has delivered only 2: the log holds 3 and 4, so the channel catches up from it and the stream
    goes on live from 4, where a single process would have answered a resync."""
    log = Log()
    broker = make_shared(log, [])
    watching = await broker.subscribe(SID, None)
    await log.publish(2)
    log.rows.update({seq: Frame(seq, "agent_status", "{}") for seq in (3, 4)})
    log.last = 4
    resumed = await broker.subscribe(SID, 4)
    assert resumed.replay == []
    assert [f.seq for f in await take(watching, 4)] == [1, 2, 3, 4]
    await log.publish(1)
    assert [f.seq for f in await take(resumed, 1)] == [5]


async def test_a_channel_nobody_watches_is_let_go_and_a_later_stream_replays_from_the_log() -> None:
    """A process kept a channel, with a ring of up to 1,024 frames, for every session ever watched (16.5 KB
    a session of one short turn, measured on a real server; a long session's ring holds 1,024 frames).
    Once nobody has watched it for `keep_seconds` it goes; a stream that comes later gets every frame after
    its position from the log and then live ones, with no gap and no duplicate."""
    log = Log()
    broker = make(log, ring=8)
    metrics = Metrics()
    hooks.activate(metrics)
    try:
        first = await broker.subscribe(SID, None)
        await log.publish(3)
        assert [f.seq for f in await take(first, 3)] == [1, 2, 3]
        broker.let_go_unwatched(time.monotonic() + 10 * broker.keep_seconds)
        assert broker.existing(SID) is not None  # watched
        first.close()
        left = time.monotonic()
        broker.let_go_unwatched(left + broker.keep_seconds - 1)
        assert broker.existing(SID) is not None  # a quick reconnect still finds its ring
        assert metrics.registry.get_sample_value("parley_stream_channels") == 1
        broker.let_go_unwatched(left + broker.keep_seconds + 1)
        assert broker.existing(SID) is None
        assert metrics.registry.get_sample_value("parley_stream_channels") == 0
    finally:
        hooks.activate(None)
    await log.publish(4)  # committed with no channel: only the log has them
    again = await broker.subscribe(SID, 2)
    assert [f.seq for f in again.replay] == [3, 4, 5, 6, 7]
    await log.publish(1)
    assert [f.seq for f in await take(again, 6)] == [3, 4, 5, 6, 7, 8]


async def test_shared_mode_never_lets_go_of_a_channel_a_stream_is_joining() -> None:
    """Shared mode: a stream catches its new channel up from the log before it subscribes (an await). A
    channel let go meanwhile would take that stream's live frames to a channel nobody delivers to."""
    log = Log()
    log.rows.update({seq: Frame(seq, "agent_status", "{}") for seq in (1, 2, 3, 4)})

    async def stale_head(_: str) -> int:
        return 2  # the head read when the channel is made; the client saw 4 on another replica

    kept: list[bool] = []

    async def load(session_id: str, after: int, before: int) -> list[Frame]:
        # The catch-up's read: the heartbeat's sweep comes while it waits.
        channel = broker.existing(SID)
        broker.let_go_unwatched(time.monotonic() + 10 * broker.keep_seconds)
        kept.append(channel is not None and broker.existing(SID) is channel)
        return await log.load(session_id, after, before)

    broker = Broker(stale_head, 1000, load_frames=load, on_gap=lambda _: None, on_watch=lambda _: None)
    log.broker = broker
    subscription = await broker.subscribe(SID, 4)
    assert kept == [True]
    assert subscription.channel is broker.existing(SID) and subscription.channel.delivered_seq == 4
