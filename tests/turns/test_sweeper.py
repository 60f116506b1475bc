"""The sweeper of a replica that is shutting down takes nothing over (issue 16). The drain starts at
SIGTERM, before the lifespan stops the sweeper; a turn waiting for answers is let go (its lease expired at
once) for another replica to take. Seen in CI: the stopping replica's own sweep took the lease back,
resumed the turn in a runner that was closing, and the survivor could take it only once that new lease
ran out. How it proves it: a real migrated database, a lease expired as `let_go` expires it, a sweep by a
closing runner: the lease keeps its token and owner, and no waiting message is started.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import cast

import pytest

from app.settings import Settings
from app.storage import leases
from app.storage.engine import Database
from app.streaming.log.fencing import Fence
from app.streaming.log.write_behind import WriteBehind
from app.turns.live import LocalLiveStatus
from app.turns.replicas.lease import LeaseKeeper
from app.turns.replicas.sweeper import Sweeper
from app.turns.runtime.runner import Runner
from tests.storage.test_leases import NO_WAIT_SECONDS, until_expired
from tests.support.postgres import ScratchDatabase
from tests.support.rows import add_sessions

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


class ClosingRunner:
    """What the sweeper asks of a runner, on a replica whose drain has begun."""

    closing = True

    def __init__(self) -> None:
        self.taken: list[str] = []

    def runs_turn(self, turn_id: str) -> bool:
        return False  # its turn ended: the shutdown stopped it and let its lease go

    async def take_waiting(self, session_id: str) -> None:
        self.taken.append(session_id)


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    await add_sessions(database, "s_1")
    yield database
    await database.dispose()


async def test_a_closing_replica_does_not_take_back_the_lease_it_let_go(database: Database) -> None:
    settings = Settings(database_url="sqlite+aiosqlite:///unused.db", lease_seconds=120)
    keeper = LeaseKeeper(settings, database, Fence())
    runner = ClosingRunner()
    sweeper = Sweeper(database, WriteBehind(database), LocalLiveStatus(), cast(Runner, runner), keeper)
    async with database.session() as db:
        lease = await keeper.claim(db, "s_1", "t_waits")
        await leases.expire(db, lease.token)  # what let_go does at the drain
        await db.commit()
    assert await sweeper.sweep() == 0
    async with database.session() as db:
        [left] = await leases.expired(db)
    assert left == leases.LeaseRecord("t_waits", "s_1", lease.token)  # still the next survivor's to take
    assert runner.taken == []


class SweepingRunner:
    """What the sweeper asks of a runner, on a replica that runs none of the leased turns."""

    closing = False

    def __init__(self) -> None:
        self.taken: list[str] = []

    def runs_turn(self, turn_id: str) -> bool:
        return False

    async def take_waiting(self, session_id: str) -> None:
        self.taken.append(session_id)


async def test_a_sweep_goes_past_a_lease_its_owner_holds_locked(postgres_database: ScratchDatabase) -> None:
    """Issue 31 §3: the owner of two expired leases is paused inside its write-behind's check of one of
    them (the row locked to its commit). A sweep takes the other over at once and closes it, leaving the
    locked one (old owner, old token) to the next pass instead of waiting for the statement timeout;
    once the owner's transaction is gone (PostgreSQL ends a paused one), the next pass takes it too."""
    database = Database(postgres_database.url)
    await add_sessions(database, "s_1", "s_2")
    settings = Settings(database_url=postgres_database.url, lease_seconds=30)
    runner = SweepingRunner()
    keeper = LeaseKeeper(settings, database, Fence())
    sweeper = Sweeper(database, WriteBehind(database), LocalLiveStatus(), cast(Runner, runner), keeper)
    try:
        async with database.session() as db:
            assert await leases.claim(db, "t_locked", "s_1", "paused", 11, 1.0)
            assert await leases.claim(db, "t_free", "s_2", "paused", 22, 1.0)
            await db.commit()
        async with database.session() as owner:
            assert await leases.alive(owner, [11]) == {11}  # its batch's check, paused before the commit
            await until_expired(database, 2)
            async with asyncio.timeout(NO_WAIT_SECONDS):
                assert await sweeper.sweep() == 1
            assert _leases(postgres_database) == {
                "t_locked": ("paused", "running"),
                "t_free": (keeper.replica_id, "done"),
            }
            assert "s_2" in runner.taken  # its waiting messages start here
            await owner.rollback()
        async with asyncio.timeout(NO_WAIT_SECONDS):
            assert await sweeper.sweep() == 1
        assert _leases(postgres_database)["t_locked"] == (keeper.replica_id, "done")
    finally:
        await database.dispose()


def _leases(pg: ScratchDatabase) -> dict[str, tuple[str, str]]:
    with pg.connect() as conn:
        found = conn.execute("SELECT turn_id, owner, state FROM turn_leases").fetchall()
    return {str(turn_id): (str(owner), str(state)) for turn_id, owner, state in found}
