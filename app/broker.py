"""Per-session event channels: sequence numbers, fan-out to subscribers, and the write-behind event log.

Each event is serialized once into a Frame; every subscriber gets the same Frame through its own bounded
buffer. A subscriber that falls too far behind is dropped (it resumes by Last-Event-ID) rather than ever
slowing the agent or the other subscribers.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from app.events import _Event


@dataclass(frozen=True, slots=True)
class Frame:
    seq: int
    type: str
    data: str


@dataclass(eq=False, slots=True)
class Subscriber:
    limit: int
    buffer: deque[Frame] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    overflowed: bool = False
    closed: bool = False

    def push(self, frame: Frame) -> bool:
        if len(self.buffer) >= self.limit:
            self.overflowed = True
            self.wake.set()
            return False
        self.buffer.append(frame)
        self.wake.set()
        return True

    def close(self) -> None:
        self.closed = True
        self.wake.set()

    async def next_batch(self) -> list[Frame] | None:
        """Frames in order; None when the subscription ended (overflow or close)."""
        while not self.buffer:
            if self.overflowed or self.closed:
                return None
            self.wake.clear()
            await self.wake.wait()
        batch = list(self.buffer)
        self.buffer.clear()
        return batch


class Channel:
    def __init__(
        self, session_id: str, last_seq: int, sink: Callable[[str, Frame], None], limit: int
    ) -> None:
        self.session_id = session_id
        self.last_seq = last_seq
        self._sink = sink
        self._limit = limit
        self.subscribers: set[Subscriber] = set()

    def publish(self, cls: type[_Event], **fields: Any) -> Frame:
        """Builds the event with the next sequence number, then hands its one serialization to everyone."""
        self.last_seq += 1
        event = cls(seq=self.last_seq, session_id=self.session_id, **fields)
        frame = Frame(self.last_seq, event.type, event.model_dump_json())
        self._sink(self.session_id, frame)
        dropped = [sub for sub in self.subscribers if not sub.push(frame)]
        for sub in dropped:
            self.subscribers.discard(sub)
        return frame

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


class Broker:
    """Channels by session id, created on first use with the sequence the event log ended at."""

    def __init__(
        self,
        load_last_seq: Callable[[str], Awaitable[int]],
        sink: Callable[[str, Frame], None],
        subscriber_limit: int,
    ) -> None:
        self._load_last_seq = load_last_seq
        self._sink = sink
        self._limit = subscriber_limit
        self._channels: dict[str, Channel] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def channel(self, session_id: str) -> Channel:
        existing = self._channels.get(session_id)
        if existing is not None:
            return existing
        lock = self._locks.setdefault(session_id, asyncio.Lock())
        async with lock:
            existing = self._channels.get(session_id)
            if existing is None:
                last = await self._load_last_seq(session_id)
                existing = Channel(session_id, last, self._sink, self._limit)
                self._channels[session_id] = existing
        self._locks.pop(session_id, None)
        return existing

    def drop(self, session_id: str) -> None:
        channel = self._channels.pop(session_id, None)
        if channel is not None:
            channel.close_all()

    def close_all(self) -> None:
        for channel in self._channels.values():
            channel.close_all()
