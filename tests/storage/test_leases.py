"""Turn leases (app.storage.leases) and the fence that checks them (app.streaming.fencing), on SQLite and
PostgreSQL. How it proves it: real migrated databases; the second claim of a session is refused by the
unique partial index itself; a lease is shortened to expire, taken over under a new token, and the old
holder's fenced write then raises LeaseLost and leaves nothing in the database, its refusal counted."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text

from app.storage import leases
from app.storage.engine import Database
from app.streaming.fencing import Fence, Lease, LeaseLost
from tests.support.rows import add_sessions

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    await add_sessions(database, "s_1")
    yield database
    await database.dispose()


async def test_one_running_lease_per_session_renewal_takeover_and_the_fence(database: Database) -> None:
    async with database.session() as db:
        assert await leases.claim(db, "t_1", "s_1", "a", 11, 30.0)
        assert not await leases.claim(db, "t_2", "s_1", "b", 22, 30.0)  # the partial index refuses it
        await db.commit()
    async with database.session() as db:
        assert await leases.renew(db, [11, 99], 30.0) == {11: False}
        assert (await leases.request_cancel(db, "s_1")) == leases.LeaseRecord("t_1", "s_1", 11)
        assert await leases.renew(db, [11], 30.0) == {11: True}
        assert await leases.expired(db) == []
        await (await db.connection()).execute(text("UPDATE turn_leases SET expires_at = expires_at - 60"))
        [gone] = await leases.expired(db)
        assert await leases.renew(db, [11], 30.0) == {}  # expired: not renewed
        assert await leases.take_over(db, gone, "b", 33, 30.0)
        assert not await leases.take_over(db, gone, "c", 44, 30.0)  # once only
        await db.commit()
    fence = Fence()
    lost: list[str] = []
    fence.on_lost = lambda lease: lost.append(lease.turn_id)
    fence.hold(Lease("t_1", "s_1", 11))
    async with database.session() as db:
        with pytest.raises(LeaseLost):
            await fence.guard(db, "s_1", "t_1", final=True)
    assert (lost, fence.rejected, fence.held()) == (["t_1"], 1, [])
    fence.hold(Lease("t_1", "s_1", 33))  # the new holder's close releases it
    async with database.session() as db:
        assert await fence.guard(db, "s_1", "t_1", final=True)
        await db.commit()
        assert await leases.state_of(db, "t_1") == "done"
        assert await leases.sessions_waiting_without_turn(db) == []
        assert await leases.running_turn_ids(db) == set()
        # Released: the session may run its next turn.
        assert await leases.claim(db, "t_2", "s_1", "b", 55, 30.0)
