"""All SQL lives here. Functions take a database session (`db`) and never commit: callers own transactions."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import delete, update
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import configure_mappers
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from app.storage import files
from app.storage.sql import Raw, RawPostgres, dialect_insert, load_json, raw
from app.storage.tables import (
    ChatMessageRow,
    ChatSessionRow,
    EventRow,
    IdempotencyKeyRow,
    QueuedMessageRow,
    ServiceSecretRow,
    SessionMetadataRow,
)
from app.storage.turn_tree import on_path

# --- chat sessions ---------------------------------------------------------------------------------


async def get_session(db: AsyncSession, session_id: str) -> ChatSessionRow | None:
    """Whoever owns it: for the runner's own work. Requests use owned_session."""
    return await db.get(ChatSessionRow, session_id)


async def owned_session(db: AsyncSession, principal: str, session_id: str) -> ChatSessionRow | None:
    """The session if `principal` owns it: another principal's session is as absent as a missing one.
    (Every request names its session: this read is on every request's path.)"""
    found = await _SESSIONS.all(db, "WHERE id = ? AND principal = ?", (session_id, principal))
    return found[0] if found else None


async def list_sessions(
    db: AsyncSession,
    principal: str,
    *,
    limit: int,
    before: tuple[str, str] | None,
    metadata: Sequence[tuple[str, str]] = (),
) -> Sequence[ChatSessionRow]:
    """`principal`'s sessions, newest first; `before` is the (created_at, id) of the previous page's last;
    `metadata`: (key, value text) pairs each session must hold (session_metadata)."""
    query = (
        select(ChatSessionRow)
        .where(col(ChatSessionRow.principal) == principal)
        .order_by(col(ChatSessionRow.created_at).desc(), col(ChatSessionRow.id).desc())
    )
    for key, value in metadata:
        holding = select(SessionMetadataRow.session_id).where(
            col(SessionMetadataRow.key) == key, col(SessionMetadataRow.value) == value
        )
        query = query.where(col(ChatSessionRow.id).in_(holding))
    if before is not None:
        created_at, session_id = before
        query = query.where(
            (col(ChatSessionRow.created_at) < created_at)
            | ((col(ChatSessionRow.created_at) == created_at) & (col(ChatSessionRow.id) < session_id))
        )
    return (await db.exec(query.limit(limit))).all()


async def insert_session(db: AsyncSession, row: ChatSessionRow, new_id: Callable[[], str]) -> None:
    """Stores a new session under an id no session holds: a taken id is replaced from `new_id`."""
    values = {c.name: getattr(row, c.name) for c in ChatSessionRow.__table__.columns}  # type: ignore[attr-defined]
    while True:
        values["id"] = row.id
        # RETURNING, not the row count: psycopg's adapter reports -1 for an INSERT ... ON CONFLICT.
        statement = dialect_insert(db)(ChatSessionRow).values(**values).on_conflict_do_nothing()
        if (await db.exec(statement.returning(col(ChatSessionRow.id)))).first() is not None:
            return
        row.id = new_id()


async def update_session(db: AsyncSession, session_id: str, values: dict[str, Any]) -> None:
    await db.exec(update(ChatSessionRow).where(col(ChatSessionRow.id) == session_id).values(**values))


async def set_session_metadata(db: AsyncSession, session_id: str, entries: Sequence[tuple[str, str]]) -> None:
    """The filter rows of a session's metadata, replaced by `entries` (key, value text)."""
    await db.exec(delete(SessionMetadataRow).where(col(SessionMetadataRow.session_id) == session_id))
    if entries:
        rows = [{"session_id": session_id, "key": key, "value": value} for key, value in entries]
        await db.exec(dialect_insert(db)(SessionMetadataRow).values(rows))


async def title_untitled(db: AsyncSession, session_id: str, title: str, at: str) -> None:
    """Gives the session `title` if it has none (a first message's; a title set meanwhile is kept)."""
    await db.exec(
        update(ChatSessionRow)
        .where(col(ChatSessionRow.id) == session_id, col(ChatSessionRow.title).is_(None))
        .values(title=title, updated_at=at)
    )


async def retitle(db: AsyncSession, session_id: str, was: str, title: str, at: str) -> bool:
    """Replaces the title `was` by `title`; a title changed meanwhile is kept. Whether it was replaced."""
    found = await db.exec(
        update(ChatSessionRow)
        .where(col(ChatSessionRow.id) == session_id, col(ChatSessionRow.title) == was)
        .values(title=title, updated_at=at)
        .returning(col(ChatSessionRow.id))
    )
    return found.first() is not None


