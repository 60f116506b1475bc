"""Copies one database into another (SQLite into PostgreSQL, for a move to production): every table, rows
as they are (positions included, so the histories keep their order), then a row-by-row comparison.

Idempotent: rows go in with INSERT ... ON CONFLICT DO NOTHING on their primary key, so a copy that was
interrupted is finished by running it again, and a second run copies nothing. Both databases must be at
the same migration (the target is migrated first by the command, app/__main__.py). Run it while no server
writes to the source: rows written during the copy may be missed (the comparison then reports them).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import zip_longest
from typing import Any

from sqlalchemy import Connection, Engine, Table, create_engine, event, func, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import SQLModel

import app.storage.tables  # noqa: F401  (registers the tables on SQLModel.metadata)
from app.storage import pg_text
from app.storage.engine import install_pg_text, is_postgres, sync_url

BATCH = 1000


@dataclass
class TableCopy:
    table: str
    source_rows: int
    copied: int
    target_rows: int


COLUMNS = ("table", "in source", "copied", "in target")


def copy_report(done: list[TableCopy]) -> list[str]:
    """What `copy_all` did as a table under a header: each column as wide as its widest cell (a table
    name as long as `pending_tool_requests`, a count of millions), names left-aligned, counts right."""
    rows = [COLUMNS, *((c.table, str(c.source_rows), str(c.copied), str(c.target_rows)) for c in done)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return [
        "  ".join(
            [row[0].ljust(widths[0]), *(cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True))]
        )
        for row in rows
    ]


@dataclass
class Difference:
    table: str
    key: tuple[Any, ...]
    source: tuple[Any, ...] | None
    target: tuple[Any, ...] | None


def tables() -> list[Table]:
    """The app's tables, parents before children (sessions before their messages)."""
    return list(SQLModel.metadata.sorted_tables)


def open_engine(url: str) -> Engine:
    if not is_postgres(url):
        return create_engine(sync_url(url))
    # The same mapping as the service's own engine (app.storage.pg_text): a copy holds what it held.
    engine = create_engine(
        sync_url(url),
        json_serializer=pg_text.dumps_json,
        json_deserializer=_load_stored_json,
    )
    event.listen(engine, "connect", install_pg_text)
    return engine


def _load_stored_json(stored: str | bytes) -> Any:
    return json.loads(pg_text.restored_json(stored))


def copy_all(source: Engine, target: Engine) -> list[TableCopy]:
    """Copies every table in one transaction on the target; returns what each table got."""
    done = []
    with source.connect() as reading, target.begin() as writing:
        for table in tables():
            copied = 0
            for rows in _batches(reading, table):
                copied += _insert(writing, table, rows)
            _advance_sequences(writing, table)
            done.append(TableCopy(table.name, _count(reading, table), copied, _count(writing, table)))
    if target.dialect.name == "postgresql":
        # The planner's statistics of the bulk load now, rather than at autovacuum's next pass: until
        # then a long history reads as a few rows (a sort where an index scan belongs).
        with target.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.exec_driver_sql("ANALYZE")
    return done


def differences(source: Engine, target: Engine, *, limit: int = 10) -> list[Difference]:
    """Rows that are not the same in both, by primary key (at most `limit`): none when the copy is whole."""
    found: list[Difference] = []
    with source.connect() as left, target.connect() as right:
        for table in tables():
            key = [c.name for c in table.primary_key.columns]
            pairs = zip_longest(_ordered(left, table), _ordered(right, table))
            for a, b in _merge(pairs, [table.c.keys().index(k) for k in key]):
                if a != b:
                    row = a if a is not None else b
                    assert row is not None
                    found.append(
                        Difference(table.name, tuple(row[table.c.keys().index(k)] for k in key), a, b)
                    )
                    if len(found) >= limit:
                        return found
    return found


def _merge(
    pairs: Iterator[tuple[tuple[Any, ...] | None, tuple[Any, ...] | None]], key: list[int]
) -> Iterator[tuple[tuple[Any, ...] | None, tuple[Any, ...] | None]]:
    """The two ordered row streams side by side, a row missing on one side paired with None."""
    lefts: deque[tuple[Any, ...]] = deque()
    rights: deque[tuple[Any, ...]] = deque()
    for a, b in pairs:
        if a is not None:
            lefts.append(a)
        if b is not None:
            rights.append(b)
        while lefts and rights:
            ka, kb = tuple(lefts[0][i] for i in key), tuple(rights[0][i] for i in key)
            if ka == kb:
                yield lefts.popleft(), rights.popleft()
            elif ka < kb:
                yield lefts.popleft(), None
            else:
                yield None, rights.popleft()
    for a in lefts:
        yield a, None
    for b in rights:
        yield None, b


def _ordered(connection: Connection, table: Table) -> Iterator[tuple[Any, ...]]:
    """Every row of `table` by primary key, in byte order on both dialects (PostgreSQL's collation could
    otherwise order text keys another way than SQLite)."""
    postgres = connection.dialect.name == "postgresql"
    order = [c.collate("C") if postgres and _is_text(c) else c for c in table.primary_key.columns]
    result = connection.execution_options(yield_per=BATCH).execute(select(table).order_by(*order))
    for row in result:
        yield tuple(row)


def _is_text(column: Any) -> bool:
    return column.type.python_type is str


def _batches(connection: Connection, table: Table) -> Iterator[list[dict[str, Any]]]:
    result = connection.execution_options(yield_per=BATCH).execute(select(table))
    for part in result.partitions():
        yield [dict(row._mapping) for row in part]


def _insert(connection: Connection, table: Table, rows: list[dict[str, Any]]) -> int:
    insert = postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert
    statement = insert(table).on_conflict_do_nothing().returning(*table.primary_key.columns)
    return len(connection.execute(statement, rows).all())


def _advance_sequences(connection: Connection, table: Table) -> None:
    """PostgreSQL's sequence behind an integer key given explicit values: past the largest copied, so the
    next new row gets the next position."""
    if connection.dialect.name != "postgresql":
        return
    for column in table.primary_key.columns:
        if column.autoincrement is True or (column.type.python_type is int and len(table.primary_key) == 1):
            connection.execute(
                text(
                    f"SELECT setval(pg_get_serial_sequence('{table.name}', '{column.name}'),"
                    f" COALESCE((SELECT max({column.name}) FROM {table.name}), 0) + 1, false)"
                )
            )


def _count(connection: Connection, table: Table) -> int:
    return int(connection.execute(select(func.count()).select_from(table)).scalar_one())
