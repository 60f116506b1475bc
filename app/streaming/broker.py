"""Fan-out of committed events: per-session channels, subscribers, replay and resync.

An event reaches subscribers only once the write-behind has numbered and committed it to the event log
(`deliver`). So every frame a client ever saw is durable: a resume never depends on memory, and a crash
can only lose events nobody saw, which were never numbered.

Every subscriber has its own bounded buffer. One that falls too far behind is dropped (its stream ends and
it resumes by Last-Event-ID) rather than ever slowing the agent or the other subscribers.

A subscription starts at a position: it is registered for live frames first, then the frames after the
position are taken from the channel's ring of recent frames and, for older ones, from the log, all without
an await between registering and reading the ring. So nothing falls between replay and live, and nothing
comes twice. A position the log no longer holds (or never held) starts the stream with a `resync` frame.

Shared mode (several replicas, streaming.redis.relay): frames also come from other processes, so they may
arrive out of order or with a hole. A channel then holds back a frame that does not follow its last one and
reports the hole (`on_gap`) for the relay to fill from the log; and a channel nobody watches is not kept
current (no replica reads its session's stream), so it is rebuilt from the log when next used.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from app.errors import Unavailable
from app.observability.hooks import session_memory, streams_dropped
from app.protocol.events import Resync
from app.streaming.frames import Frame

RING_SIZE = 1024
# Seconds a channel nobody watches is kept (its ring serves a quick reconnect) before it is let go.
CHANNEL_KEEP_SECONDS = 60.0


# Frames of one session with after < seq < before, in order, as the event log holds them.
LoadFrames = Callable[[str, int, int], Awaitable[list[Frame]]]
# Shared mode: a channel holds frames after a hole (Channel.held), to be filled from the log.
OnGap = Callable[["Channel"], None]
# Shared mode: a session that had no stream here got one (the relay starts reading its session's stream).
OnWatch = Callable[[str], None]


class StreamsClosed(Unavailable):
    code = "shutting_down"


@dataclass(eq=False, slots=True)
class Subscriber:
    """One stream's buffer. Lean on purpose: thousands of idle streams each hold one (a list, and a future
    only while it waits, instead of a deque and an Event with its own deque of waiters)."""

    limit: int
    buffer: list[Frame] = field(default_factory=list)
    overflowed: bool = False
    closed: bool = False
    # Set by the broker's heartbeat: the next wait returns an empty batch, which the stream sends as a
    # heartbeat (a comment, a blank line) so that proxies keep an idle connection.
    ping: bool = False
    _waiter: asyncio.Future[None] | None = None

    def push(self, frame: Frame) -> bool:
        if len(self.buffer) >= self.limit:
            self.overflowed = True
            self.wake()
            return False
        self.buffer.append(frame)
        self.wake()
        return True

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self) -> None:
        self.closed = True
        self.wake()

    async def next_batch(self) -> list[Frame] | None:
        """Frames in order; [] when a heartbeat is due and nothing was sent since the last one; None once
        the subscription ended (overflow or close) and its buffer is empty."""
        while not self.buffer:
            if self.overflowed or self.closed:
                return None
            if self.ping:
                self.ping = False
                return []
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        self.ping = False  # frames are going out: the connection is not idle
        batch, self.buffer = self.buffer, []
        return batch


class Channel:
    """One session's recent delivered frames and its subscribers.

    `delivered_seq` is the last frame committed and delivered: everything up to it is in the log (or was
    pruned from it by retention).
    """

    def __init__(
        self,
        session_id: str,
        delivered_seq: int,
        limit: int,
        ring_size: int = RING_SIZE,
        on_gap: OnGap | None = None,
    ) -> None:
        self.session_id = session_id
        self.delivered_seq = delivered_seq
        self._limit = limit
        # Shared mode only: frames after a hole, by seq, until the hole is filled (from the log).
        self._on_gap = on_gap
        self.held: dict[int, Frame] = {}
        # Recent frames as plain (seq, type, data, turn) tuples: a tuple of strings, None and an int is
        # not tracked by the garbage collector, and a hundred busy sessions keep a hundred thousand of
        # them; as Frame objects each full collection walked them all (tens of milliseconds with the event
        # loop stopped).
        self._ring: deque[tuple[int, str, str, str | None]] = deque(maxlen=ring_size)
        self.subscribers: set[Subscriber] = set()
        # Since when nobody watches it (None while somebody does); `joining`: streams on their way in.
        self.unwatched_since: float | None = time.monotonic()
        self.joining = 0

    def deliver(self, frames: Iterable[Frame]) -> None:
        """Committed frames, in order: into the ring and every subscriber's buffer. In shared mode a frame
        that does not follow the last one waits in `held` until the frames before it come."""
        for frame in frames:
            if frame.seq <= self.delivered_seq:
                continue
            if frame.seq != self.delivered_seq + 1 and self._on_gap is not None:
                self.held[frame.seq] = frame
                continue
            self.delivered_seq = frame.seq
            self._ring.append((frame.seq, frame.type, frame.data, frame.turn))
            dropped = [sub for sub in self.subscribers if not sub.push(frame)]
            if dropped:  # rare (a slow client): no hook call per frame otherwise
                for sub in dropped:
                    self.unsubscribe(sub)
                streams_dropped(len(dropped))
        if self.held:
            self._release_held()

    def _release_held(self) -> None:
        held = self.held
        for seq in [s for s in held if s <= self.delivered_seq]:
            del held[seq]
        run: list[Frame] = []
        while (frame := held.pop(self.delivered_seq + 1 + len(run), None)) is not None:
            run.append(frame)
        if run:
            self.deliver(run)
        elif held and self._on_gap is not None:
            self._on_gap(self)

    def recent_after(self, after: int) -> list[Frame]:
        """The ring's frames after `after`: contiguous, ending at delivered_seq."""
        if after >= self.delivered_seq:
            return []
        return [Frame(seq, type_, data, turn) for seq, type_, data, turn in self._ring if seq > after]

    def resync(self, head: int, reason: Literal["expired", "unknown"]) -> Frame:
        """A stream's first frame when it cannot replay: it takes no number, it repeats `head`'s."""
        event = Resync(seq=head, session_id=self.session_id, last_event_id=head, reason=reason)
        return Frame(head, event.type, event.model_dump_json())

    def subscribe(self) -> Subscriber:
        sub = Subscriber(limit=self._limit)
        self.subscribers.add(sub)
        self.unwatched_since = None
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)
        if not self.subscribers and self.unwatched_since is None:
            self.unwatched_since = time.monotonic()

    def close_all(self) -> None:
        for sub in self.subscribers:
            sub.close()
        self.subscribers.clear()

    def unwatched_for(self, seconds: float, now: float) -> bool:
        since = self.unwatched_since
        return since is not None and not self.joining and not self.subscribers and now - since >= seconds