async def service_secret(db: AsyncSession, name: str, candidate: str) -> str:
    """The stored secret `name`; `candidate` is stored first if there is none (the first replica wins)."""
    statement = dialect_insert(db)(ServiceSecretRow).values(name=name, value=candidate)
    await db.exec(statement.on_conflict_do_nothing())
    row = await db.get(ServiceSecretRow, name)
    assert row is not None
    return row.value


async def add_usage(
    db: AsyncSession,
    session_id: str,
    *,
    prompt: int,
    completion: int,
    window: int | None,
    at: str,
    context_scale: float | None = None,
) -> tuple[int, int]:
    """Adds one response's tokens; returns the session's (total_tokens, context_used). `context_scale`,
    when given, is the session's new prompt-size calibration (docs/context.md), in the same statement: a
    response's end is one write to the session row, not two."""
    found = await (await raw(db)).fetchall(
        "UPDATE chat_sessions SET total_tokens = total_tokens + ?, context_used = ?, context_window = ?,"
        " updated_at = ?, context_scale = COALESCE(?, context_scale) WHERE id = ?"
        " RETURNING total_tokens, context_used",
        (prompt + completion, prompt, window, at, context_scale, session_id),
    )
    if not found:
        return (prompt + completion, prompt)
    return (int(found[0][0]), int(found[0][1]))


async def delete_session(db: AsyncSession, session_id: str) -> bool:
    """The session with its history, its log and the links to its files; the files themselves too,
    unless a message of another session uses them."""
    attached = await files.session_files(db, session_id)
    await db.exec(delete(EventRow).where(col(EventRow.session_id) == session_id))
    await db.exec(delete(SessionMetadataRow).where(col(SessionMetadataRow.session_id) == session_id))
    result = await db.exec(delete(ChatSessionRow).where(col(ChatSessionRow.id) == session_id))
    await files.delete_unlinked(db, attached)
    return bool(result.rowcount)


# --- chat messages ---------------------------------------------------------------------------------


# The columns a chat message is inserted with (`position` is assigned by the database: SQLite's rowid,
# PostgreSQL's sequence).
_MESSAGE_COLUMNS = tuple(c.name for c in ChatMessageRow.__table__.columns if c.name != "position")  # type: ignore[attr-defined]
_JSON_COLUMNS = frozenset(
    c.name
    for c in ChatMessageRow.__table__.columns  # type: ignore[attr-defined]
    if c.type.__class__.__name__ == "JSON"
)
_JSON_INDEXES = tuple(i for i, name in enumerate(_MESSAGE_COLUMNS) if name in _JSON_COLUMNS)
_COLUMN_LIST = ", ".join(_MESSAGE_COLUMNS)
_PLACEHOLDERS = ", ".join("?" * len(_MESSAGE_COLUMNS))
_INSERT_MESSAGE = f"INSERT INTO chat_messages ({_COLUMN_LIST}) VALUES ({_PLACEHOLDERS})"
# A row whose id is free goes in; one whose id is held is left out (its count says so).
INSERT_NEW_MESSAGE = _INSERT_MESSAGE + " ON CONFLICT (id) DO NOTHING"
SET_MESSAGE_TEXT = "UPDATE chat_messages SET content = ? WHERE id = ?"


def message_params(row: ChatMessageRow) -> tuple[Any, ...]:
    # JSON columns as SQLAlchemy's JSON type writes them (json.dumps; None becomes 'null'). A new row
    # holds every value in its __dict__ (tables.new_message): read there, not through the attributes'
    # instrumentation (a fifth of the cost, on the first token's path); getattr for any other.
    values = row.__dict__
    params = [values[name] if name in values else getattr(row, name) for name in _MESSAGE_COLUMNS]
    for index in _JSON_INDEXES:
        value = params[index]
        params[index] = "null" if value is None else json.dumps(value)
    return tuple(params)


def _decoder(column: Any) -> Any:
    """How SQLAlchemy would turn the value SQLite stores for `column` back into Python (psycopg returns
    JSON and booleans decoded already)."""
    kind = column.type.__class__.__name__
    if kind == "JSON":
        return lambda v: None if v is None else load_json(v)
    if kind == "Boolean":
        return lambda v: None if v is None else bool(v)
    return None


