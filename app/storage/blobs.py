"""Where files' bytes live (docs/files.md, Storage): the seam, and its implementation in the service's own
database. A blob is named by the SHA-256 of its bytes, so it is written once whoever uploads the same bytes,
and read a range at a time (never loaded whole to be served). The object store behind the same seam is
app.storage.object_store; `open_blobs` chooses one when the runtime is built, from PARLEY_FILES_URL.

The file rows (app.storage.files) say which blobs are held: a blob is written before the row that names
it, and forgotten after the last row that named it went (`forget` checks that none is left).
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import IO, Protocol

from sqlalchemy import delete, exists
from sqlmodel import col

from app.storage import files
from app.storage.engine import Database
from app.storage.sql import dialect_insert
from app.storage.tables import FileChunkRow, FileRow


class Blobs(Protocol):
    """Content-addressed bytes: `put` once, `read` a range at a time, `forget` when no file holds them."""

    async def has(self, sha256: str) -> bool: ...

    async def put(self, sha256: str, size: int, spool: IO[bytes]) -> None:
        """Stores `size` bytes read from `spool` (at its start) under `sha256`, unless they are there."""
        ...

    def read(self, sha256: str, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        """Bytes `start` to `end` (exclusive; None: to the end) a part at a time; nothing when absent."""
        ...

    async def forget(self, sha256s: Iterable[str]) -> None:
        """Deletes each blob that no file row holds any more (one still held stays)."""
        ...

    async def close(self) -> None: ...


class DatabaseBlobs:
    """Blobs in the `file_chunks` table, `chunk_bytes` per row: on SQLite and PostgreSQL alike, shared by
    every replica with nothing else to run. Each part is read in its own short read, so none is held
    while a client takes the previous part."""

    def __init__(self, database: Database, chunk_bytes: int) -> None:
        self._database = database
        self._chunk = chunk_bytes

    async def has(self, sha256: str) -> bool:
        async with self._database.read() as db:
            return await files.has_blob(db, sha256)

    async def put(self, sha256: str, size: int, spool: IO[bytes]) -> None:
        async with self._database.session() as db:
            if await files.has_blob(db, sha256):
                return
            insert = dialect_insert(db)
            part = 0
            while data := spool.read(self._chunk):
                statement = (
                    insert(FileChunkRow).values(sha256=sha256, part=part, data=data).on_conflict_do_nothing()
                )
                await db.exec(statement)
                part += 1
            await db.commit()

    async def read(self, sha256: str, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        # Parts are `chunk_bytes` each, except a blob stored with another PARLEY_FILES_CHUNK_BYTES: the
        # first part's length says what they were.
        async with self._database.read() as db:
            first = await files.read_part(db, sha256, 0)
        if first is None:
            return
        width = len(first)
        part, offset = divmod(start, width)
        data: bytes | None = first if part == 0 else None
        while end is None or part * width < end:
            if data is None:
                async with self._database.read() as db:
                    data = await files.read_part(db, sha256, part)
                if data is None:
                    return
            stop = len(data) if end is None else min(len(data), end - part * width)
            if offset < stop:
                yield data[offset:stop]
            offset, data, part = 0, None, part + 1

    async def forget(self, sha256s: Iterable[str]) -> None:
        wanted = sorted(set(sha256s))
        if not wanted:
            return
        async with self._database.session() as db:
            for sha256 in wanted:
                held = exists().where(col(FileRow.sha256) == sha256)
                await db.exec(delete(FileChunkRow).where(col(FileChunkRow.sha256) == sha256, ~held))
            await db.commit()

    async def close(self) -> None:
        return None


@dataclass
class BlobCopy:
    blobs: int = 0
    copied: int = 0
    bytes: int = 0
    missing: list[str] = field(default_factory=list)


async def copy_blobs(database: Database, source: Blobs, target: Blobs) -> BlobCopy:
    """Every blob a file row of `database` holds, from `source` into `target` (`python -m app migrate-files`):
    one at a time, spooled to disk past 1 MiB and checked against its hash on the way; a blob the target
    holds already is left as it is, so a copy that stopped is finished by running it again."""
    async with database.read() as db:
        held = await files.blob_sizes(db)
    done = BlobCopy(blobs=len(held))
    for sha256, size in held:
        if await target.has(sha256):
            continue
        digest = hashlib.sha256()
        with tempfile.SpooledTemporaryFile(1024 * 1024) as spool:
            async for data in source.read(sha256):
                digest.update(data)
                spool.write(data)
            if digest.hexdigest() != sha256 or spool.tell() != size:
                done.missing.append(sha256)
                continue
            spool.seek(0)
            await target.put(sha256, size, spool)
        done.copied += 1
        done.bytes += size
    return done


def open_blobs(files_url: str | None, database: Database, chunk_bytes: int) -> Blobs:
    """The store PARLEY_FILES_URL names: none, the database; `s3://bucket/prefix`, that bucket (with the
    AWS variables of the environment: app.storage.object_store)."""
    if not files_url:
        return DatabaseBlobs(database, chunk_bytes)
    # Imported only here: a service that keeps its files in the database never loads the S3 client.
    from app.storage.object_store import ObjectStoreBlobs, S3Location

    return ObjectStoreBlobs(S3Location.from_env(files_url), database)
