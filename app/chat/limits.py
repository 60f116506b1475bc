"""Per-principal limits: concurrent event streams and the message rate, both answered with 429.

Each is a seam (MessageLimit, StreamLimit). The implementations here count in this process's memory: a
single server's. Several replicas (PARLEY_REDIS_URL) count together in Redis (chat.redis_limits), and fall
back on these while Redis is away.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from app.errors import TooManyRequests, TooManyStreams

# A stream has no natural time to wait for: a client may retry once one of its other streams has ended.
STREAM_RETRY_AFTER = 5


class MessageLimit(Protocol):
    """How many messages a principal may post.

    A multi-process implementation must count every replica's messages together (a shared counter, e.g.
    a Redis token bucket updated atomically by a script), refuse at the same threshold whichever replica
    the request lands on, and answer the same Retry-After; when its store is unreachable it must choose
    and document one side (refuse or let through), never fail the request with a 5xx.
    """

    async def take(self, principal: str) -> None:
        """Spends one message of `principal`'s allowance, or raises TooManyRequests with its retry_after."""
        ...


class StreamSlot(Protocol):
    def release(self) -> None:
        """Idempotent: every way a stream ends may call it."""
        ...


class StreamLimit(Protocol):
    """How many event streams a principal may hold open at once.

    A multi-process implementation must count the streams of every replica (a shared counter per
    principal), and a replica that dies must not leak its streams' slots: each slot expires unless its
    replica keeps renewing it, so a crash frees them within the renewal interval.
    """

    async def acquire(self, principal: str) -> StreamSlot:
        """A slot for one more stream, or TooManyStreams with its retry_after."""
        ...

    async def open_count(self, principal: str) -> int:
        """The principal's streams open now."""
        ...

    async def close(self) -> None:
        """At shutdown, once every stream has ended."""
        ...


@dataclass
class _Bucket:
    tokens: float
    at: float


class MessageRate:
    """A token bucket per principal: `per_minute` messages in a burst, refilled at `per_minute` a minute.

    `per_minute` 0 means no limit.
    """

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._capacity = float(per_minute)
        self._per_second = per_minute / 60.0
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    async def take(self, principal: str) -> None:
        """Spends one message of `principal`'s allowance, or raises TooManyRequests with its retry_after."""
        if self._capacity == 0:
            return
        now = self._clock()
        bucket = self._buckets.setdefault(principal, _Bucket(self._capacity, now))
        bucket.tokens = min(self._capacity, bucket.tokens + (now - bucket.at) * self._per_second)
        bucket.at = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return
        wait = max(1, math.ceil((1.0 - bucket.tokens) / self._per_second))
        raise TooManyRequests(
            f"More than {int(self._capacity)} messages a minute; retry in {wait} s.", retry_after=wait
        )


class CountedStreamSlot:
    """One open stream of a principal; `release` is idempotent, so every way a stream ends may call it."""

    def __init__(self, slots: StreamSlots, principal: str) -> None:
        self._slots = slots
        self._principal = principal
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._slots._release(self._principal)


class StreamSlots:
    """Counts each principal's open event streams; `limit` 0 means no limit."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._open: dict[str, int] = {}

    async def open_count(self, principal: str) -> int:
        return self._open.get(principal, 0)

    async def close(self) -> None:
        """Nothing to let go of: the counts live and die with the process."""

    async def acquire(self, principal: str) -> CountedStreamSlot:
        count = self._open.get(principal, 0)
        if self._limit and count >= self._limit:
            raise TooManyStreams(
                f"{count} event streams are open with this key, the limit; close one first.",
                retry_after=STREAM_RETRY_AFTER,
            )
        self._open[principal] = count + 1
        return CountedStreamSlot(self, principal)

    def _release(self, principal: str) -> None:
        count = self._open.get(principal, 0) - 1
        if count > 0:
            self._open[principal] = count
        else:
            self._open.pop(principal, None)
