"""The sweeper of a replica that is shutting down takes nothing over (issue 16). The drain starts at
SIGTERM, before the lifespan stops the sweeper; a turn waiting for answers is let go (its lease expired at
once) for another replica to take. Seen in CI: the stopping replica's own sweep took the lease back,
resumed the turn in a runner that was closing, and the survivor could take it only once that new lease
ran out. How it proves it: a real migrated database, a lease expired as `let_go` expires it, a sweep by a
closing runner: the lease keeps its token and owner, and no waiting message is started.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

import pytest

from app.settings import Settings
from app.storage import leases
from app.storage.engine import Database
from app.streaming.fencing import Fence
from app.streaming.writer import WriteBehind
from app.turns.lease import LeaseKeeper
from app.turns.leased_runner import LeasedRunner
from app.turns.live import LocalLiveStatus
from app.turns.sweeper import Sweeper
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
    sweeper = Sweeper(database, WriteBehind(database), LocalLiveStatus(), cast(LeasedRunner, runner), keeper)
    async with database.session() as db:
        lease = await keeper.claim(db, "s_1", "t_waits")
        await leases.expire(db, lease.token)  # what let_go does at the drain
        await db.commit()
    assert await sweeper.sweep() == 0
    async with database.session() as db:
        [left] = await leases.expired(db)
    assert left == leases.LeaseRecord("t_waits", "s_1", lease.token)  # still the next survivor's to take
    assert runner.taken == []
