"""The per-principal limits counted across replicas (PARLEY_REDIS_URL): every replica's messages and
streams together, under the replicas' shared key prefix.

- Messages: a token bucket per principal (`<prefix>:limit:messages:<principal>`), updated by one Lua
  script on Redis's own clock: the same threshold and the same Retry-After wherever the request lands,
  and no race between two replicas reading and writing the bucket.
- Streams: a sorted set per principal (`<prefix>:limit:streams:<principal>`) whose members are the open
  streams' slots, each scored with its expiry. A script drops the expired slots, counts the rest and adds
  the new one atomically. The replica renews its slots every heartbeat and removes one when its stream
  ends, by every way it ends (the lease's idempotent `release`); a replica that dies stops renewing, so
  its slots stop counting within PARLEY_LEASE_SECONDS, the window its turns' leases have. A sorted set
  rather than a key per slot: counting is one ZCARD, not a scan.

When Redis cannot be reached, the limits let requests through, counted in this process's memory (as a
single server counts them): a cache outage must not refuse every message, and the process's own count
still bounds a flood at the limit times the replicas. Each decision taken so is counted in
`parley_limits_redis_unavailable_total`, and the outage is logged once when it starts and once when it
ends. After a failure Redis is tried again only after OUTAGE_RETRY seconds, so an unreachable server
does not add its timeout to every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.chat.limits import STREAM_RETRY_AFTER, MessageRate, StreamSlot, StreamSlots
from app.errors import TooManyRequests, TooManyStreams
from app.observability.hooks import limits_without_redis
from app.streaming.redis.relay import redis_client

log = logging.getLogger(__name__)

# Seconds a limit waits on Redis before deciding without it.
REDIS_TIMEOUT = 1.0
# Seconds after a failure before Redis is asked again.
OUTAGE_RETRY = 2.0

_ERRORS = (RedisError, OSError, TimeoutError)

# KEYS[1] the bucket; ARGV[1] the messages a minute. Returns {1, 0} (taken) or {0, seconds to wait}.
_TAKE = """
local capacity = tonumber(ARGV[1])
local per_second = capacity / 60.0
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or capacity
local at = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - at) * per_second)
local taken = 0
if tokens >= 1 then
  tokens = tokens - 1
  taken = 1
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens), 'at', string.format('%.6f', now))
redis.call('EXPIRE', KEYS[1], 120)
if taken == 1 then
  return {1, 0}
end
return {0, math.max(1, math.ceil((1 - tokens) / per_second))}
"""

# KEYS[1] the principal's slots; ARGV: the limit, the slot's id, its lifetime in ms.
# Returns {1, open streams with it} or {0, open streams}.
_ACQUIRE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local open = redis.call('ZCARD', KEYS[1])
if open >= tonumber(ARGV[1]) then
  return {0, open}
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) * 2)
return {1, open + 1}
"""

# KEYS: principals' slot sets; ARGV[1] the lifetime in ms, then per key: how many slots, their ids.
_RENEW = """
local clock = redis.call('TIME')
local until_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000) + tonumber(ARGV[1])
local at = 2
for i, key in ipairs(KEYS) do
  local n = tonumber(ARGV[at])
  for j = 1, n do
    redis.call('ZADD', key, until_ms, ARGV[at + j])
  end
  redis.call('PEXPIRE', key, tonumber(ARGV[1]) * 2)
  at = at + n + 1
end
return 0
"""

