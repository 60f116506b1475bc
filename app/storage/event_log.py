"""The event log: every committed event of a session, by number, for replay, retention and recovery.
SQL only; numbers are taken by streaming.log.sequencing, in the transaction that logs the events."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import text
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from app.storage.sql import Raw, RawPostgres, json_text_field, json_text_sql, raw
from app.storage.tables import ChatMessageRow, EventRow


async def last_event_seq(db: AsyncSession, session_id: str) -> int:
    found = await (await raw(db)).fetchall("SELECT max(seq) FROM events WHERE session_id = ?", (session_id,))
    return int(found[0][0] or 0) if found else 0


async def last_event_seqs(db: AsyncSession, session_ids: Sequence[str]) -> dict[str, int]:
    """The last seq of each of these sessions that has events (one read per thousand sessions: the
    drivers bound a statement's parameters)."""
    conn = await raw(db)
    heads: dict[str, int] = {}
    for start in range(0, len(session_ids), 1000):
        chunk = tuple(session_ids[start : start + 1000])
        marks = ", ".join("?" for _ in chunk)
        found = await conn.fetchall(
            f"SELECT session_id, max(seq) FROM events WHERE session_id IN ({marks}) GROUP BY session_id",
            chunk,
        )
        heads.update({str(sid): int(seq) for sid, seq in found})
    return heads


async def _lock_in_order(conn: Raw, ids: list[str]) -> None:
    """Locks several sessions' counter rows in id order, as every replica locks a batch's rows (no
    deadlock); one row needs nothing: the UPDATE's own lock is the only one."""
    if len(ids) > 1:
        await conn.fetchall("SELECT id FROM chat_sessions WHERE id = ANY(?) ORDER BY id FOR UPDATE", (ids,))


async def advance_counters(db: AsyncSession, counts: dict[str, int]) -> dict[str, int]:
    """`advance_counter` for every session of a batch: each existing session's last number taken. On
    PostgreSQL two statements whatever the number of sessions (one per session was a round trip each,
    most of a busy batch's time): the rows are locked in id order first, as every replica locks a batch's
    rows (no deadlock), then updated at once. SQLite (one process: no network round trip) goes session by
    session."""
    conn = await raw(db)
    ids = sorted(counts)
    if conn.dialect != "postgresql":
        taken = {sid: await advance_counter(db, sid, counts[sid]) for sid in ids}
        return {sid: last for sid, last in taken.items() if last is not None}
    if not ids:
        return {}
    await _lock_in_order(conn, ids)
    found = await conn.fetchall(
        "UPDATE chat_sessions AS s SET last_seq = greatest(s.last_seq,"
        " COALESCE((SELECT max(seq) FROM events WHERE session_id = s.id), 0)) + v.n"
        " FROM unnest(?::text[], ?::int[]) AS v(id, n) WHERE s.id = v.id RETURNING s.id, s.last_seq",
        (ids, [counts[sid] for sid in ids]),
    )
    return {str(sid): int(last) for sid, last in found}


async def advance_counter(db: AsyncSession, session_id: str, count: int) -> int | None:
    """Takes `count` numbers from the session's counter (chat_sessions.last_seq) in `db`'s transaction and
    returns the last of them; None when the session is gone. The row lock is held to the commit: another
    process's transaction that takes numbers of the same session waits for it, then reads its result
    (PostgreSQL re-reads the updated row). The log's last number is a floor (a database that ran
    single-process): read in the statement's snapshot, it can only be lower than a counter kept since."""
    conn = await raw(db)
    bigger = "greatest" if conn.dialect == "postgresql" else "max"
    found = await conn.fetchall(
        f"UPDATE chat_sessions SET last_seq = {bigger}(last_seq,"
        " COALESCE((SELECT max(seq) FROM events WHERE session_id = ?), 0)) + ?"
        " WHERE id = ? RETURNING last_seq",
        (session_id, count, session_id),
    )
    return int(found[0][0]) if found else None


# advance_counters and log_events in one statement (PostgreSQL): the counters move, and the events go in
# numbered from what they moved to, each one's data completed with its number (frames.Draft.number).
_ADVANCE_AND_LOG = (
    "WITH c AS (UPDATE chat_sessions AS s SET last_seq = greatest(s.last_seq,"
    " COALESCE((SELECT max(seq) FROM events WHERE session_id = s.id), 0)) + v.n"
    " FROM unnest(?::varchar[], ?::integer[]) AS v(id, n) WHERE s.id = v.id"
    " RETURNING s.id, s.last_seq, v.n),"
    " logged AS (INSERT INTO events (session_id, seq, type, data)"
    " SELECT c.id, c.last_seq - c.n + e.ord, e.type,"
    ' \'{"type":"\' || e.type || \'","seq":\' || (c.last_seq - c.n + e.ord)::text || e.rest'
    " FROM unnest(?::varchar[], ?::integer[], ?::varchar[], ?::varchar[]) AS e(sid, ord, type, rest)"
    " JOIN c ON c.id = e.sid)"
    " SELECT id, last_seq FROM c"
)


async def advance_and_log(
    db: AsyncSession, counts: dict[str, int], events: Sequence[tuple[str, int, str, str]]
) -> dict[str, int]:
    """PostgreSQL: `advance_counters` and `log_events` in one round trip instead of two (a turn's every
    write, and every batch, logs events). `events`: (session_id, its place among that session's events
    here counting from 1, type, the data after its seq); each is logged with seq = the number its place
    takes and data = `{"type":"<type>","seq":<seq>` + the rest, as frames.Draft.number makes it. The
    events of a session that is gone are not logged. Returns each existing session's last number taken.
    The rows are locked in id order first when there are several, as advance_counters does."""
    conn = await raw(db)
    assert isinstance(conn, RawPostgres), "advance_and_log is PostgreSQL's"
    ids = sorted(counts)
    if not ids:
        return {}
    await _lock_in_order(conn, ids)
    columns: list[list[Any]] = [ids, [counts[sid] for sid in ids]]
    columns += [list(column) for column in zip(*events, strict=True)]
    found = await conn.fetch_columns(_ADVANCE_AND_LOG, columns)
    return {str(sid): int(last) for sid, last in found}


INSERT_EVENTS = "INSERT INTO events (session_id, seq, type, data) VALUES (?, ?, ?, ?)"
_INSERT_EVENTS_UNNEST = (
    "INSERT INTO events (session_id, seq, type, data)"
    " SELECT * FROM unnest(?::varchar[], ?::integer[], ?::varchar[], ?::varchar[])"
)


async def insert_events(db: AsyncSession, rows: Sequence[dict[str, Any]]) -> None:
    await log_events(db, [(r["session_id"], r["seq"], r["type"], r["data"]) for r in rows])


async def log_events(db: AsyncSession, params: Sequence[tuple[str, int, str, str]]) -> None:
    """(session_id, seq, type, data) rows in one executemany: this runs for every event of every stream.

    A plain insert: numbers are taken in the transaction that logs them (streaming.log.sequencing), so a
    duplicate is a bug to surface, never a case to ignore."""
    if not params:
        return
    conn = await raw(db)
    if isinstance(conn, RawPostgres):
        # One statement over four arrays, where an executemany handles every row in Python (measured: the
        # event log was most of PostgreSQL's extra CPU per streamed chunk).
        columns = [list(column) for column in zip(*params, strict=True)]
        await conn.execute_columns(_INSERT_EVENTS_UNNEST, columns)
    else:
        await conn.executemany(INSERT_EVENTS, params)


async def events_after(db: AsyncSession, session_id: str, after: int, limit: int) -> list[EventRow]:
    query = (
        select(EventRow)
        .where(col(EventRow.session_id) == session_id, col(EventRow.seq) > after)
        .order_by(col(EventRow.seq))
        .limit(limit)
    )
    return list((await db.exec(query)).all())


async def events_between(
    db: AsyncSession, session_id: str, after: int, before: int
) -> list[tuple[int, str, str, str | None]]:
    """(seq, type, data, turn) of the session's events with after < seq < before, in order: one read, so
    one consistent snapshot. Plain tuples from the driver: a resume may replay ten thousand of them.
    `turn`: the turn a turn_start or turn_done starts or ends (frames.Frame.turn), read by the database
    for those two types only, None for the others."""
    conn = await raw(db)
    turn = json_text_sql(conn.dialect, "data", "turn_id")
    rows = await conn.fetchall(
        f"SELECT seq, type, data, CASE WHEN type IN ('turn_start', 'turn_done') THEN {turn} END"
        " FROM events WHERE session_id = ? AND seq > ? AND seq < ? ORDER BY seq",
        (session_id, after, before),
    )
    return [(int(seq), str(type_), str(data), turn_id) for seq, type_, data, turn_id in rows]


PRUNE_EVENTS = "DELETE FROM events WHERE session_id = ? AND seq <= ?"


async def prune_events(db: AsyncSession, session_id: str, *, keep_after: int) -> None:
    """Retention: deletes the session's events with seq <= keep_after."""
    await prune_logs(db, [(session_id, keep_after)])


async def prune_logs(db: AsyncSession, cutoffs: Sequence[tuple[str, int]]) -> None:
    """(session_id, keep_after) pairs: each session's events with seq <= keep_after go."""
    if cutoffs:
        await (await raw(db)).executemany(PRUNE_EVENTS, cutoffs)


async def message_deltas(db: AsyncSession, session_id: str, message_id: str) -> list[EventRow]:
    """The logged text_delta (or reasoning_delta) events of one assistant message, in order."""
    query = (
        select(EventRow)
        .where(
            col(EventRow.session_id) == session_id,
            col(EventRow.type).in_(("text_delta", "reasoning_delta")),
            json_text_field(db, EventRow.data, "id") == message_id,
        )
        .order_by(col(EventRow.seq))
    )
    return list((await db.exec(query)).all())


async def turn_ends_missing_from_log(db: AsyncSession) -> list[ChatMessageRow]:
    """Each session's last turn_done row whose event a crash lost: the row commits before its event is
    logged, so a kill -9 in between keeps the row and loses the event. Turns whose start is no longer in
    the log (retention) are left alone: their clients resync anyway."""
    start_id = json_text_sql(db.get_bind().dialect.name, "e.data", "id")
    statement = text(
        f"""
        SELECT d.position FROM chat_messages AS d
        WHERE d.type = 'turn_done'
          AND d.position = (SELECT max(position) FROM chat_messages
                            WHERE session_id = d.session_id AND type = 'turn_done')
          AND EXISTS (SELECT 1 FROM chat_messages AS s JOIN events AS e
                        ON e.session_id = s.session_id AND e.type = 'turn_start'
                       AND {start_id} = s.id
                      WHERE s.turn_id = d.turn_id AND s.type = 'turn_start')
          AND NOT EXISTS (SELECT 1 FROM events AS e
                          WHERE e.session_id = d.session_id AND e.type = 'turn_done'
                            AND {start_id} = d.id)
        """
    )
    connection = await db.connection()
    positions = [row[0] for row in (await connection.execute(statement)).all()]
    if not positions:
        return []
    query = select(ChatMessageRow).where(col(ChatMessageRow.position).in_(positions))
    return list((await db.exec(query)).all())
