"""Turn leases (multi-replica mode): all SQL of the turn_leases table. Times are the database's clock, so
replicas whose clocks differ still agree on when a lease expires. Functions never commit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlmodel.ext.asyncio.session import AsyncSession

from app.storage.sql import Raw, raw


@dataclass(frozen=True)
class LeaseRecord:
    turn_id: str
    session_id: str
    token: int


def _now(conn: Raw) -> str:
    """The database's clock in unix seconds, as SQL."""
    if conn.dialect == "postgresql":
        return "extract(epoch from clock_timestamp())"
    return "((julianday('now') - 2440587.5) * 86400.0)"


def _marks(values: Sequence[object]) -> str:
    return ", ".join("?" * len(values))


async def claim(
    db: AsyncSession,
    turn_id: str,
    session_id: str,
    owner: str,
    token: int,
    seconds: float,
    *,
    unless_waiting: bool = False,
) -> bool:
    """Claims the session's next turn for `owner`; False when a turn of the session runs (the unique
    partial index refused it: ON CONFLICT covers it without naming it). `unless_waiting`: False too when
    messages wait in the session's line (they go first): the check is part of the same statement, where
    reading the line first took a pooled connection and a round trip of its own on every post."""
    conn = await raw(db)
    values: tuple[object, ...] = (turn_id, session_id, owner, token, seconds, False)
    source = f"VALUES (?, ?, ?, ?, {_now(conn)} + ?, 'running', ?)"
    if unless_waiting:
        source = (
            f"SELECT ?, ?, ?, ?, {_now(conn)} + ?, 'running', ?"
            " WHERE NOT EXISTS (SELECT 1 FROM queued_messages WHERE session_id = ?)"
        )
        values = (*values, session_id)
    found = await conn.fetchall(
        "INSERT INTO turn_leases (turn_id, session_id, owner, token, expires_at, state, cancel_requested)"
        f" {source} ON CONFLICT DO NOTHING RETURNING turn_id",
        values,
    )
    return bool(found)


async def alive(db: AsyncSession, tokens: Sequence[int]) -> set[int]:
    """Of these tokens, those whose lease is running and not expired. On PostgreSQL their rows are locked
    to the commit (FOR KEY SHARE): a takeover (`take_over`, FOR UPDATE) cannot overlap this transaction,
    so what it writes lands before; a cancel's flag (a plain UPDATE) does not wait for it."""
    if not tokens:
        return set()
    conn = await raw(db)
    lock = " ORDER BY token FOR KEY SHARE" if conn.dialect == "postgresql" else ""
    found = await conn.fetchall(
        f"SELECT token FROM turn_leases WHERE token IN ({_marks(tokens)}) AND state = 'running'"
        f" AND expires_at > {_now(conn)}{lock}",
        tuple(tokens),
    )
    return {int(row[0]) for row in found}


async def release(db: AsyncSession, token: int) -> bool:
    """The turn's end: its lease is done, if it still is this token's and alive."""
    conn = await raw(db)
    found = await conn.fetchall(
        "UPDATE turn_leases SET state = 'done' WHERE token = ? AND state = 'running'"
        f" AND expires_at > {_now(conn)} RETURNING turn_id",
        (token,),
    )
    return bool(found)


async def renew(db: AsyncSession, tokens: Sequence[int], seconds: float) -> dict[int, bool]:
    """Extends the leases still alive; {token: cancel requested} of those renewed."""
    if not tokens:
        return {}
    conn = await raw(db)
    now = _now(conn)
    if conn.dialect == "postgresql":
        # Locked in token order first, the order batches lock them in (`alive`): no deadlock between them.
        await conn.fetchall(
            f"SELECT token FROM turn_leases WHERE token IN ({_marks(tokens)}) ORDER BY token FOR UPDATE",
            tuple(tokens),
        )
    found = await conn.fetchall(
        f"UPDATE turn_leases SET expires_at = {now} + ? WHERE token IN ({_marks(tokens)})"
        f" AND state = 'running' AND expires_at > {now} RETURNING token, cancel_requested",
        (seconds, *tokens),
    )
    return {int(token): bool(cancel) for token, cancel in found}


class LeaseBusy(Exception):
    """The lease row is locked by its owner's transaction (a write in flight, or a process paused in one,
    until PostgreSQL ends it): nothing was changed, and nothing waited for the lock."""


# PostgreSQL's lock_not_available: a NOWAIT lock found the row locked.
_LOCK_NOT_AVAILABLE = "55P03"


async def request_cancel(db: AsyncSession, session_id: str) -> LeaseRecord | None:
    """Flags the session's running turn for cancelling (its owner reads the flag); None when none runs.
    LeaseBusy (the transaction is then to be rolled back) when its owner holds the row locked: the caller
    does not wait on a lock a paused owner may hold."""
    conn = await raw(db)
    target = "session_id = ? AND state = 'running'"
    if conn.dialect == "postgresql":
        target = (
            "turn_id = (SELECT turn_id FROM turn_leases WHERE session_id = ? AND state = 'running'"
            " FOR NO KEY UPDATE NOWAIT)"
        )
    try:
        found = await conn.fetchall(
            f"UPDATE turn_leases SET cancel_requested = ? WHERE {target}"
            " RETURNING turn_id, session_id, token",
            (True, session_id),
        )
    except Exception as exc:
        if getattr(exc, "sqlstate", None) == _LOCK_NOT_AVAILABLE:
            raise LeaseBusy(session_id) from exc
        raise
    return LeaseRecord(str(found[0][0]), str(found[0][1]), int(found[0][2])) if found else None


