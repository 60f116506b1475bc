"""Per-session event channels: sequence numbers, fan-out to subscribers, replay and resync.

An event is numbered and serialized once, into a Frame, when it is published; it reaches subscribers only
once the write-behind has committed it to the event log (`deliver`). So every frame a client ever saw is
durable: a resume never depends on memory, and a crash can only lose frames nobody saw, whose numbers the
next process then reuses without ambiguity.

Every subscriber has its own bounded buffer. One that falls too far behind is dropped (its stream ends and
it resumes by Last-Event-ID) rather than ever slowing the agent or the other subscribers.

A subscription starts at a position: it is registered for live frames first, then the frames after the
position are taken from the channel's ring of recent frames and, for older ones, from the log, all without
an await between registering and reading the ring. So nothing falls between replay and live, and nothing
comes twice. A position the log no longer holds (or never held) starts the stream with a `resync` frame.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sse_starlette import ServerSentEvent

from app.errors import Unavailable
from app.protocol.events import Resync, _Event

RING_SIZE = 1024

# json.dumps(s, ensure_ascii=False) for a str, without the encoder object's Python layer.
_json_string: Callable[[str], str] = json.encoder.encode_basestring


@dataclass(slots=True)
class Frame:
    seq: int
    type: str
    data: str
    _sse: bytes | None = field(default=None, compare=False, repr=False)

    def sse(self) -> bytes:
        """The frame as SSE bytes (sse-starlette's encoding), built once however many clients get it."""
        encoded = self._sse
        if encoded is None:
            encoded = self._sse = ServerSentEvent(data=self.data, event=self.type, id=str(self.seq)).encode()
        return encoded


# Frames of one session with after < seq < before, in order, as the event log holds them.
LoadFrames = Callable[[str, int, int], Awaitable[list[Frame]]]


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
    """One session's numbering, its recent delivered frames and its subscribers.

    `last_seq` is the last number handed out; `delivered_seq` the last frame committed and delivered.
    Everything up to `delivered_seq` is in the log (or was pruned from it by retention).
    """

    def __init__(
        self,
        session_id: str,
        last_seq: int,
        sink: Callable[[str, Frame], None],
        limit: int,
        ring_size: int = RING_SIZE,
    ) -> None:
        self.session_id = session_id
        self.last_seq = last_seq
        self.delivered_seq = last_seq
        self._sink = sink
        self._limit = limit
        # Recent frames as plain (seq, type, data) tuples: a tuple of strings and an int is not tracked by
        # the garbage collector, and a hundred busy sessions keep a hundred thousand of them; as Frame
        # objects each full collection walked them all (tens of milliseconds with the event loop stopped).
        self._ring: deque[tuple[int, str, str]] = deque(maxlen=ring_size)
        self.subscribers: set[Subscriber] = set()
        # The part of a text_delta's JSON that repeats for every delta of one message.
        self._delta_message: str | None = None
        self._delta_middle: str | None = None

    def publish(self, cls: type[_Event], **fields: Any) -> Frame:
        """Numbers and serializes the event, and hands it to the log; subscribers get it once committed."""
        self.last_seq += 1
        event = cls(seq=self.last_seq, session_id=self.session_id, **fields)
        frame = Frame(self.last_seq, event.type, event.model_dump_json())
        self._sink(self.session_id, frame)
        return frame

    def publish_text_delta(self, message_id: str, text: str) -> Frame:
        """`publish(TextDelta, id=message_id, text=text)` for every delta but a message's first, without
        building a model: the hot path. tests/streams/test_broker.py holds it byte-equal to the model's
        JSON; `text` must be valid Unicode (events.clean_text)."""
        self.last_seq = seq = self.last_seq + 1
        middle = self._delta_middle
        if middle is None or self._delta_message != message_id:
            middle = self._delta_middle = (
                f',"session_id":{_json_string(self.session_id)},"id":{_json_string(message_id)},"text":'
            )
            self._delta_message = message_id
        frame = Frame(seq, "text_delta", f'{{"type":"text_delta","seq":{seq}{middle}{_json_string(text)}}}')
        self._sink(self.session_id, frame)
        return frame

    def deliver(self, frames: Iterable[Frame]) -> None:
        """Committed frames, in order: into the ring and every subscriber's buffer."""
        for frame in frames:
            if frame.seq <= self.delivered_seq:
                continue
            self.delivered_seq = frame.seq
            self._ring.append((frame.seq, frame.type, frame.data))
            dropped = [sub for sub in self.subscribers if not sub.push(frame)]
            for sub in dropped:
                self.subscribers.discard(sub)

    def recent_after(self, after: int) -> list[Frame]:
        """The ring's frames after `after`: contiguous, ending at delivered_seq."""
        if after >= self.delivered_seq:
            return []
        return [Frame(seq, type_, data) for seq, type_, data in self._ring if seq > after]

    def resync(self, head: int, reason: Literal["expired", "unknown"]) -> Frame:
        """A stream's first frame when it cannot replay: it takes no number, it repeats `head`'s."""
        event = Resync(seq=head, session_id=self.session_id, last_event_id=head, reason=reason)
        return Frame(head, event.type, event.model_dump_json())

    def subscribe(self) -> Subscriber:
        sub = Subscriber(limit=self._limit)
        self.subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)

    def close_all(self) -> None:
        for sub in self.subscribers:
            sub.close()
        self.subscribers.clear()


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