class _Loader:
    """Rows of one table read with plain SQL and built into its model: one trip to the driver (on SQLite,
    aiosqlite's execute_fetchall) where an ORM select makes four (cursor, execute, fetch, close)."""

    def __init__(self, model: Any) -> None:
        columns = list(model.__table__.columns)
        self.model = model
        self.names = [c.name for c in columns]
        self.select = f"SELECT {', '.join(self.names)} FROM {model.__tablename__}"
        self.decoders = [(i, d) for i, c in enumerate(columns) if (d := _decoder(c)) is not None]
        # As the ORM loads a row: a bare instance whose attributes are set, not validated. The model's
        # __init__ validates every field (~100 us a message row, measured: 10 ms for a page of 100).
        # A bare instance reads its attributes through the mapper's instrumentation, which exists only
        # once the mappers are configured: the ORM does that at its first query, which may not have
        # run yet (the first request after a start may be a history read).
        configure_mappers()
        self.new = sa_inspect(model).class_manager.new_instance

    async def all(self, db: AsyncSession, where: str, params: Sequence[Any]) -> list[Any]:
        conn = await raw(db)
        records = await conn.fetchall(f"{self.select} {where}", params)
        names, new = self.names, self.new
        decoders = self.decoders if conn.dialect == "sqlite" else ()
        rows = []
        for record in records:
            values = list(record)
            for i, decode in decoders:
                values[i] = decode(values[i])
            row = new()
            row.__dict__.update(zip(names, values, strict=True))
            rows.append(row)
        return rows


_SESSIONS = _Loader(ChatSessionRow)
_MESSAGES = _Loader(ChatMessageRow)
_QUEUED = _Loader(QueuedMessageRow)


async def insert_messages(
    db: AsyncSession, rows: Iterable[ChatMessageRow], new_id: Callable[[], str] | None = None
) -> dict[str, str]:
    """Inserts in order: their positions (the history's order) are assigned as they are inserted.

    A row whose id another row already holds (48 random bits collide, rarely) is given a fresh id from
    `new_id` and the rows are inserted again in order, so a collision never surfaces as an error; the
    renames are returned ({old id: new id}), and the rows themselves carry their final ids. Without
    `new_id` a taken id is an IntegrityError (the rows' ids were handed out already)."""
    rows = list(rows)
    renamed = await _insert_messages(db, rows, new_id)
    await _link_files(db, rows)
    return renamed


async def _link_files(db: AsyncSession, rows: Iterable[ChatMessageRow | QueuedMessageRow]) -> None:
    """A user message's files are linked to it in the transaction that stores it."""
    links = [(r.id, a["file_id"], r.session_id) for r in rows for a in (r.attachments or [])]
    if links:
        await files.link_messages(db, links)


async def _insert_messages(
    db: AsyncSession, rows: list[ChatMessageRow], new_id: Callable[[], str] | None
) -> dict[str, str]:
    renamed: dict[str, str] = {}
    if new_id is not None:
        seen: set[str] = set()
        for row in rows:  # two fresh ids of one batch alike: the later one is renamed
            if row.id in seen:
                renamed[row.id] = row.id = new_id()
            seen.add(row.id)
    while rows:
        conn = await raw(db)
        params = [message_params(row) for row in rows]
        if new_id is None:
            await conn.executemany(_INSERT_MESSAGE, params)
            return renamed
        inserted_count = await conn.executemany(INSERT_NEW_MESSAGE, params)
        if inserted_count == len(rows):
            return renamed
        taken = await _taken_ids(conn, rows)
        if not taken:  # what did not go in is stored already, as it is (a row written twice)
            return renamed
        # Out of order now: the rows that did go in leave, and all go in again, in order.
        inserted = [row.id for row in rows if row.id not in taken]
        await conn.executemany("DELETE FROM chat_messages WHERE id = ?", [(i,) for i in inserted])
        for row in rows:
            if row.id in taken:
                fresh = new_id()
                original = next((old for old, new in renamed.items() if new == row.id), row.id)
                renamed[original] = row.id = fresh
    return renamed


async def has_messages(db: AsyncSession, session_id: str) -> bool:
    """Whether the session holds any message (in `db`'s transaction: one trip to the driver)."""
    conn = await raw(db)
    return bool(
        await conn.fetchall("SELECT 1 FROM chat_messages WHERE session_id = ? LIMIT 1", (session_id,))
    )


