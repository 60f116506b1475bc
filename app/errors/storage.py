"""What an exception means when storage refused the work: the domain error (app.errors) for SQLite busy,
full or failing, or PostgreSQL out of reach. A module of its own because it looks at the drivers' errors:
app.errors itself loads no driver, so the agent loop that raises its errors stays free of storage."""

from __future__ import annotations

import sqlite3

from app.errors import (
    STORAGE_BUSY_RETRY_AFTER,
    STORAGE_FULL_RETRY_AFTER,
    STORAGE_UNAVAILABLE_RETRY_AFTER,
    StorageBusy,
    StorageFailed,
    StorageFull,
    StorageOutOfReach,
    StorageUnavailable,
)

# SQLite's primary result codes (the low byte of an extended one, as sqlite3 reports it).
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_IOERR, _SQLITE_FULL = 5, 6, 10, 13


def _storage_refusal(error: sqlite3.Error) -> StorageUnavailable | None:
    """The refusal when SQLite refuses work. None for any other SQLite error (a constraint, a bug)."""
    primary = getattr(error, "sqlite_errorcode", -1) & 0xFF
    text = str(error).lower()
    if primary in (_SQLITE_BUSY, _SQLITE_LOCKED) or "is locked" in text:
        message = "The database is busy; retry in a moment."
        return StorageBusy(message, retry_after=STORAGE_BUSY_RETRY_AFTER)
    if primary == _SQLITE_FULL or "database or disk is full" in text:
        message = "The server's storage is full; retry later."
        return StorageFull(message, retry_after=STORAGE_FULL_RETRY_AFTER)
    if primary == _SQLITE_IOERR or "disk i/o error" in text:
        message = "The server's storage failed; retry later."
        return StorageFailed(message, retry_after=STORAGE_FULL_RETRY_AFTER)
    return None


def storage_refusal(exc: BaseException) -> StorageUnavailable | None:
    """What `exc` means when storage refused the work (busy, full, failing), or None when it is anything
    else. Looks through SQLAlchemy's wrapping and exception groups to the driver's error."""
    if isinstance(exc, StorageUnavailable):
        return exc
    error = sqlite_error(exc)
    if error is not None:
        return _storage_refusal(error)
    return _database_unavailable(exc)


def sqlite_error(exc: BaseException) -> sqlite3.Error | None:
    """The driver's error behind `exc`, if any: SQLAlchemy raises its own errors `from` the driver's."""
    found = _in_chain(exc, sqlite3.Error)
    return found if isinstance(found, sqlite3.Error) else None


def _in_chain(
    exc: BaseException, kinds: type[BaseException] | tuple[type[BaseException], ...]
) -> BaseException | None:
    """The first exception of `kinds` in `exc`, its causes and (groups) its members."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, kinds):
            return current
        todo.append(current.__cause__)
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
    return None


def _database_unavailable(exc: BaseException) -> StorageUnavailable | None:
    """The refusal when PostgreSQL is out of reach: the connection refused or cut (a restart, a failover, the
    network), no pooled connection free within the pool timeout, or a statement past the statement timeout.
    None for any other error."""
    # Imported here: the error model must not load a driver the SQLite deployment never uses.
    import psycopg
    from sqlalchemy import exc as sa_exc

    kinds = (psycopg.OperationalError, psycopg.InterfaceError, sa_exc.TimeoutError, sa_exc.OperationalError)
    if _in_chain(exc, kinds) is None:
        return None
    message = "The database is unavailable; retry in a moment."
    return StorageOutOfReach(message, retry_after=STORAGE_UNAVAILABLE_RETRY_AFTER)
