"""Idempotency-Key handling: a retried POST returns the first answer instead of doing the work twice.

The key is scoped to the caller. Before the work starts, a row reserves the id of the resource the
request creates; the answer is stored when the work is done. A retry with the same key and body gets the
stored answer; one that finds only the reservation (the first attempt crashed or failed) redoes the work
with the reserved id, so the resource is created at most once. Concurrent requests with one key are
serialized by a lock, so racing duplicates also get the first answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from app.errors import ApiError
from app.storage import repository
from app.storage.engine import Database
from app.storage.tables import IdempotencyKeyRow

MAX_KEY_LENGTH = 255
T = TypeVar("T", bound=BaseModel)
_PRUNE_EVERY = 60.0


class IdempotencyKeyReused(ApiError):
    status = 422
    code = "idempotency_key_reused"


class InvalidIdempotencyKey(ApiError):
    code = "invalid_idempotency_key"


@dataclass
class Reservation:
    principal: str
    key: str
    resource_id: str
    # The stored answer of an earlier attempt with the same key and body.
    replay: dict[str, Any] | None
    # True when an earlier attempt reserved the id but never answered (crashed or failed).
    resumed: bool


def fingerprint(method: str, path: str, body: Any) -> str:
    canonical = json.dumps([method, path, body], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def check_key(key: str) -> str:
    if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
        raise InvalidIdempotencyKey(
            f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} printable characters.",
            details={"header": "Idempotency-Key"},
        )
    return key


class IdempotencyStore(Protocol):
    """Idempotency-Key handling behind the use cases (see the module docstring).

    A multi-process implementation must guarantee, whichever replica each attempt lands on: one
    reservation per (principal, key), won by an atomic insert (`INSERT ... ON CONFLICT DO NOTHING`);
    the work done at most once, with the reserved id; a retry that finds the answer gets it; a retry
    racing the first attempt waits for that attempt's answer (a shared lock or polling the row) instead
    of doing the work or failing; an attempt that died leaves a reservation the next retry resumes.
    """

    async def once(
        self,
        principal: str,
        key: str,
        request_fingerprint: str,
        new_id: Callable[[], str],
        *,
        find: Callable[[str], Awaitable[T | None]],
        create: Callable[[str], Awaitable[T]],
        load: Callable[[dict[str, Any]], T],
        status_code: int,
    ) -> tuple[T, bool]: ...


class Idempotency:
    """Today's store: rows in the database, and a lock per key in this process that makes racing
    duplicates wait for the first attempt's answer."""

    def __init__(self, database: Database, *, ttl_seconds: float) -> None:
        self._database = database
        self._ttl = ttl_seconds
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._pruned_at = 0.0

    @asynccontextmanager
    async def reserve(
        self, principal: str, key: str, request_fingerprint: str, new_id: Callable[[], str]
    ) -> AsyncIterator[Reservation]:
        slot = (principal, key)
        lock = self._locks.setdefault(slot, asyncio.Lock())
        try:
            async with lock:
                yield await self._reserve(principal, key, request_fingerprint, new_id)
        finally:
            if not lock.locked() and self._locks.get(slot) is lock:
                del self._locks[slot]

    async def _reserve(
        self, principal: str, key: str, request_fingerprint: str, new_id: Callable[[], str]
    ) -> Reservation:
        now = time.time()
        async with self._database.session() as db:
            if now - self._pruned_at > _PRUNE_EVERY:
                self._pruned_at = now
                await repository.prune_idempotency_keys(db, created_before=now - self._ttl)
            mine = IdempotencyKeyRow(
                principal=principal,
                key=key,
                fingerprint=request_fingerprint,
                resource_id=new_id(),
                created_at=now,
            )
            won = await repository.reserve_idempotency_key(db, mine, expired_before=now - self._ttl)
            row = mine if won else await repository.get_idempotency_key(db, principal, key)
            await db.commit()
        if won:
            return Reservation(principal, key, mine.resource_id, replay=None, resumed=False)
        assert row is not None  # held by another request: its row, read in the same transaction
        if row.fingerprint != request_fingerprint:
            raise IdempotencyKeyReused(
                "This Idempotency-Key was used with a different request; use a new key for a new request.",
                details={"header": "Idempotency-Key"},
            )
        replay = json.loads(row.response) if row.response is not None else None
        return Reservation(principal, key, row.resource_id, replay=replay, resumed=replay is None)

    async def once(
        self,
        principal: str,
        key: str,
        request_fingerprint: str,
        new_id: Callable[[], str],
        *,
        find: Callable[[str], Awaitable[T | None]],
        create: Callable[[str], Awaitable[T]],
        load: Callable[[dict[str, Any]], T],
        status_code: int,
    ) -> tuple[T, bool]:
        """Does the request's work at most once per key: the answer, and whether it is a replay.

        A retry gets the stored answer (`load`); one that finds only the reservation (the first attempt
        died before answering) first looks for what that attempt may have created with the reserved id
        (`find`), and creates it (`create`) only if it is not there."""
        async with self.reserve(principal, check_key(key), request_fingerprint, new_id) as res:
            if res.replay is not None:
                return load(res.replay), True
            existing = await find(res.resource_id) if res.resumed else None
            answer = existing if existing is not None else await create(res.resource_id)
            await self.complete(res, status_code, answer.model_dump_json())
            return answer, existing is not None

    async def complete(self, reservation: Reservation, status_code: int, body: str) -> None:
        async with self._database.session() as db:
            row = await repository.get_idempotency_key(db, reservation.principal, reservation.key)
            if row is None:
                return
            row.status_code = status_code
            row.response = body
            db.add(row)
            await db.commit()