async def state_of(db: AsyncSession, turn_id: str) -> str | None:
    found = await (await raw(db)).fetchall("SELECT state FROM turn_leases WHERE turn_id = ?", (turn_id,))
    return str(found[0][0]) if found else None


async def expired(db: AsyncSession) -> list[LeaseRecord]:
    """Running leases past their expiry: turns whose owner died or stopped renewing."""
    conn = await raw(db)
    found = await conn.fetchall(
        "SELECT turn_id, session_id, token FROM turn_leases WHERE state = 'running'"
        f" AND expires_at <= {_now(conn)} ORDER BY expires_at"
    )
    return [LeaseRecord(str(t), str(s), int(k)) for t, s, k in found]


async def take_over(
    db: AsyncSession, lease: LeaseRecord, owner: str, token: int, seconds: float
) -> bool | None:
    """Makes an expired lease `owner`'s under a new token (to close or resume its turn): whether a cancel
    was asked for its turn; None when another replica took it first, its owner renewed it meanwhile, or
    (PostgreSQL) a transaction of its owner holds the row: a write in flight, or a paused process's, which
    the server ends after its idle-in-transaction timeout. Nothing waits for that lock (SKIP LOCKED): the
    next sweep tries again."""
    conn = await raw(db)
    now = _now(conn)
    target = f"turn_id = ? AND token = ? AND state = 'running' AND expires_at <= {now}"
    if conn.dialect == "postgresql":
        # FOR UPDATE: the lock that conflicts with the owner's (alive's FOR KEY SHARE), not skipped past it.
        target = f"turn_id = (SELECT turn_id FROM turn_leases WHERE {target} FOR UPDATE SKIP LOCKED)"
    found = await conn.fetchall(
        f"UPDATE turn_leases SET owner = ?, token = ?, expires_at = {now} + ? WHERE {target}"
        " RETURNING cancel_requested",
        (owner, token, seconds, lease.turn_id, lease.token),
    )
    return bool(found[0][0]) if found else None


async def expire(db: AsyncSession, token: int) -> None:
    """Lets a running lease go at once (a replica shutting down leaves a turn that waits for answers to
    the first sweeper that comes, instead of after the rest of its lease)."""
    conn = await raw(db)
    await conn.execute(
        f"UPDATE turn_leases SET expires_at = {_now(conn)} WHERE token = ? AND state = 'running'", (token,)
    )


async def running_turn_ids(db: AsyncSession) -> set[str]:
    """Turns some replica holds a running lease of (expired or not)."""
    found = await (await raw(db)).fetchall("SELECT turn_id FROM turn_leases WHERE state = 'running'")
    return {str(row[0]) for row in found}


async def sessions_waiting_without_turn(db: AsyncSession) -> list[str]:
    """Sessions with messages in the waiting line and no running turn: nobody will take them."""
    found = await (await raw(db)).fetchall(
        "SELECT DISTINCT q.session_id FROM queued_messages AS q WHERE NOT EXISTS"
        " (SELECT 1 FROM turn_leases AS l WHERE l.session_id = q.session_id AND l.state = 'running')"
    )
    return [str(row[0]) for row in found]


async def running_statuses(db: AsyncSession, session_ids: Sequence[str]) -> dict[str, tuple[str, str | None]]:
    """Of these sessions, those a turn runs for (on any replica, its lease expired or not: until a sweeper
    closes it, it is the session's open turn): {session_id: (turn_id, the JSON of the session's last
    logged agent_status event, or None)}. One statement: the lease row is inserted with turn_start and
    released with turn_done, so it and the log agree on whether the turn is open."""
    if not session_ids:
        return {}
    found = await (await raw(db)).fetchall(
        "SELECT l.session_id, l.turn_id, (SELECT e.data FROM events AS e WHERE e.session_id = l.session_id"
        " AND e.type = 'agent_status' ORDER BY e.seq DESC LIMIT 1) FROM turn_leases AS l"
        f" WHERE l.state = 'running' AND l.session_id IN ({_marks(session_ids)})",
        tuple(session_ids),
    )
    return {str(sid): (str(turn_id), None if data is None else str(data)) for sid, turn_id, data in found}


async def urgent_waiting(db: AsyncSession, session_ids: Sequence[str]) -> dict[str, set[str]]:
    """Of these sessions, those whose waiting line holds steer or interrupt messages: {session_id: their
    ids}. What a turn's owner must act on before its turn ends, wherever they were posted."""
    if not session_ids:
        return {}
    found = await (await raw(db)).fetchall(
        "SELECT session_id, id FROM queued_messages WHERE delivery IN ('steer', 'interrupt')"
        f" AND session_id IN ({_marks(session_ids)})",
        tuple(session_ids),
    )
    urgent: dict[str, set[str]] = {}
    for session_id, message_id in found:
        urgent.setdefault(str(session_id), set()).add(str(message_id))
    return urgent