async def _taken_ids(conn: Raw, rows: list[ChatMessageRow]) -> set[str]:
    """The ids of `rows` that other rows hold: what is stored under the id is not the row."""
    taken = set()
    for row in rows:
        found = await conn.fetchall(
            "SELECT session_id, turn_id, type, timestamp FROM chat_messages WHERE id = ?", (row.id,)
        )
        if found and tuple(found[0]) != (row.session_id, row.turn_id, row.type, row.timestamp):
            taken.add(row.id)
    return taken


_UPDATABLE = frozenset(_MESSAGE_COLUMNS) - {"id", "session_id"}


async def update_message(db: AsyncSession, message_id: str, values: dict[str, Any]) -> None:
    unknown = values.keys() - _UPDATABLE
    if unknown:
        raise ValueError(f"not updatable: {sorted(unknown)}")
    names = sorted(values)
    # JSON columns written as an insert writes them (_params).
    params = [
        ("null" if values[n] is None else json.dumps(values[n])) if n in _JSON_COLUMNS else values[n]
        for n in names
    ]
    statement = f"UPDATE chat_messages SET {', '.join(f'{n} = ?' for n in names)} WHERE id = ?"
    await (await raw(db)).execute(statement, [*params, message_id])


async def set_message_texts(db: AsyncSession, texts: Sequence[tuple[str, str]]) -> None:
    """(message id, content) pairs: streamed text written behind, in one statement for all of them."""
    if not texts:
        return
    conn = await raw(db)
    if isinstance(conn, RawPostgres):  # one statement over two arrays (event_log.log_events says why)
        await conn.execute_columns(
            "UPDATE chat_messages SET content = t.content FROM unnest(?::varchar[], ?::varchar[])"
            " AS t(id, content) WHERE chat_messages.id = t.id",
            ([mid for mid, _ in texts], [text for _, text in texts]),
        )
    else:
        await conn.executemany(SET_MESSAGE_TEXT, [(text, mid) for mid, text in texts])


async def list_messages(
    db: AsyncSession,
    session_id: str,
    *,
    limit: int | None = None,
    after_position: int | None = None,
    before_position: int | None = None,
    through_turn: str | None = None,
) -> list[ChatMessageRow]:
    """In history order. With `before_position`, the `limit` messages just before it (still in order).
    With `through_turn`, only the path of turns that ends at it (the prompt of that turn). (Every turn
    reads its session's history: plain SQL, one trip to the driver.)"""
    where = "WHERE session_id = ?"
    params: list[Any] = [session_id]
    if through_turn is not None:
        condition, path_params = on_path(session_id, through_turn)
        where += f" AND {condition}"
        params += path_params
    if after_position is not None:
        where += " AND position > ?"
        params.append(after_position)
    if before_position is not None:
        where += " AND position < ?"
        params.append(before_position)
    backwards = before_position is not None
    return await _page(db, where, params, backwards=backwards, limit=limit)


async def page_messages(
    db: AsyncSession,
    session_id: str,
    *,
    limit: int,
    after_id: str | None = None,
    before_id: str | None = None,
) -> list[ChatMessageRow]:
    """As `list_messages` on the active path (the head's line of turns), with the bounds given as message
    ids of the session, found by the same statement (one round trip where a lookup of the position first
    made two). A bound that names no message of the session gives no rows: `message_position` tells that
    apart from an empty page."""
    condition, path_params = on_path(session_id, None)
    where = f"WHERE session_id = ? AND {condition}"
    params: list[Any] = [session_id, *path_params]
    position = "(SELECT position FROM chat_messages WHERE session_id = ? AND id = ?)"
    if after_id is not None:
        where += f" AND position > {position}"
        params += [session_id, after_id]
    if before_id is not None:
        where += f" AND position < {position}"
        params += [session_id, before_id]
    return await _page(db, where, params, backwards=before_id is not None, limit=limit)


async def _page(
    db: AsyncSession, where: str, params: list[Any], *, backwards: bool, limit: int | None
) -> list[ChatMessageRow]:
    where += " ORDER BY position DESC" if backwards else " ORDER BY position"
    if limit is not None:
        where += " LIMIT ?"
        params.append(limit)
    rows: list[ChatMessageRow] = await _MESSAGES.all(db, where, params)
    return rows[::-1] if backwards else rows


async def get_message(db: AsyncSession, message_id: str) -> ChatMessageRow | None:
    return (await db.exec(select(ChatMessageRow).where(col(ChatMessageRow.id) == message_id))).first()


