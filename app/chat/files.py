"""Files (docs/files.md): uploads read as they stream in and checked against their bytes, stored once per
principal and content, served a part at a time; and a message's attachments, checked against the
session's model before anything is stored."""

from __future__ import annotations

import base64
import binascii
import codecs
import hashlib
import re
import tempfile
import warnings
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from PIL import Image, UnidentifiedImageError
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from app.chat.errors import (
    FileInUse,
    InvalidCursor,
    RangeNotSatisfiable,
    UnsupportedAttachment,
    UnsupportedMediaType,
)
from app.errors import InvalidRequest, NotFound, PayloadTooLarge
from app.llm.gateway import ModelGateway
from app.protocol.clock import now_iso
from app.protocol.files import Attachment, AttachmentRef, DataUrlAttachment, FileOut, FilePage
from app.protocol.ids import new_file_id
from app.settings import Settings
from app.storage import files as store
from app.storage.blobs import Blobs
from app.storage.engine import Database
from app.storage.tables import FileRow

# What a multipart body may hold besides the file's bytes: boundaries, part headers, the purpose field.
_MULTIPART_OVERHEAD = 64 * 1024
_PURPOSE_MAX = 64
_SPOOL_IN_MEMORY = 1024 * 1024
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
)
# Text-like types are UTF-8 without NUL bytes, named as such by their extension or their declared type.
_TEXT_EXTENSIONS = {
    ".txt": "text/plain",
    ".text": "text/plain",
    ".log": "text/plain",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".csv": "text/csv",
    ".json": "application/json",
}
_TEXT_TYPES = frozenset(_TEXT_EXTENSIONS.values())
_EXTENSION = {
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/gif": ".gif",
    "image/webp": ".webp",
    "application/pdf": ".pdf",
    "text/plain": ".txt",
    "text/markdown": ".md",
    "text/csv": ".csv",
    "application/json": ".json",
}
_UNSAFE_NAME = re.compile(r"[\x00-\x1f\x7f]")


def sniff(head: bytes, name: str, declared: str | None, *, text: bool) -> str | None:
    """The media type the bytes show (`head`: their first bytes; `text`: all of them are UTF-8 without NUL),
    or None. A binary type comes from its magic number only; a text type needs text bytes and a name or a
    declared type that says which."""
    for magic, media_type in _MAGIC:
        if head.startswith(magic):
            return media_type
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    if not text:
        return None
    dot = name.rfind(".")
    by_name = _TEXT_EXTENSIONS.get(name[dot:].lower()) if dot >= 0 else None
    if by_name is not None:
        return by_name
    declared = (declared or "").split(";", 1)[0].strip().lower()
    return declared if declared in _TEXT_TYPES else None


_RANGE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$", re.IGNORECASE)


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The one range of `Range: bytes=first-last`, `bytes=first-` or `bytes=-suffix` (RFC 9110 §14.1.2) as
    (first, last) within `size`; None for no header, or one this server answers with the whole file (several
    ranges, another unit, a malformed one: a server may ignore a Range). A range that starts past the end,
    or an empty suffix, is 416."""
    found = _RANGE.match(header or "")
    if found is None or (not found[1] and not found[2]):
        return None
    if not found[1]:  # the last `suffix` bytes
        suffix = int(found[2])
        if suffix == 0 or size == 0:
            raise _unsatisfiable(header or "", size)
        return max(0, size - suffix), size - 1
    first = int(found[1])
    last = int(found[2]) if found[2] else max(first, size - 1)
    if last < first:  # malformed (a server ignores it)
        return None
    if first >= size:
        raise _unsatisfiable(header or "", size)
    return first, min(last, size - 1)


def _unsatisfiable(header: str, size: int) -> RangeNotSatisfiable:
    return RangeNotSatisfiable(
        f"The range {header.strip()!r} starts past the file's end ({size} bytes).", details={"size": size}
    )


def clean_name(name: str | None, media_type: str | None = None) -> str:
    """The file's name without directories or control characters, at most 255 characters."""
    base = re.split(r"[/\\]", name or "")[-1]
    base = _UNSAFE_NAME.sub("", base).strip()[:255]
    if base:
        return base
    return "attachment" + _EXTENSION.get(media_type or "", "")


