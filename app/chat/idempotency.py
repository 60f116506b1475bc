"""Idempotency-Key handling: a retried POST returns the first answer instead of doing the work twice.

The key is scoped to the caller. Before the work starts, a row reserves the id of the resource the
request creates; the answer is stored when the work is done. A retry with the same key and body gets the
stored answer; one that finds only the reservation (the first attempt crashed half-way) redoes the work
with the reserved id, so the resource is created at most once.

Requests that race with one key share the first attempt: each waits for it and gets its answer, whether
that is the resource or a refusal (a 4xx, the same status and code for every racer). A refusal stored
nothing, so it releases the key: a later retry is a new attempt (a `reject` that met a running turn may
succeed once the turn has ended). An attempt that dies without an answer (a crash, a cancelled request,
a 5xx) hands the work to the next racer, which resumes it with the reserved id.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from app.errors import DomainError
from app.storage import repository
from app.storage.engine import Database
from app.storage.tables import IdempotencyKeyRow

MAX_KEY_LENGTH = 255
# Printable ASCII, no space at either end (HTTP strips it): the header's documented format.
KEY_PATTERN = r"^[\x21-\x7e]([\x20-\x7e]{0,253}[\x21-\x7e])?$"
_KEY = re.compile(KEY_PATTERN)
T = TypeVar("T", bound=BaseModel)
_PRUNE_EVERY = 60.0
# Multi-replica mode: how often a request reads the row of a racing attempt on another replica.
RACE_POLL_SECONDS = 0.05


class IdempotencyKeyReused(DomainError):
    code = "idempotency_key_reused"


class InvalidIdempotencyKey(DomainError):
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


def _reused() -> IdempotencyKeyReused:
    return IdempotencyKeyReused(
        "This Idempotency-Key was used with a different request; use a new key for a new request.",
        details={"header": "Idempotency-Key"},
    )


def check_key(key: str) -> str:
    if not _KEY.fullmatch(key):
        raise InvalidIdempotencyKey(
            f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} printable ASCII characters.",
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


@dataclass
class _Attempt:
    """The attempt that holds a key in this process: racers with the same key wait for its outcome."""

    fingerprint: str
    outcome: asyncio.Future[BaseModel] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Idempotency:
    """Today's store: rows in the database, and the attempt in flight per key in this process, whose
    outcome racing duplicates share."""

    def __init__(self, database: Database, *, ttl_seconds: float, race_wait: float = 0.0) -> None:
        """`race_wait` (multi-replica mode): seconds a request waits for an attempt with its key that holds
        the reservation without an answer yet, since that attempt may run on another replica; a
        reservation older than that is an attempt that died, and is resumed at once."""
        self._database = database
        self._ttl = ttl_seconds
        self._race_wait = race_wait
        self._attempts: dict[tuple[str, str], _Attempt] = {}
        self._pruned_at = 0.0

    async def _join(self, slot: tuple[str, str], request_fingerprint: str) -> BaseModel | None:
        """The answer of the attempt in flight with this key, once it has one (its refusal is raised);
        None once no attempt is in flight, or the one there died without an answer."""
        while (attempt := self._attempts.get(slot)) is not None:
            if attempt.fingerprint != request_fingerprint:
                raise _reused()
            try:
                return await asyncio.shield(attempt.outcome)
            except DomainError:
                raise  # its refusal: every racer gets the same error
            except (Exception, asyncio.CancelledError):
                if not attempt.outcome.done():
                    raise  # this request itself was cancelled while it waited
                # It died without an answer: a racer takes the work over, with the reserved id.
        return None

    async def reserve(
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
        if row.response is None and self._race_wait and row.fingerprint == request_fingerprint:
            found = await self._answer_elsewhere(row)
            if found is None:  # the other attempt was refused and released the key: try again
                return await self.reserve(principal, key, request_fingerprint, new_id)
            row = found
        if row.fingerprint != request_fingerprint:
            raise _reused()
        replay = json.loads(row.response) if row.response is not None else None
        return Reservation(principal, key, row.resource_id, replay=replay, resumed=replay is None)

    async def _answer_elsewhere(self, row: IdempotencyKeyRow) -> IdempotencyKeyRow | None:
        """The key's row once its attempt (on any replica) answered, or it is old enough to have died;
        None when the attempt released the key."""
        found: IdempotencyKeyRow | None = row
        while found is not None and found.response is None and time.time() < row.created_at + self._race_wait:
            await asyncio.sleep(RACE_POLL_SECONDS)
            async with self._database.session() as db:
                found = await repository.get_idempotency_key(db, row.principal, row.key)
        return found

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

        A racer gets the answer of the attempt in flight; a retry gets the stored answer (`load`); one
        that finds only the reservation (the first attempt died before answering) first looks for what
        that attempt may have created with the reserved id (`find`), and creates it (`create`) only if
        it is not there. A refusal (a DomainError not `server_side`) stored nothing and releases the key."""
        slot = (principal, check_key(key))
        shared = await self._join(slot, request_fingerprint)
        if shared is not None:
            return load(shared.model_dump(mode="json")), True
        # No await since _join saw the slot free: this request is now the attempt the others join.
        attempt = _Attempt(request_fingerprint)
        self._attempts[slot] = attempt
        try:
            res = await self.reserve(principal, key, request_fingerprint, new_id)
            if res.replay is not None:
                answer, replayed = load(res.replay), True
            else:
                existing = await find(res.resource_id) if res.resumed else None
                answer = existing if existing is not None else await create(res.resource_id)
                replayed = existing is not None
                await self.complete(res, status_code, answer.model_dump_json())
            attempt.outcome.set_result(answer)
            return answer, replayed
        except DomainError as refusal:
            if not refusal.server_side:
                await self._release(principal, key, request_fingerprint)
                attempt.outcome.set_exception(refusal)
                attempt.outcome.exception()  # retrieved: racers may read it, none has to
            raise
        finally:
            if not attempt.outcome.done():
                attempt.outcome.cancel()  # died without an answer: a racer takes the work over
            if self._attempts.get(slot) is attempt:
                del self._attempts[slot]

    async def _release(self, principal: str, key: str, request_fingerprint: str) -> None:
        """Forgets an unanswered reservation of this request: the key is unused again."""
        async with self._database.session() as db:
            row = await repository.get_idempotency_key(db, principal, key)
            if row is not None and row.response is None and row.fingerprint == request_fingerprint:
                await db.delete(row)
                await db.commit()

    async def complete(self, reservation: Reservation, status_code: int, body: str) -> None:
        async with self._database.session() as db:
            row = await repository.get_idempotency_key(db, reservation.principal, reservation.key)
            if row is None:
                return
            row.status_code = status_code
            row.response = body
            db.add(row)
            await db.commit()
