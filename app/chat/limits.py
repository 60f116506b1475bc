"""Per-principal limits: concurrent event streams and the message rate, both answered with 429.

Both are kept in this process's memory: behind a load balancer each instance counts its own.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.errors import TooManyRequests

# A stream has no natural time to wait for: a client may retry once one of its other streams has ended.
STREAM_RETRY_AFTER = 5


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

    def take(self, principal: str) -> None:
        """Spends one message of `principal`'s allowance, or raises TooManyRequests with Retry-After."""
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


class StreamLease:
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

    def open_count(self, principal: str) -> int:
        return self._open.get(principal, 0)

    def acquire(self, principal: str) -> StreamLease:
        count = self._open.get(principal, 0)
        if self._limit and count >= self._limit:
            raise TooManyRequests(
                f"{count} event streams are open with this key, the limit; close one first.",
                retry_after=STREAM_RETRY_AFTER,
                code="too_many_streams",
            )
        self._open[principal] = count + 1
        return StreamLease(self, principal)

    def _release(self, principal: str) -> None:
        count = self._open.get(principal, 0) - 1
        if count > 0:
            self._open[principal] = count
        else:
            self._open.pop(principal, None)
