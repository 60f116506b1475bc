"""Per-principal limits: the message token bucket and the stream slots."""

from __future__ import annotations

import pytest

from app.chat.limits import STREAM_RETRY_AFTER, MessageRate, StreamSlots
from app.errors import TooManyRequests

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_burst_of_the_minute_s_allowance_then_429_with_the_wait() -> None:
    clock = Clock()
    rate = MessageRate(3, clock=clock)
    for _ in range(3):
        await rate.take("alice")
    with pytest.raises(TooManyRequests) as refused:
        await rate.take("alice")
    assert refused.value.code == "rate_limited"
    assert refused.value.retry_after == 20  # one message every 20 s at 3 a minute
    assert refused.value.details == {"retry_after": 20}
    await rate.take("bob")  # another principal has its own allowance


async def test_the_allowance_refills_at_the_rate_and_never_beyond_the_burst() -> None:
    clock = Clock()
    rate = MessageRate(60, clock=clock)
    for _ in range(60):
        await rate.take("alice")
    clock.now += 0.5
    with pytest.raises(TooManyRequests) as refused:
        await rate.take("alice")
    assert refused.value.retry_after == 1
    clock.now += 0.5
    await rate.take("alice")
    clock.now += 3600
    for _ in range(60):
        await rate.take("alice")
    with pytest.raises(TooManyRequests):
        await rate.take("alice")


async def test_zero_means_no_message_limit() -> None:
    rate = MessageRate(0)
    for _ in range(1000):
        await rate.take("alice")


async def test_stream_slots_per_principal() -> None:
    slots = StreamSlots(2)
    first, second = await slots.acquire("alice"), await slots.acquire("alice")
    with pytest.raises(TooManyRequests) as refused:
        await slots.acquire("alice")
    assert refused.value.code == "too_many_streams"
    assert refused.value.retry_after == STREAM_RETRY_AFTER
    await slots.acquire("bob")
    first.release()
    first.release()  # idempotent: every way a stream ends may release it
    assert await slots.open_count("alice") == 1
    await slots.acquire("alice")
    second.release()
    assert await slots.open_count("alice") == 1


async def test_zero_means_no_stream_limit() -> None:
    slots = StreamSlots(0)
    leases = [await slots.acquire("alice") for _ in range(100)]
    for lease in leases:
        lease.release()
    assert await slots.open_count("alice") == 0