class Broker:
    """Channels by session id, created on first use with the sequence the event log ended at."""

    def __init__(
        self,
        load_last_seq: Callable[[str], Awaitable[int]],
        sink: Callable[[str, Frame], None],
        subscriber_limit: int,
        *,
        load_frames: LoadFrames | None = None,
        ring_size: int = RING_SIZE,
    ) -> None:
        self._load_last_seq = load_last_seq
        self._load_frames = load_frames
        self._sink = sink
        self._limit = subscriber_limit
        self._ring_size = ring_size
        self._channels: dict[str, Channel] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.closed = False
        self._heartbeat: asyncio.Task[None] | None = None

    async def channel(self, session_id: str) -> Channel:
        existing = self._channels.get(session_id)
        if existing is not None:
            return existing
        lock = self._locks.setdefault(session_id, asyncio.Lock())
        async with lock:
            existing = self._channels.get(session_id)
            if existing is None:
                last = await self._load_last_seq(session_id)
                existing = Channel(session_id, last, self._sink, self._limit, self._ring_size)
                self._channels[session_id] = existing
        self._locks.pop(session_id, None)
        return existing

    async def last_seq(self, session_id: str) -> int:
        """The last event clients can have seen: read it before the history, then subscribe after it."""
        return (await self.channel(session_id)).delivered_seq

    def deliver(self, committed: Sequence[tuple[str, Frame]]) -> None:
        """Called by the write-behind after each commit, with the frames in publication order."""
        by_session: dict[str, list[Frame]] = {}
        for session_id, frame in committed:
            by_session.setdefault(session_id, []).append(frame)
        for session_id, frames in by_session.items():
            channel = self._channels.get(session_id)
            if channel is not None:
                channel.deliver(frames)

    async def subscribe(self, session_id: str, after: int | None) -> Subscription:
        """Live frames from now on, preceded by every frame after `after` (None: live only)."""
        if self.closed:
            raise StreamsClosed("The server is shutting down; reconnect in a moment.")
        channel = await self.channel(session_id)
        sub = channel.subscribe()
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

    async def _older(self, session_id: str, after: int, before: int) -> list[Frame] | None:
        """Frames after < seq < before from the log, or None when it no longer holds all of them."""
        if self._load_frames is None:
            return None
        frames = await self._load_frames(session_id, after, before)
        expected = range(after + 1, before)
        if len(frames) != len(expected) or any(f.seq != s for f, s in zip(frames, expected, strict=True)):
            return None
        return frames

    def drop(self, session_id: str) -> None:
        channel = self._channels.pop(session_id, None)
        if channel is not None:
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
            for channel in self._channels.values():
                for sub in channel.subscribers:
                    sub.ping = True
                    sub.wake()

    def close_all(self) -> None:
        """Shutdown: every stream ends once its buffered frames are sent, and no new one starts."""
        self.closed = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        for channel in self._channels.values():
            channel.close_all()