async def get_queued(db: AsyncSession, message_id: str) -> QueuedMessageRow | None:
    return (await db.exec(select(QueuedMessageRow).where(col(QueuedMessageRow.id) == message_id))).first()


async def message_position(db: AsyncSession, session_id: str, message_id: str) -> int | None:
    query = select(ChatMessageRow.position).where(
        col(ChatMessageRow.session_id) == session_id, col(ChatMessageRow.id) == message_id
    )
    return (await db.exec(query)).first()


async def open_turns(db: AsyncSession) -> list[ChatMessageRow]:
    """turn_start rows with no turn_done: turns a crash left running."""
    done = select(ChatMessageRow.turn_id).where(col(ChatMessageRow.type) == "turn_done")
    query = (
        select(ChatMessageRow)
        .where(col(ChatMessageRow.type) == "turn_start", col(ChatMessageRow.turn_id).not_in(done))
        .order_by(col(ChatMessageRow.position))
    )
    return list((await db.exec(query)).all())


async def turn_messages(db: AsyncSession, turn_id: str) -> list[ChatMessageRow]:
    query = (
        select(ChatMessageRow)
        .where(col(ChatMessageRow.turn_id) == turn_id)
        .order_by(col(ChatMessageRow.position))
    )
    return list((await db.exec(query)).all())


# --- messages waiting for a turn -------------------------------------------------------------------


async def enqueue(db: AsyncSession, row: QueuedMessageRow, new_id: Callable[[], str]) -> None:
    """Stores a message in the waiting line under an id no chat message or waiting message holds (it
    keeps that id when a turn takes it): a taken id is replaced by a fresh one from `new_id`."""
    conn = await raw(db)
    while await conn.fetchall(
        "SELECT 1 FROM chat_messages WHERE id = ? UNION ALL SELECT 1 FROM queued_messages WHERE id = ?",
        (row.id, row.id),
    ):
        row.id = new_id()
    db.add(row)
    await db.flush()
    await _link_files(db, [row])


async def queued(db: AsyncSession, session_id: str) -> list[QueuedMessageRow]:
    """The session's waiting line in order (read at every turn's start and end with several replicas)."""
    rows: list[QueuedMessageRow] = await _QUEUED.all(
        db, "WHERE session_id = ? ORDER BY position", (session_id,)
    )
    return rows


async def sessions_with_queue(db: AsyncSession) -> list[str]:
    query = select(QueuedMessageRow.session_id).distinct()
    return list((await db.exec(query)).all())


async def dequeue(db: AsyncSession, message_ids: Sequence[str]) -> None:
    """Waiting messages out of the line, with their links to files: a turn that takes them links them again
    as it stores them in the history (the same transaction); a withdrawn one uses its files no more."""
    await db.exec(delete(QueuedMessageRow).where(col(QueuedMessageRow.id).in_(message_ids)))
    await files.unlink_messages(db, message_ids)


# --- idempotency keys ------------------------------------------------------------------------------


async def get_idempotency_key(db: AsyncSession, principal: str, key: str) -> IdempotencyKeyRow | None:
    return await db.get(IdempotencyKeyRow, (principal, key))


async def reserve_idempotency_key(db: AsyncSession, row: IdempotencyKeyRow, *, expired_before: float) -> bool:
    """Reserves the key for `row` unless it is held: True when `row` was inserted. An expired holder is
    deleted first. ON CONFLICT DO NOTHING: of racing reservations, on any number of connections or
    processes, exactly one wins and the others read its row; none fails on the primary key."""
    await db.exec(
        delete(IdempotencyKeyRow).where(
            col(IdempotencyKeyRow.principal) == row.principal,
            col(IdempotencyKeyRow.key) == row.key,
            col(IdempotencyKeyRow.created_at) < expired_before,
        )
    )
    values = {c.name: getattr(row, c.name) for c in IdempotencyKeyRow.__table__.columns}  # type: ignore[attr-defined]
    statement = dialect_insert(db)(IdempotencyKeyRow).values(**values).on_conflict_do_nothing()
    inserted = await db.exec(statement.returning(col(IdempotencyKeyRow.key)))
    return inserted.first() is not None


async def prune_idempotency_keys(db: AsyncSession, *, created_before: float) -> None:
    await db.exec(delete(IdempotencyKeyRow).where(col(IdempotencyKeyRow.created_at) < created_before))