@dataclass(eq=False)
class Subscription:
    """A stream's frames: the replay (or a resync), then live frames, each exactly once and in order."""

    channel: Channel
    subscriber: Subscriber
    replay: list[Frame]

    async def batches(self) -> AsyncIterator[list[Frame]]:
        if self.replay:
            yield self.replay
        while (batch := await self.subscriber.next_batch()) is not None:
            yield batch

    def close(self) -> None:
        self.channel.unsubscribe(self.subscriber)


class EventFanOut(Protocol):
    """Committed events to every stream that watches their session, wherever it is served.

    A multi-process implementation must guarantee what this one does across processes: a subscriber gets
    every event committed after its position exactly once and in order, with nothing lost between the
    replay from the log and the live events (subscribe, then read, then drop what the live side already
    had), whichever process committed the event; `last_seq` never names an event a subscriber could miss;
    a subscriber too slow for its buffer is ended, not slowed down to, and resumes from the log.
    """

    async def subscribe(self, session_id: str, after: int | None) -> Subscription: ...

    async def last_seq(self, session_id: str) -> int: ...

    def deliver(self, committed: Sequence[tuple[str, Frame]]) -> None: ...

    def drop(self, session_id: str) -> None: ...

    def close_all(self) -> None: ...


class Broker:
    """This process's fan-out: channels by session id, created on first use at the log's last event."""

    def __init__(
        self,
        load_last_seq: Callable[[str], Awaitable[int]],
        subscriber_limit: int,
        *,
        load_frames: LoadFrames | None = None,
        ring_size: int = RING_SIZE,
        on_gap: OnGap | None = None,
        on_watch: OnWatch | None = None,
        keep_seconds: float = CHANNEL_KEEP_SECONDS,
    ) -> None:
        """`on_gap` and `on_watch` turn on shared mode (see the module docstring)."""
        self._load_last_seq = load_last_seq
        self._on_gap = on_gap
        self._on_watch = on_watch
        self._load_frames = load_frames
        self._limit = subscriber_limit
        self._ring_size = ring_size
        self._channels: dict[str, Channel] = {}
        self.keep_seconds = keep_seconds
        self._locks: dict[str, asyncio.Lock] = {}
        # Frames delivered while their session's channel is being created: the log read that starts it may
        # have missed them (they committed after it), so they are applied once it exists.
        self._early: dict[str, list[Frame]] = {}
        self.closed = False
        self._heartbeat: asyncio.Task[None] | None = None

    async def channel(self, session_id: str) -> Channel:
        existing = self._channels.get(session_id)
        if existing is not None:
            if existing.subscribers or self._on_watch is None:
                return existing
            self.drop(session_id)  # shared mode: nobody watched it, so no replica's frames kept it current
        lock = self._locks.setdefault(session_id, asyncio.Lock())
        try:
            async with lock:
                existing = self._channels.get(session_id)
                if existing is None:
                    last = await self._load_last_seq(session_id)
                    existing = Channel(session_id, last, self._limit, self._ring_size, self._on_gap)
                    existing.deliver(self._early.pop(session_id, ()))
                    self._channels[session_id] = existing
                    session_memory(channels=1)
        finally:
            if not lock.locked() and self._locks.get(session_id) is lock:
                del self._locks[session_id]
                self._early.pop(session_id, None)
        return existing

    async def last_seq(self, session_id: str) -> int:
        """The last event clients can have seen: read it before the history, then subscribe after it."""
        return (await self.channel(session_id)).delivered_seq

    def deliver(self, committed: Sequence[tuple[str, Frame]]) -> None:
        """Called by the write-behind after each commit, with the frames in order."""
        by_session: dict[str, list[Frame]] = {}
        for session_id, frame in committed:
            by_session.setdefault(session_id, []).append(frame)
        for session_id, frames in by_session.items():
            channel = self._channels.get(session_id)
            if channel is not None:
                channel.deliver(frames)
            elif session_id in self._locks:
                self._early.setdefault(session_id, []).extend(frames)

    async def subscribe(self, session_id: str, after: int | None) -> Subscription:
        """Live frames from now on, preceded by every frame after `after` (None: live only)."""
        if self.closed:
            raise StreamsClosed("The server is shutting down; reconnect in a moment.")
        channel = await self.channel(session_id)
        if self._on_watch is not None:
            channel.joining += 1  # not let go while it catches up
            try:
                await self._catch_up(channel, after)
            finally:
                channel.joining -= 1
        watched = bool(channel.subscribers)
        sub = channel.subscribe()
        if not watched and self._on_watch is not None:
            # After registering: the reader it wakes then finds the session among the watched.
            self._on_watch(session_id)
        head = channel.delivered_seq
        if after is None or after == head:
            return Subscription(channel, sub, [])
        if after > head:
            return Subscription(channel, sub, [channel.resync(head, "unknown")])
        recent = channel.recent_after(after)
        if recent and recent[0].seq == after + 1:
            return Subscription(channel, sub, recent)
        before = recent[0].seq if recent else head + 1
        try:
            older = await self._older(session_id, after, before)
        except BaseException:
            channel.unsubscribe(sub)
            raise
        if older is None:
            # Frames delivered meanwhile are in the buffer, all after `head`: the resync names `head`.
            return Subscription(channel, sub, [channel.resync(head, "expired")])
        return Subscription(channel, sub, older + recent)

    async def _catch_up(self, channel: Channel, after: int | None) -> None:
        """Shared mode: a position the client saw on another replica may be ahead of what this channel
        has delivered so far; the log has it, so the channel catches up rather than resync."""
        if after is not None and after > channel.delivered_seq and self._load_frames is not None:
            channel.deliver(await self._load_frames(channel.session_id, channel.delivered_seq, after + 1))

    async def _older(self, session_id: str, after: int, before: int) -> list[Frame] | None:
        """Frames after < seq < before from the log, or None when it no longer holds all of them."""
        if self._load_frames is None:
            return None
        frames = await self._load_frames(session_id, after, before)
        expected = range(after + 1, before)
        if len(frames) != len(expected) or any(f.seq != s for f, s in zip(frames, expected, strict=True)):
            return None
        return frames

    def existing(self, session_id: str) -> Channel | None:
        return self._channels.get(session_id)

    def watched(self) -> dict[str, int]:
        """Sessions with a stream here, each with the last seq its channel delivered."""
        return {sid: ch.delivered_seq for sid, ch in self._channels.items() if ch.subscribers}

    def drop(self, session_id: str) -> None:
        channel = self._channels.pop(session_id, None)
        if channel is not None:
            session_memory(channels=-1)
            channel.close_all()

    def start_heartbeat(self, interval: float) -> None:
        """Every `interval`, each stream gets a heartbeat, unless frames wait in its buffer when it next
        takes a batch (they keep the connection alive themselves). A stream that sent frames just before
        the beat still gets one: idleness since the last beat is not tracked.

        One task for all streams, instead of the ping task sse-starlette would run per stream: at 2,000
        idle streams those tasks (with their cancel scopes and frames) were a large part of the memory
        an idle stream costs.
        """
        self._heartbeat = asyncio.create_task(self._beat(interval), name="stream-heartbeat")

    async def _beat(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self.let_go_unwatched(time.monotonic())
            for channel in self._channels.values():
                for sub in channel.subscribers:
                    sub.ping = True
                    sub.wake()

    def let_go_unwatched(self, now: float) -> None:
        """Drops the channels nobody watched for `keep_seconds` (each holds a ring of frames): a later
        stream starts a new channel at the log's last event and replays from the log."""
        keep = self.keep_seconds
        for session_id in [sid for sid, ch in self._channels.items() if ch.unwatched_for(keep, now)]:
            if session_id not in self._locks:  # not one being made again
                self.drop(session_id)

    def close_all(self) -> None:
        """Shutdown: every stream ends once its buffered frames are sent, and no new one starts."""
        self.closed = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        for channel in self._channels.values():
            channel.close_all()
