"""Who runs a session's turn (turns.runtime.ownership): in one process nothing is claimed or fenced; with
leases the opening transaction claims the turn's lease, the fence holds it from the commit on, a lost lease
stops the local turn, and a turn that never opened leaves nothing held."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from app.settings import Settings
from app.storage import leases
from app.storage.engine import Database
from app.streaming.log.fencing import Fence
from app.turns.replicas.ownership import LeasedOwnership
from app.turns.runtime.ownership import LocalOwnership
from tests.support.rows import add_sessions

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


class Turns:
    """What an ownership asks of the runner, recorded."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self.noticed: list[tuple[str, set[str]]] = []

    def cancel_local(self, turn_id: str) -> bool:
        self.cancelled.append(turn_id)
        return True

    def waiting_noticed(self, session_id: str, urgent: set[str]) -> None:
        self.noticed.append((session_id, urgent))


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    await add_sessions(database, "s_1")
    yield database
    await database.dispose()


async def test_one_process_claims_nothing_and_reads_its_own_line() -> None:
    ownership = LocalOwnership(Turns())
    assert ownership.line_here
    assert ownership.claim("s_1", "t_1", posted=True) is None
    assert await ownership.cancel_elsewhere("s_1") is None


async def test_a_leased_turn_is_held_from_its_opening_commit_and_stopped_when_its_lease_is_lost(
    database: Database,
) -> None:
    settings = Settings(database_url="sqlite+aiosqlite:///unused.db", lease_seconds=30)
    fence = Fence()
    ownership = LeasedOwnership(settings, database, fence, Turns())
    assert not ownership.line_here
    claim = ownership.claim("s_1", "t_1", posted=True)
    assert claim is not None
    async with database.session() as db:
        await claim(db)
        await db.commit()
    assert fence.held() == []  # claimed, not held before the runner says the turn opened
    stopped: list[str] = []
    ownership.opened("s_1", "t_1", lambda: stopped.append("t_1"))
    [lease] = fence.held()
    assert (lease.turn_id, lease.session_id) == ("t_1", "s_1")
    fence.lose(lease, "a test")
    assert stopped == ["t_1"]
    await ownership.turn_over("s_1", "t_1", detached=False)
    assert fence.lease("s_1") is lease  # a lost lease stays held, so what its turn emitted is dropped


async def test_a_turn_whose_opening_failed_leaves_no_lease_held(database: Database) -> None:
    settings = Settings(database_url="sqlite+aiosqlite:///unused.db", lease_seconds=30)
    fence = Fence()
    ownership = LeasedOwnership(settings, database, fence, Turns())
    claim = ownership.claim("s_1", "t_1", posted=False)
    assert claim is not None
    async with database.session() as db:
        await claim(db)
        await db.rollback()
    ownership.not_opened("t_1")
    ownership.opened("s_1", "t_1", lambda: None)  # nothing claimed for it any more: nothing held
    assert fence.held() == []
    async with database.session() as db:
        assert await leases.running_turn_ids(db) == set()