_COUNT = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
"""


class _Store:
    """The Redis client the limits share, and whether it is to be asked now (an outage's state)."""

    def __init__(self, url: str, prefix: str) -> None:
        self.prefix = prefix
        # REDIS_TIMEOUT bounds each call here (asyncio.timeout, no task of its own): redis-py's socket timeout
        # would send every command from a task under asyncio.wait_for, a loop turn later, on every POST.
        self.client: Redis = redis_client(url, socket_timeout=None, client_name=f"{prefix}:limits")
        self._down_until = 0.0
        self._down = False

    def key(self, kind: str, principal: str) -> str:
        return f"{self.prefix}:limit:{kind}:{principal}"

    def usable(self) -> bool:
        return time.monotonic() >= self._down_until

    def failed(self, exc: BaseException) -> None:
        self._down_until = time.monotonic() + OUTAGE_RETRY
        if not self._down:
            self._down = True
            log.warning(
                "limits: Redis unreachable (%s); messages and streams are counted in this process "
                "until it answers",
                exc,
            )

    def answered(self) -> None:
        if self._down:
            self._down = False
            log.warning("limits: Redis answers; messages and streams are counted across replicas again")

    async def run(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        """The script's answer; raises one of _ERRORS (noted as an outage) when Redis does not give it."""
        try:
            async with asyncio.timeout(REDIS_TIMEOUT):
                found = await script(keys=keys, args=args)
        except _ERRORS as exc:
            self.failed(exc)
            raise
        self.answered()
        return found


class RedisMessageRate:
    """MessageLimit across replicas: `per_minute` messages in a burst, refilled at `per_minute` a minute."""

    def __init__(self, store: _Store, per_minute: int) -> None:
        self._store = store
        self._per_minute = per_minute
        self._script = store.client.register_script(_TAKE)
        self._local = MessageRate(per_minute)

    async def take(self, principal: str) -> None:
        if self._per_minute == 0:
            return
        if self._store.usable():
            try:
                taken, wait = await self._store.run(
                    self._script, [self._store.key("messages", principal)], [self._per_minute]
                )
            except _ERRORS:
                pass
            else:
                if int(taken):
                    return
                raise TooManyRequests(
                    f"More than {self._per_minute} messages a minute; retry in {int(wait)} s.",
                    retry_after=int(wait),
                )
        limits_without_redis("messages")
        await self._local.take(principal)


class _Slot:
    """One open stream's slot in Redis; `release` is idempotent (every way a stream ends may call it)."""

    def __init__(self, limit: RedisStreamSlots, principal: str, slot_id: str) -> None:
        self._limit = limit
        self.principal = principal
        self.slot_id = slot_id
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._limit._release(self)


class RedisStreamSlots:
    """StreamLimit across replicas; `limit` 0 means no limit (nothing is asked of Redis then)."""

    def __init__(self, store: _Store, limit: int, lifetime: float, renew_every: float) -> None:
        self._store = store
        self._limit = limit
        self._lifetime_ms = max(1, int(lifetime * 1000))
        self._renew_every = renew_every
        self._acquire = store.client.register_script(_ACQUIRE)
        self._renew = store.client.register_script(_RENEW)
        self._count = store.client.register_script(_COUNT)
        self._local = StreamSlots(limit)
        self._held: dict[str, _Slot] = {}
        # Releases and renewals go through one task, in order: a renewal sent before a release cannot
        # land after it and bring the released slot back. A renewal adds a slot again if it expired
        # meanwhile (Redis was away past its lifetime): the stream is open, so it counts.
        self._released: list[_Slot] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    async def acquire(self, principal: str) -> StreamSlot:
        if self._limit and self._store.usable():
            slot_id = uuid.uuid4().hex
            key = self._store.key("streams", principal)
            try:
                taken, open_now = await self._store.run(
                    self._acquire, [key], [self._limit, slot_id, self._lifetime_ms]
                )
            except _ERRORS:
                pass
            else:
                if not int(taken):
                    raise TooManyStreams(
                        f"{int(open_now)} event streams are open with this key, the limit; close one first.",
                        retry_after=STREAM_RETRY_AFTER,
                    )
                if self._task is None:
                    self._task = asyncio.get_running_loop().create_task(
                        self._keep(), name="limits-stream-slots"
                    )
                slot = self._held[slot_id] = _Slot(self, principal, slot_id)
                return slot
        if self._limit:
            limits_without_redis("streams")
        return await self._local.acquire(principal)

    async def open_count(self, principal: str) -> int:
        """Every replica's streams of the principal (this process's own while Redis is away)."""
        if self._limit and self._store.usable():
            with contextlib.suppress(*_ERRORS):
                found = await self._store.run(self._count, [self._store.key("streams", principal)], [])
                return int(found) + await self._local.open_count(principal)
        return await self._local.open_count(principal)

    def _release(self, slot: _Slot) -> None:
        self._held.pop(slot.slot_id, None)
        self._released.append(slot)
        self._wake.set()

    async def _keep(self) -> None:
        renewed = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self._renew_every)
            self._wake.clear()
            if self._closing:
                return
            released, self._released = self._released, []
            due = time.monotonic() - renewed >= self._renew_every
            try:
                if released:
                    await self._remove(released)
                if due:
                    renewed = time.monotonic()
                    await self._renew_held()
            except _ERRORS as exc:
                # Those not removed expire by themselves: nothing renews them any more.
                self._store.failed(exc)

    async def _remove(self, released: list[_Slot]) -> None:
        pipe = self._store.client.pipeline(transaction=False)
        for slot in released:
            pipe.zrem(self._store.key("streams", slot.principal), slot.slot_id)
        async with asyncio.timeout(REDIS_TIMEOUT):
            await pipe.execute()

    async def _renew_held(self) -> None:
        by_principal: dict[str, list[str]] = {}
        for slot in list(self._held.values()):
            by_principal.setdefault(slot.principal, []).append(slot.slot_id)
        if not by_principal:
            return
        keys: list[str] = []
        args: list[int | str] = [self._lifetime_ms]
        for principal, ids in by_principal.items():
            keys.append(self._store.key("streams", principal))
            args.extend([len(ids), *ids])
        await self._store.run(self._renew, keys, args)

    async def close(self) -> None:
        """At shutdown, after the streams ended: their last releases are sent, then the client closed."""
        # Asked to end rather than cancelled: a cancel landing inside a Redis call can come out of the
        # client as a connection error, which the loop survives.
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        released, self._released = self._released + list(self._held.values()), []
        if released and self._store.usable():
            with contextlib.suppress(*_ERRORS):
                await self._remove(released)
        await self._store.client.aclose()


def redis_limits(
    url: str, prefix: str, per_minute: int, streams: int, *, lifetime: float, renew_every: float
) -> tuple[RedisMessageRate, RedisStreamSlots]:
    """The two limits on one client: messages a minute, and streams held by each principal."""
    store = _Store(url, prefix)
    return RedisMessageRate(store, per_minute), RedisStreamSlots(store, streams, lifetime, renew_every)
