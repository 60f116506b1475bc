"""app.storage.files against a real, migrated database, SQLite and PostgreSQL, with the blobs in the database
(app.storage.blobs.DatabaseBlobs): blobs written and read back in parts, byte for byte, whole or a range;
one file per principal and content, also when uploads race (ON CONFLICT); links
that keep a file, and a deleted session that takes its files along unless another session links them."""

from __future__ import annotations

import asyncio
import hashlib
import io
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import func
from sqlmodel import select

from app.protocol.ids import new_file_id
from app.storage import files, repository
from app.storage.blobs import DatabaseBlobs
from app.storage.engine import Database
from app.storage.tables import ChatSessionRow, FileChunkRow, FileRow, MessageFileRow

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

DATA = bytes(range(256)) * 100 + b"\x00\xff tail"  # every byte value, NUL included
SHA = hashlib.sha256(DATA).hexdigest()


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    db = Database(database_url)
    yield db
    await db.dispose()


def file_row(principal: str, sha256: str = SHA, size: int = len(DATA)) -> FileRow:
    return FileRow(
        id=new_file_id(),
        principal=principal,
        name="blob.bin",
        media_type="application/pdf",
        size=size,
        sha256=sha256,
        created_at="2026-11-29T04:00:00.000+00:00",
    )


def blobs(database: Database) -> DatabaseBlobs:
    return DatabaseBlobs(database, 1000)


async def store(database: Database, principal: str) -> FileRow:
    await blobs(database).put(SHA, len(DATA), io.BytesIO(DATA))
    async with database.session() as db:
        row = await files.insert_file(db, file_row(principal))
        await db.commit()
    return row


async def read_back(database: Database, sha256: str, start: int = 0, end: int | None = None) -> bytes:
    return b"".join([part async for part in blobs(database).read(sha256, start, end)])


async def count(database: Database, table: type[FileRow] | type[FileChunkRow] | type[MessageFileRow]) -> int:
    async with database.read() as db:
        return int((await db.exec(select(func.count()).select_from(table))).one())


async def test_a_blob_is_read_back_byte_for_byte(database: Database) -> None:
    row = await store(database, "alice")
    assert await read_back(database, row.sha256) == DATA
    assert await count(database, FileChunkRow) == 26


@pytest.mark.parametrize(
    ("start", "end"), [(0, 1), (999, 1001), (1000, 2000), (1500, None), (25_600, None), (7, 25_000)]
)
async def test_a_range_of_a_blob_is_read_from_the_parts_that_hold_it(
    database: Database, start: int, end: int | None
) -> None:
    await store(database, "alice")
    assert await read_back(database, SHA, start, end) == DATA[start:end]


async def test_an_absent_blob_reads_as_nothing(database: Database) -> None:
    assert await read_back(database, "0" * 64) == b""


async def test_the_same_bytes_are_one_file_per_principal_even_when_racing(database: Database) -> None:
    rows = await asyncio.gather(*(store(database, "alice") for _ in range(5)))
    assert len({r.id for r in rows}) == 1
    bob = await store(database, "bob")
    assert bob.id != rows[0].id
    assert await count(database, FileRow) == 2
    assert await count(database, FileChunkRow) == 26
    async with database.read() as db:
        assert await files.owned_file(db, "bob", rows[0].id) is None
        assert (await files.owned_file(db, "alice", rows[0].id)) is not None


async def test_a_blob_goes_with_the_last_file_that_holds_it(database: Database) -> None:
    alice, bob = await store(database, "alice"), await store(database, "bob")
    async with database.session() as db:
        freed = await files.delete_files(db, [alice])
        await db.commit()
    assert freed == [SHA]
    await blobs(database).forget(freed)  # bob's file holds it still
    assert await read_back(database, SHA) == DATA
    async with database.session() as db:
        freed = await files.delete_files(db, [bob])
        await db.commit()
    await blobs(database).forget(freed)
    assert await count(database, FileChunkRow) == 0


async def test_a_deleted_session_takes_the_files_no_other_session_links(database: Database) -> None:
    shared = await store(database, "alice")
    await blobs(database).put("b" * 64, 3, io.BytesIO(b"own"))
    async with database.session() as db:
        own = await files.insert_file(db, file_row("alice", "b" * 64, 3))
        for sid in ("s_1", "s_2"):
            at = "2026-11-29T04:00:00.000+00:00"
            db.add(
                ChatSessionRow(id=sid, principal="alice", model="parley/demo", created_at=at, updated_at=at)
            )
        await db.flush()
        await files.link_messages(
            db, [("m_1", shared.id, "s_1"), ("m_1", own.id, "s_1"), ("m_2", shared.id, "s_2")]
        )
        await files.link_messages(db, [("m_1", own.id, "s_1")])  # again: the link stays one
        await db.commit()
    async with database.read() as db:
        assert await files.file_in_use(db, own.id)
        assert sorted(await files.session_files(db, "s_1")) == sorted([shared.id, own.id])
    async with database.session() as db:
        held = await files.session_blobs(db, "s_1")
        await repository.delete_session(db, "s_1")
        await db.commit()
    assert sorted(held) == sorted([SHA, "b" * 64])
    await blobs(database).forget(held)
    async with database.read() as db:
        assert await files.any_file(db, own.id) is None
        assert await files.any_file(db, shared.id) is not None
        assert await files.read_part(db, "b" * 64, 0) is None
    assert await count(database, MessageFileRow) == 1
    async with database.session() as db:
        held = await files.session_blobs(db, "s_2")
        await repository.delete_session(db, "s_2")
        await db.commit()
    await blobs(database).forget(held)
    assert (await count(database, FileRow), await count(database, FileChunkRow)) == (0, 0)


async def test_a_page_of_files_is_newest_first(database: Database) -> None:
    async with database.session() as db:
        for n in range(3):
            row = file_row("alice", f"{n}" * 64, 1)
            row.created_at = f"2026-11-29T04:00:0{n}.000+00:00"
            await files.insert_file(db, row)
        await db.commit()
    async with database.read() as db:
        first = await files.list_files(db, "alice", limit=2, before=None)
        rest = await files.list_files(db, "alice", limit=2, before=(first[-1].created_at, first[-1].id))
        assert [r.sha256[0] for r in [*first, *rest]] == ["2", "1", "0"]
        assert await files.list_files(db, "bob", limit=2, before=None) == []
