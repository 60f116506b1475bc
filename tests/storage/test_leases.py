"""Turn leases (app.storage.leases) and the fence that checks them (app.streaming.log.fencing), on SQLite and
PostgreSQL. How it proves it: real migrated databases; the second claim of a session is refused by the
unique partial index itself; a lease is shortened to expire, taken over under a new token, and the old
holder's fenced write then raises LeaseLost and leaves nothing in the database, its refusal counted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlmodel.ext.asyncio.session import AsyncSession

from app.settings import Settings
from app.storage import event_log, leases
from app.storage.engine import Database
from app.storage.tables import QueuedMessageRow
from app.streaming.log.fencing import Fence, Lease, LeaseLost
from app.turns.replicas.lease import CANCEL_POLL_SECONDS, LeaseKeeper
from tests.support.postgres import ScratchDatabase
from tests.support.rows import add_sessions

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    await add_sessions(database, "s_1", "s_2", "s_3")
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
        assert await leases.take_over(db, gone, "b", 33, 30.0) is True  # won, and its cancel flag with it
        assert await leases.take_over(db, gone, "c", 44, 30.0) is None  # once only
        await db.commit()
    fence = Fence()
    lost: list[str] = []
    fence.hold(Lease("t_1", "s_1", 11, stop=lambda: lost.append("t_1")))
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


async def test_a_posts_claim_is_refused_while_messages_wait_in_the_line(database: Database) -> None:
    """A post's claim (`unless_waiting`) checks the line in its own statement: refused while a message of
    the session waits (it goes first), whatever waits in other sessions' lines; granted once the line is
    empty. A claim that takes the line itself (no flag) is granted with messages waiting."""
    async with database.session() as db:
        db.add(QueuedMessageRow(id="m_1", session_id="s_1", content="x", sender="U", timestamp="t"))
        await db.commit()
    async with database.session() as db:
        assert not await leases.claim(db, "t_1", "s_1", "a", 11, 30.0, unless_waiting=True)
        assert await leases.running_turn_ids(db) == set()  # nothing claimed
        assert await leases.claim(db, "t_2", "s_2", "a", 12, 30.0, unless_waiting=True)
        assert await leases.claim(db, "t_3", "s_1", "a", 13, 30.0)  # taking the line: no condition
        await db.commit()
        assert await leases.running_turn_ids(db) == {"t_2", "t_3"}
    async with database.session() as db:
        assert not await leases.claim(db, "t_4", "s_2", "a", 14, 30.0, unless_waiting=True)  # t_2 runs
        await (await db.connection()).execute(text("DELETE FROM queued_messages"))
        await (await db.connection()).execute(text("DELETE FROM turn_leases WHERE turn_id = 't_3'"))
        assert await leases.claim(db, "t_5", "s_1", "a", 15, 30.0, unless_waiting=True)
        await db.commit()


async def test_a_lease_let_go_is_the_next_sweeps_and_keeps_its_cancel_flag(database: Database) -> None:
    """A replica shutting down while its turn waits for answers expires the lease at once (`expire`): the
    next sweep takes it over (take_over says whether a cancel was asked: no). A flagged one says yes."""
    async with database.session() as db:
        assert await leases.claim(db, "t_1", "s_1", "a", 11, 30.0)
        assert await leases.claim(db, "t_2", "s_2", "a", 12, 30.0)
        assert await leases.request_cancel(db, "s_2") is not None
        await leases.expire(db, 11)
        await leases.expire(db, 12)
        first, second = sorted(await leases.expired(db), key=lambda lease: lease.token)
        assert first == leases.LeaseRecord("t_1", "s_1", 11)
        assert await leases.take_over(db, first, "b", 21, 30.0) is False
        assert await leases.take_over(db, second, "b", 22, 30.0) is True
        assert await leases.expired(db) == []
        await db.commit()


def _status(seq: int, status: str, turn_id: str) -> tuple[str, int, str, str]:
    return (
        "s_1",
        seq,
        "agent_status",
        f'{{"type":"agent_status","status":"{status}","turn_id":"{turn_id}"}}',
    )


async def test_running_statuses_name_the_open_turn_and_its_last_logged_status(database: Database) -> None:
    """Only sessions with a running lease are named (an expired one too: its turn is open until swept),
    each with the JSON of its last agent_status, whatever events came after it."""
    async with database.session() as db:
        assert await leases.claim(db, "t_1", "s_1", "a", 11, 30.0)
        assert await leases.claim(db, "t_3", "s_3", "a", 33, 30.0)
        await event_log.log_events(
            db,
            [
                _status(1, "thinking", "t_1"),
                _status(2, "tool_calling", "t_1"),
                ("s_1", 3, "tool_exec_start", "{}"),
                ("s_2", 1, "agent_status", "{}"),
            ],
        )
        await (await db.connection()).execute(text("UPDATE turn_leases SET expires_at = expires_at - 60"))
        await db.commit()
        found = await leases.running_statuses(db, ["s_1", "s_2", "s_3", "s_9"])
        assert await leases.running_statuses(db, []) == {}
    assert found == {"s_1": ("t_1", _status(2, "tool_calling", "t_1")[3]), "s_3": ("t_3", None)}


async def test_urgent_waiting_names_the_steer_and_interrupt_messages_of_those_sessions(
    database: Database,
) -> None:
    """What a turn's owner must act on before its turn ends: steer and interrupt, not queue; only the
    sessions asked about."""
    async with database.session() as db:
        for n, (session_id, delivery) in enumerate(
            [("s_1", "steer"), ("s_1", "queue"), ("s_1", "interrupt"), ("s_2", "queue"), ("s_3", "steer")]
        ):
            db.add(
                QueuedMessageRow(
                    id=f"m_{n}",
                    session_id=session_id,
                    content="x",
                    sender="User",
                    timestamp="t",
                    delivery=delivery,
                )
            )
        await db.commit()
        assert await leases.urgent_waiting(db, ["s_1", "s_2"]) == {"s_1": {"m_0", "m_2"}}
        assert await leases.urgent_waiting(db, []) == {}


async def test_a_turn_that_ends_while_its_renewal_is_under_way_has_not_lost_its_lease(
    database: Database,
) -> None:
    """A heartbeat takes the leases to renew, then renews them; a turn that ends in between releases its
    lease, so the renewal does not find it. It ended: nothing is stopped and no loss is reported (seen
    under load as "lost its lease" warnings for turns that had finished). A lease still held that the
    renewal does not find is lost, as before."""
    settings = Settings(database_url="sqlite+aiosqlite:///unused.db", lease_seconds=30)
    fence = Fence()
    keeper = LeaseKeeper(settings, database, fence)
    lost: list[str] = []
    async with database.session() as db:
        ending = await keeper.claim(db, "s_1", "t_ending")
        taken = await keeper.claim(db, "s_2", "t_taken")
        await db.commit()
    ending.stop = lambda: lost.append("t_ending")
    taken.stop = lambda: lost.append("t_taken")
    fence.hold(ending)
    fence.hold(taken)
    real_renew = leases.renew

    async def renew_while_one_ends(db: AsyncSession, tokens: list[int], seconds: float) -> dict[int, bool]:
        async with database.session() as other:  # t_ending's last write releases its lease
            assert await fence.guard(other, "s_1", "t_ending", final=True)
            await other.commit()
        fence.end("s_1", "t_ending")
        async with database.session() as other:  # t_taken's lease is taken by another replica
            await (await other.connection()).execute(
                text("UPDATE turn_leases SET token = 77 WHERE turn_id = 't_taken'")
            )
            await other.commit()
        return await real_renew(db, tokens, seconds)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(leases, "renew", renew_while_one_ends)
        await keeper.beat()
    assert lost == ["t_taken"]
    assert not ending.lost and taken.lost


# Longest a statement below may take: a wait on a row lock would last the statement timeout (30 s).
NO_WAIT_SECONDS = 5.0


async def until_expired(database: Database, count: int) -> list[leases.LeaseRecord]:
    """Waits (polling the leases, a read that takes no lock) until `count` of them have expired."""
    while True:
        async with database.session() as db:
            found = await leases.expired(db)
        if len(found) >= count:
            return found
        await asyncio.sleep(0.05)


async def test_a_lease_row_its_owner_holds_locked_is_skipped_not_waited_for(
    postgres_database: ScratchDatabase,
) -> None:
    """Issue 31 §3: the owner's write-behind checks its lease (`alive`, the fence's check) and, paused in
    that transaction, keeps the row locked. A takeover of that lease returns at once without taking it
    (the next sweep tries again), a takeover of another expired lease goes through, and a cancel's flag
    is set without waiting. Once the owner's transaction is gone, the takeover goes through. Its renewal's
    lock (FOR UPDATE) makes the flag raise LeaseBusy at once, never a wait either."""
    database = Database(postgres_database.url)
    await add_sessions(database, "s_1", "s_2")
    try:
        async with database.session() as db:
            assert await leases.claim(db, "t_1", "s_1", "owner", 11, 1.0)
            assert await leases.claim(db, "t_2", "s_2", "owner", 22, 1.0)
            await db.commit()
        async with database.session() as owner:
            assert await leases.alive(owner, [11]) == {11}  # the write-behind's check: t_1's row locked
            expired = {record.turn_id: record for record in await until_expired(database, 2)}
            async with asyncio.timeout(NO_WAIT_SECONDS), database.session() as db:
                assert await leases.take_over(db, expired["t_1"], "survivor", 33, 30.0) is None
                assert await leases.take_over(db, expired["t_2"], "survivor", 44, 30.0) is False
                flagged = await leases.request_cancel(db, "s_1")
                await db.commit()
            assert flagged == leases.LeaseRecord("t_1", "s_1", 11)
            await owner.rollback()  # what PostgreSQL does to a paused owner's transaction
        async with asyncio.timeout(NO_WAIT_SECONDS), database.session() as db:
            assert await leases.take_over(db, expired["t_1"], "survivor", 33, 30.0) is True  # and flagged
            await db.commit()
        async with database.session() as owner:
            assert await leases.renew(owner, [33], 30.0) == {33: True}  # the row locked FOR UPDATE
            async with asyncio.timeout(NO_WAIT_SECONDS), database.session() as db:
                with pytest.raises(leases.LeaseBusy):
                    await leases.request_cancel(db, "s_1")
    finally:
        await database.dispose()


async def test_a_cancels_flag_retries_a_locked_lease_instead_of_waiting_for_it(
    postgres_database: ScratchDatabase,
) -> None:
    """Issue 31 §3: the owner is inside its renewal (the row locked FOR UPDATE) when a cancel comes to
    another replica. The flag does not queue behind the lock (no connection of the database waits for
    one, round after round of its retries); it is set once the owner's transaction ends."""
    database = Database(postgres_database.url)
    await add_sessions(database, "s_1")
    keeper = LeaseKeeper(Settings(database_url=postgres_database.url), database, Fence())
    try:
        async with database.session() as db:
            assert await leases.claim(db, "t_1", "s_1", "owner", 11, 30.0)
            await db.commit()
        async with database.session() as owner:
            assert await leases.renew(owner, [11], 30.0) == {11: False}
            flagging = asyncio.create_task(keeper.flag_cancel("s_1"))
            for _ in range(5):
                await asyncio.sleep(CANCEL_POLL_SECONDS)
                assert _lock_waits(postgres_database) == 0
                assert not flagging.done()
            await owner.commit()
        async with asyncio.timeout(NO_WAIT_SECONDS):
            assert await flagging == leases.LeaseRecord("t_1", "s_1", 11)
    finally:
        await database.dispose()


def _lock_waits(pg: ScratchDatabase) -> int:
    """Connections of this database waiting for a lock."""
    with pg.connect() as conn:
        found = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchall()
    return len(found)
