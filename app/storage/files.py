"""SQL of files (docs/files.md): file rows, their content-addressed blobs in parts, and the links from the
messages that use them. Functions take a database session (`db`) and never commit: callers own
transactions."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, exists, func
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from app.storage.sql import dialect_insert
from app.storage.tables import FileChunkRow, FileRow, MessageFileRow


async def owned_file(db: AsyncSession, principal: str, file_id: str) -> FileRow | None:
    """The file if `principal` owns it: another principal's file is as absent as a missing one."""
    query = select(FileRow).where(col(FileRow.id) == file_id, col(FileRow.principal) == principal)
    return (await db.exec(query)).first()


async def owned_files(db: AsyncSession, principal: str, file_ids: Sequence[str]) -> dict[str, FileRow]:
    query = select(FileRow).where(col(FileRow.id).in_(file_ids), col(FileRow.principal) == principal)
    return {row.id: row for row in (await db.exec(query)).all()}


async def file_by_content(db: AsyncSession, principal: str, sha256: str) -> FileRow | None:
    query = select(FileRow).where(col(FileRow.principal) == principal, col(FileRow.sha256) == sha256)
    return (await db.exec(query)).first()


async def list_files(
    db: AsyncSession, principal: str, *, limit: int, before: tuple[str, str] | None
) -> Sequence[FileRow]:
    """`principal`'s files, newest first; `before` is the (created_at, id) of the previous page's last."""
    query = (
        select(FileRow)
        .where(col(FileRow.principal) == principal)
        .order_by(col(FileRow.created_at).desc(), col(FileRow.id).desc())
    )
    if before is not None:
        created_at, file_id = before
        query = query.where(
            (col(FileRow.created_at) < created_at)
            | ((col(FileRow.created_at) == created_at) & (col(FileRow.id) < file_id))
        )
    return (await db.exec(query.limit(limit))).all()


async def has_blob(db: AsyncSession, sha256: str) -> bool:
    query = select(FileChunkRow.part).where(col(FileChunkRow.sha256) == sha256, col(FileChunkRow.part) == 0)
    return (await db.exec(query)).first() is not None


async def unheld_blobs(db: AsyncSession, sha256s: Sequence[str]) -> list[str]:
    """Of `sha256s`, those no file row holds (blobs an object store may delete)."""
    query = select(FileRow.sha256).where(col(FileRow.sha256).in_(sha256s)).distinct()
    held = set((await db.exec(query)).all())
    return [sha256 for sha256 in sha256s if sha256 not in held]


async def insert_file(db: AsyncSession, row: FileRow) -> FileRow:
    """Stores `row` unless the principal has a file with the same bytes: then that one is the answer
    (ON CONFLICT: of racing uploads of the same bytes, one row wins and the others read it)."""
    values = {c.name: getattr(row, c.name) for c in FileRow.__table__.columns}  # type: ignore[attr-defined]
    statement = (
        dialect_insert(db)(FileRow)
        .values(**values)
        .on_conflict_do_nothing(index_elements=["principal", "sha256"])
        .returning(col(FileRow.id))
    )
    if (await db.exec(statement)).first() is not None:
        return row
    found = await file_by_content(db, row.principal, row.sha256)
    if found is None:  # the id itself was taken (64 random bits): the caller retries with another
        raise LookupError(row.id)
    return found


async def read_part(db: AsyncSession, sha256: str, part: int) -> bytes | None:
    query = select(FileChunkRow.data).where(
        col(FileChunkRow.sha256) == sha256, col(FileChunkRow.part) == part
    )
    data = (await db.exec(query)).first()
    return bytes(data) if data is not None else None


async def file_in_use(db: AsyncSession, file_id: str) -> bool:
    query = select(func.count()).select_from(MessageFileRow).where(col(MessageFileRow.file_id) == file_id)
    return bool((await db.exec(query)).one())


async def delete_files(db: AsyncSession, rows: Sequence[FileRow]) -> list[str]:
    """The files; the SHA-256 of their bytes, for the blob store to forget once this commits (it keeps the
    blobs another file still holds: app.storage.blobs)."""
    if not rows:
        return []
    await db.exec(delete(FileRow).where(col(FileRow.id).in_([r.id for r in rows])))
    return sorted({r.sha256 for r in rows})


async def link_messages(db: AsyncSession, links: Sequence[tuple[str, str, str]]) -> None:
    """(message_id, file_id, session_id) each; a link that exists already stays."""
    insert = dialect_insert(db)
    for message_id, file_id, session_id in links:
        statement = (
            insert(MessageFileRow)
            .values(message_id=message_id, file_id=file_id, session_id=session_id)
            .on_conflict_do_nothing()
        )
        await db.exec(statement)


async def unlink_messages(db: AsyncSession, message_ids: Sequence[str]) -> None:
    await db.exec(delete(MessageFileRow).where(col(MessageFileRow.message_id).in_(message_ids)))


async def session_files(db: AsyncSession, session_id: str) -> list[str]:
    query = select(MessageFileRow.file_id).where(col(MessageFileRow.session_id) == session_id).distinct()
    return list((await db.exec(query)).all())


async def delete_unlinked(db: AsyncSession, file_ids: Sequence[str]) -> list[str]:
    """Of `file_ids`, the files no message links any more (a deleted session's); the SHA-256 of their
    bytes (delete_files)."""
    if not file_ids:
        return []
    linked = exists().where(col(MessageFileRow.file_id) == col(FileRow.id))
    rows = (await db.exec(select(FileRow).where(col(FileRow.id).in_(file_ids), ~linked))).all()
    return await delete_files(db, rows)


async def any_file(db: AsyncSession, file_id: str) -> FileRow | None:
    """Whoever owns it: for the runner's own work (a turn reading its messages' files)."""
    return await db.get(FileRow, file_id)


async def session_blobs(db: AsyncSession, session_id: str) -> list[str]:
    """The SHA-256 of the files the session's messages use: the blobs to forget once it is deleted (those
    another file still holds stay)."""
    query = (
        select(FileRow.sha256)
        .join(MessageFileRow, col(MessageFileRow.file_id) == col(FileRow.id))
        .where(col(MessageFileRow.session_id) == session_id)
        .distinct()
    )
    return list((await db.exec(query)).all())


async def blob_sizes(db: AsyncSession) -> list[tuple[str, int]]:
    """Every blob a file row holds, with its size: what a copy of the blobs copies."""
    query = (
        select(FileRow.sha256, func.max(FileRow.size))
        .group_by(col(FileRow.sha256))
        .order_by(col(FileRow.sha256))
    )
    return [(sha256, int(size)) for sha256, size in (await db.exec(query)).all()]