@dataclass
class _Received:
    """A file's bytes as they arrive: spooled (to disk past 1 MiB), hashed, counted, checked as text."""

    limit: int
    spool: IO[bytes] = field(default_factory=lambda: tempfile.SpooledTemporaryFile(_SPOOL_IN_MEMORY))  # noqa: SIM115
    digest: Any = field(default_factory=hashlib.sha256)
    size: int = 0
    head: bytes = b""
    text: bool = True
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")()
    )

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limit:
            raise PayloadTooLarge(
                f"The file exceeds {self.limit} bytes.", details={"field": "file", "limit": self.limit}
            )
        if len(self.head) < 16:
            self.head = (self.head + data)[:16]
        self.digest.update(data)
        self.spool.write(data)
        if self.text:
            try:
                self._decoder.decode(data)
            except UnicodeDecodeError:
                self.text = False
            else:
                self.text = b"\x00" not in data

    def finish(self) -> None:
        if self.text:
            try:
                self._decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                self.text = False
        self.spool.seek(0)

    @property
    def sha256(self) -> str:
        return str(self.digest.hexdigest())

    def close(self) -> None:
        self.spool.close()


@dataclass
class _Part:
    name: str = ""
    filename: str | None = None
    content_type: str | None = None


class _Form:
    """multipart/form-data read as it streams in: the `file` part into a spool, `purpose` kept, anything
    else refused; never more than `limit` bytes in all."""

    def __init__(self, boundary: bytes, file_limit: int) -> None:
        self.file: _Received | None = None
        self.filename: str | None = None
        self.declared: str | None = None
        self.purpose: bytearray | None = None
        self._file_limit = file_limit
        self._part = _Part()
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._headers: dict[str, str] = {}
        self._error: Exception | None = None
        self._parser = MultipartParser(
            boundary,
            {
                "on_part_begin": self._begin,
                "on_header_field": lambda d, s, e: self._header_field.extend(d[s:e]),
                "on_header_value": lambda d, s, e: self._header_value.extend(d[s:e]),
                "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished,
                "on_part_data": self._data,
            },
        )
        self.ended = False

    def write(self, chunk: bytes) -> None:
        try:
            self._parser.write(chunk)
        except MultipartParseError as exc:
            if isinstance(exc.__cause__, PayloadTooLarge | InvalidRequest):
                raise exc.__cause__ from None
            raise InvalidRequest("file", "The body is not valid multipart/form-data.", "multipart") from exc

    def finish(self) -> None:
        self._parser.finalize()
        if self.purpose is not None and len(self.purpose.decode("utf-8", "replace")) > _PURPOSE_MAX:
            raise InvalidRequest("purpose", f"At most {_PURPOSE_MAX} characters.", "string_too_long")
        if self.file is None:
            raise InvalidRequest("file", "The form has no `file` field (a file part).", "missing")
        self.file.finish()

    def _begin(self) -> None:
        self._headers = {}

    def _header_end(self) -> None:
        # latin-1: the bytes as they came, which parse_options_header takes back as latin-1 (a filename's
        # UTF-8 is decoded once it is parsed out).
        name = self._header_field.decode("latin-1").lower()
        self._headers[name] = self._header_value.decode("latin-1")
        self._header_field.clear()
        self._header_value.clear()

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get("content-disposition", ""))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        filename = options.get(b"filename")
        self._part = _Part(name, filename.decode("utf-8", "replace") if filename is not None else None)
        self._part.content_type = self._headers.get("content-type")
        if name == "file":
            if self.file is not None:
                raise InvalidRequest("file", "Send one `file` part per upload.", "multiple")
            self.file = _Received(self._file_limit)
            self.filename, self.declared = self._part.filename, self._part.content_type
        elif name == "purpose":
            if self.purpose is not None:
                raise InvalidRequest("purpose", "Send `purpose` once.", "multiple")
            self.purpose = bytearray()
        else:
            raise InvalidRequest(
                name or "(unnamed)", "Unknown form field: only `file` and `purpose`.", "extra"
            )

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._part.name == "file" and self.file is not None:
            self.file.write(data[start:end])
        elif self._part.name == "purpose" and self.purpose is not None:
            self.purpose.extend(data[start:end])
            if len(self.purpose) > 4 * _PURPOSE_MAX:  # past any UTF-8 of _PURPOSE_MAX characters
                raise InvalidRequest("purpose", f"At most {_PURPOSE_MAX} characters.", "string_too_long")


