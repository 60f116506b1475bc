"""The Idempotency-Key store against a real migrated SQLite file: reservations won by an atomic insert.

Within one store (one process) racing attempts with one key do the work once and the others get its
answer. Two stores on one database stand for two processes (each has its own locks, so only the database
keeps them apart): exactly one reservation wins, and no attempt fails on the key. An expired key is
reserved anew.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest
from pydantic import BaseModel

from app.chat.idempotency import Idempotency, fingerprint
from app.storage.engine import Database

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


class Answer(BaseModel):
    id: str


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    db = Database(database_url)
    yield db
    await db.dispose()


async def test_racing_attempts_do_the_work_once(database: Database) -> None:
    store = Idempotency(database, ttl_seconds=3600)
    created: list[str] = []
    ids = (f"r_{n}" for n in itertools.count())
    request = fingerprint("POST", "/v1/x", {"a": 1})

    async def attempt() -> tuple[Answer, bool]:
        async def create(resource_id: str) -> Answer:
            await asyncio.sleep(0.05)  # the work takes a while: the others race it
            created.append(resource_id)
            return Answer(id=resource_id)

        async def find(resource_id: str) -> Answer | None:
            return Answer(id=resource_id) if resource_id in created else None

        return await store.once(
            "p", "key-1", request, lambda: next(ids), find=find, create=create,
            load=Answer.model_validate, status_code=201,
        )  # fmt: skip

    answers = await asyncio.gather(*(attempt() for _ in range(6)))
    assert len(created) == 1
    assert {answer.id for answer, _ in answers} == {created[0]}
    assert sorted(replayed for _, replayed in answers) == [False] + [True] * 5


async def test_racing_reservations_of_two_processes_elect_one(database: Database) -> None:
    """Get-then-insert let both read 'free' and one fail on the primary key; the atomic insert elects one
    and the other reads its reservation."""
    stores = [Idempotency(database, ttl_seconds=3600) for _ in range(2)]
    ids = iter(["r_a", "r_b"])
    request = fingerprint("POST", "/v1/x", {})

    async def reserve(store: Idempotency) -> tuple[str, bool]:
        reservation = await store.reserve("p", "key-3", request, lambda: next(ids))
        return reservation.resource_id, reservation.resumed

    results = await asyncio.gather(*(reserve(store) for store in stores))
    assert len({resource_id for resource_id, _ in results}) == 1
    assert sorted(resumed for _, resumed in results) == [False, True]


async def test_a_key_past_its_ttl_is_reserved_anew(database: Database) -> None:
    # Long enough that the replay right after the first attempt is within it on a loaded PostgreSQL (0.2 s
    # was not: the replay found the key expired), then waited out.
    store = Idempotency(database, ttl_seconds=2.0)
    ids = (f"r_{n}" for n in itertools.count())
    request = fingerprint("POST", "/v1/x", {})

    async def attempt() -> tuple[Answer, bool]:
        async def create(resource_id: str) -> Answer:
            return Answer(id=resource_id)

        async def find(resource_id: str) -> Answer | None:
            return None

        return await store.once(
            "p", "key-2", request, lambda: next(ids), find=find, create=create,
            load=Answer.model_validate, status_code=201,
        )  # fmt: skip

    first, replayed = await attempt()
    assert (first.id, replayed) == ("r_0", False)
    assert await attempt() == (first, True)
    await asyncio.sleep(2.1)
    second, replayed = await attempt()
    assert (second.id, replayed) == ("r_2", False)  # r_1 was drawn by the attempt that replayed


async def test_an_attempt_that_dies_hands_the_work_to_a_racer(database: Database) -> None:
    """The first attempt dies after reserving (no answer, not a refusal): one racer takes the work over
    with the reserved id, the others get its answer; the resource is created once."""
    store = Idempotency(database, ttl_seconds=3600)
    created: list[str] = []
    ids = (f"r_{n}" for n in itertools.count())
    request = fingerprint("POST", "/v1/x", {})
    calls = itertools.count()

    async def create(resource_id: str) -> Answer:
        await asyncio.sleep(0.05)
        if next(calls) == 0:
            raise RuntimeError("the first attempt dies")
        created.append(resource_id)
        return Answer(id=resource_id)

    async def find(resource_id: str) -> Answer | None:
        return Answer(id=resource_id) if resource_id in created else None

    async def attempt() -> tuple[Answer, bool]:
        return await store.once(
            "p", "key-4", request, lambda: next(ids), find=find, create=create,
            load=Answer.model_validate, status_code=201,
        )  # fmt: skip

    results = await asyncio.gather(*(attempt() for _ in range(4)), return_exceptions=True)
    assert isinstance(results[0], RuntimeError)
    answers = [r for r in results[1:] if not isinstance(r, BaseException)]
    assert created == ["r_0"]
    assert [answer.id for answer, _ in answers] == ["r_0"] * 3