def to_out(row: FileRow) -> FileOut:
    return FileOut(
        id=row.id,
        name=row.name,
        media_type=row.media_type,
        size=row.size,
        sha256=row.sha256,
        created_at=row.created_at,
        width=row.width,
        height=row.height,
    )


def to_attachment(row: FileRow) -> Attachment:
    return Attachment(
        file_id=row.id,
        name=row.name,
        media_type=row.media_type,
        size=row.size,
        width=row.width,
        height=row.height,
    )


@dataclass
class Checked:
    """A file whose bytes passed the checks, not stored yet."""

    received: _Received
    name: str
    media_type: str
    width: int | None
    height: int | None


class Files:
    def __init__(self, settings: Settings, database: Database, models: ModelGateway, blobs: Blobs) -> None:
        self._settings = settings
        self._database = database
        self._models = models
        self._blobs = blobs

    # --- uploads -------------------------------------------------------------------------------------

    async def upload(
        self, principal: str, content_type: str | None, content_length: str | None, body: AsyncIterator[bytes]
    ) -> FileOut:
        """Reads a multipart upload as it streams in; refuses it (storing nothing) past the size limit, as
        soon as the Content-Length or the bytes counted so far say so, or when its bytes are not of an
        allowed type."""
        limit = self._settings.files_max_bytes
        body_limit = limit + _MULTIPART_OVERHEAD
        if (
            content_length is not None
            and content_length.strip().isdigit()
            and int(content_length) > body_limit
        ):
            raise PayloadTooLarge(
                f"The file exceeds {limit} bytes.", details={"field": "file", "limit": limit}
            )
        kind, options = parse_options_header(content_type or "")
        boundary = options.get(b"boundary")
        if kind != b"multipart/form-data" or not boundary:
            raise UnsupportedMediaType(
                "Send the file as multipart/form-data with a `file` field.",
                details={"content_type": content_type},
            )
        form = _Form(boundary, limit)
        seen = 0
        try:
            async for chunk in body:
                seen += len(chunk)
                if seen > body_limit:
                    raise PayloadTooLarge(
                        f"The file exceeds {limit} bytes.", details={"field": "file", "limit": limit}
                    )
                form.write(chunk)
            form.finish()
            assert form.file is not None
            checked = self._check(form.file, form.filename, form.declared)
            return to_out(await self._store(principal, checked))
        finally:
            if form.file is not None:
                form.file.close()

    def _check(self, received: _Received, filename: str | None, declared: str | None) -> Checked:
        if received.size == 0:
            raise InvalidRequest("file", "The file is empty.", "empty")
        name = clean_name(filename)
        media_type = sniff(received.head, name, declared, text=received.text)
        allowed = self._settings.allowed_file_types
        if media_type is None or media_type not in allowed:
            shown = media_type or "not one of the known types (by its bytes)"
            raise UnsupportedMediaType(
                f"The file's type is {shown}; allowed: {', '.join(allowed)}.",
                details={"media_type": media_type, "declared": declared, "allowed": allowed},
            )
        width = height = None
        if media_type.startswith("image/"):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error", Image.DecompressionBombWarning)
                    with Image.open(received.spool) as image:  # reads the header only
                        width, height = image.size
            except (
                UnidentifiedImageError,
                OSError,
                ValueError,
                Image.DecompressionBombError,
                Image.DecompressionBombWarning,
            ) as exc:
                raise UnsupportedMediaType(
                    f"The file starts as {media_type} but is not a readable image.",
                    details={"media_type": media_type},
                ) from exc
            received.spool.seek(0)
        if filename is None or "." not in name:
            name = clean_name(name if filename else None, media_type)
            if filename and "." not in name:
                name += _EXTENSION.get(media_type, "")
        return Checked(received, name, media_type, width, height)

    async def _store(self, principal: str, checked: Checked) -> FileRow:
        received = checked.received
        sha256 = received.sha256
        async with self._database.read() as db:
            found = await store.file_by_content(db, principal, sha256)
        if found is not None:
            return found
        # The bytes first, then the row that names them, then a check that they are still there.
        await self._blobs.put(sha256, received.size, received.spool)
        async with self._database.session() as db:
            while True:
                row = FileRow(
                    id=new_file_id(),
                    principal=principal,
                    name=checked.name,
                    media_type=checked.media_type,
                    size=received.size,
                    sha256=sha256,
                    created_at=now_iso(),
                    width=checked.width,
                    height=checked.height,
                )
                try:
                    stored = await store.insert_file(db, row)
                except LookupError:  # the id was taken: another one
                    continue
                break
            await db.commit()
        # A deletion that found no row holding these bytes may have forgotten them between the put and
        # this commit (another principal's last file with the same bytes): now this row holds them, so
        # any later deletion keeps them; if they went meanwhile, they are stored again.
        if not await self._blobs.has(sha256):
            received.spool.seek(0)
            await self._blobs.put(sha256, received.size, received.spool)
        return stored

    # --- reading and deleting ------------------------------------------------------------------------

    async def get(self, principal: str, file_id: str) -> FileOut:
        return to_out(await self._owned(principal, file_id))

    async def _owned(self, principal: str, file_id: str) -> FileRow:
        async with self._database.read() as db:
            row = await store.owned_file(db, principal, file_id)
        if row is None:
            raise NotFound(f"No file {file_id!r}.", details={"file_id": file_id})
        return row

    async def page(self, principal: str, *, limit: int, after: str | None) -> FilePage:
        async with self._database.read() as db:
            before = None
            if after is not None:
                cursor = await store.owned_file(db, principal, after)
                if cursor is None:
                    raise InvalidCursor(f"No file {after!r} to page after.", details={"cursor": after})
                before = (cursor.created_at, cursor.id)
            rows = await store.list_files(db, principal, limit=limit + 1, before=before)
        more = len(rows) > limit
        rows = rows[:limit]
        return FilePage(files=[to_out(r) for r in rows], next_cursor=rows[-1].id if more and rows else None)

    async def content(
        self, principal: str, file_id: str, range_header: str | None = None
    ) -> tuple[FileOut, tuple[int, int] | None, AsyncIterator[bytes]]:
        """The file, the span of it asked for (`Range: bytes=...`; None: all of it) as (first, last) byte,
        and those bytes, read from the blob store a part at a time as they are sent."""
        row = await self._owned(principal, file_id)
        span = byte_range(range_header, row.size)
        if span is None:
            return to_out(row), None, self._blobs.read(row.sha256)
        first, last = span
        return to_out(row), span, self._blobs.read(row.sha256, first, last + 1)

    async def delete(self, principal: str, file_id: str) -> None:
        async with self._database.session() as db:
            row = await store.owned_file(db, principal, file_id)
            if row is None:
                raise NotFound(f"No file {file_id!r}.", details={"file_id": file_id})
            if await store.file_in_use(db, file_id):
                raise FileInUse(
                    f"File {file_id!r} is attached to a message; it goes when its session is deleted.",
                    details={"file_id": file_id},
                )
            freed = await store.delete_files(db, [row])
            await db.commit()
        await self._blobs.forget(freed)

    # --- attachments ---------------------------------------------------------------------------------

    async def attach(
        self, principal: str, model: str, refs: Sequence[AttachmentRef]
    ) -> tuple[list[Attachment], list[str]]:
        """A message's attachments, and the ids of files made for it from data URLs (so that a message
        refused after all can take them back: `discard`). Every check runs before anything is stored:
        count, ownership, each data URL's size and type, and what the session's model takes."""
        limit = self._settings.files_max_attachments
        if len(refs) > limit:
            raise PayloadTooLarge(
                f"A message may carry {limit} attachments; this one has {len(refs)}.",
                details={"field": "attachments", "limit": limit},
            )
        if not refs:
            return [], []
        named = [r.file_id for r in refs if not isinstance(r, DataUrlAttachment)]
        async with self._database.read() as db:
            owned = await store.owned_files(db, principal, named) if named else {}
        checked: dict[int, Checked] = {}
        kinds: list[str] = []
        try:
            for n, ref in enumerate(refs):
                if isinstance(ref, DataUrlAttachment):
                    checked[n] = self._data_url(ref.url, n)
                    kinds.append(checked[n].media_type)
                elif ref.file_id not in owned:
                    raise NotFound(f"No file {ref.file_id!r}.", details={"file_id": ref.file_id})
                else:
                    kinds.append(owned[ref.file_id].media_type)
            await self.check_model(model, kinds)
            attachments: list[Attachment] = []
            created: list[str] = []
            for n, ref in enumerate(refs):
                if isinstance(ref, DataUrlAttachment):
                    async with self._database.read() as db:
                        existed = await store.file_by_content(db, principal, checked[n].received.sha256)
                    row = await self._store(principal, checked[n])
                    if existed is None:
                        created.append(row.id)
                else:
                    row = owned[ref.file_id]
                attachments.append(to_attachment(row))
        finally:
            for item in checked.values():
                item.received.close()
        return attachments, created

    def _data_url(self, url: str, n: int) -> Checked:
        header, _, data = url.partition(",")
        declared = header[5:].split(";", 1)[0]
        limit = self._settings.files_max_bytes
        if len(data) * 3 // 4 > limit + 2:
            raise PayloadTooLarge(
                f"Attachment {n} exceeds {limit} bytes.",
                details={"field": f"attachments[{n}]", "limit": limit},
            )
        try:
            raw = base64.b64decode(data, validate=True)
        except binascii.Error as exc:
            raise InvalidRequest(f"attachments[{n}].url", "Not valid base64.", "base64") from exc
        received = _Received(limit)
        try:
            received.write(raw)
            received.finish()
            return self._check(received, clean_name(None, declared), declared)
        except BaseException:
            received.close()
            raise

    async def check_model(self, model: str, kinds: Sequence[str]) -> None:
        """422 `unsupported_attachment` when `model` cannot take files of these media types."""
        images = sorted({k for k in kinds if k.startswith("image/")})
        documents = sorted({k for k in kinds if k == "application/pdf"})
        if not images and not documents:
            return
        vision, takes_documents = await self._models.takes_files(model)
        if images and not vision:
            raise UnsupportedAttachment(
                f"The session's model {model!r} does not take images ({', '.join(images)}).",
                details={"model": model, "media_types": images},
            )
        if documents and not takes_documents and not self._settings.files_pdf_text:
            raise UnsupportedAttachment(
                f"The session's model {model!r} does not take PDF documents.",
                details={"model": model, "media_types": documents},
            )

    async def discard(self, principal: str, file_ids: Sequence[str]) -> None:
        """Files made for a message that was refused after all, unless a message uses them meanwhile."""
        if not file_ids:
            return
        async with self._database.session() as db:
            freed = await store.delete_unlinked(db, file_ids)
            await db.commit()
        await self._blobs.forget(freed)
