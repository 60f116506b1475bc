"""File routes (docs/files.md): upload, list, read, serve the bytes, delete."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Header, Path, Query, Request, Response, status
from fastapi.responses import StreamingResponse

from app.api.deps import FilesDep, PrincipalDep
from app.api.responses import v1_errors
from app.protocol.files import FileOut, FilePage
from app.protocol.ids import FILE_ID_PATTERN
from app.settings import FILE_TYPES

router = APIRouter(prefix="/v1/files", tags=["files"])

FileId = Annotated[str, Path(pattern=FILE_ID_PATTERN)]

_UPLOAD_BODY = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "properties": {
                    "file": {
                        "type": "string",
                        "format": "binary",
                        "description": "The file, with its name. Its type is read from its bytes: PNG, JPEG, "
                        "GIF, WebP, PDF, or UTF-8 text named .txt, .md, .csv or .json (or declared so); "
                        "others get 415, larger than PARLEY_FILES_MAX_BYTES 413.",
                    },
                    "purpose": {
                        "type": "string",
                        "maxLength": 64,
                        "description": "A label some clients send (e.g. `attachment`): accepted, not stored.",
                    },
                },
                "required": ["file"],
                "additionalProperties": False,
            },
            "encoding": {"file": {"contentType": ", ".join(FILE_TYPES)}},
        }
    },
}


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses=v1_errors(413, 415, 422),
    openapi_extra={"requestBody": _UPLOAD_BODY},
)
async def upload_file(request: Request, files: FilesDep, principal: PrincipalDep) -> FileOut:
    """Upload a file (multipart/form-data, field `file`); the same bytes uploaded again are the same file."""
    headers = request.headers
    return await files.upload(
        principal, headers.get("content-type"), headers.get("content-length"), request.stream()
    )


@router.get("", responses=v1_errors(422))
async def list_files(
    files: FilesDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[
        str | None,
        Query(pattern=FILE_ID_PATTERN, description="A `next_cursor`: the files after it; another: 422."),
    ] = None,
) -> FilePage:
    """The caller's files, newest first, a page at a time."""
    return await files.page(principal, limit=limit, after=after)


@router.get("/{file_id}", responses=v1_errors(404, 422))
async def get_file(file_id: FileId, files: FilesDep, principal: PrincipalDep) -> FileOut:
    """A file's metadata."""
    return await files.get(principal, file_id)


_CONTENT_HEADERS = {
    "Content-Disposition": {
        "description": "`inline` (images) or `attachment`, with `filename*` (RFC 5987).",
        "schema": {"type": "string"},
    },
    "X-Content-Type-Options": {"schema": {"type": "string", "enum": ["nosniff"]}},
    "Accept-Ranges": {"schema": {"type": "string", "enum": ["bytes"]}},
}
_BYTES = {media_type: {"schema": {"type": "string", "format": "binary"}} for media_type in FILE_TYPES}
_CONTENT_RESPONSE = {
    200: {
        "description": "The bytes, streamed, with the file's media type; never rendered as another type "
        "(`X-Content-Type-Options: nosniff`), and a download unless an image.",
        "content": _BYTES,
        "headers": _CONTENT_HEADERS,
    },
    206: {
        "description": "The range `Range: bytes=first-last` (or `first-`, or `-suffix`) asked for: those "
        "bytes only. Several ranges, or another unit, are answered with the whole file (200).",
        "content": _BYTES,
        "headers": {
            **_CONTENT_HEADERS,
            "Content-Range": {"description": "`bytes first-last/size`.", "schema": {"type": "string"}},
        },
    },
    **v1_errors(404, 416, 422),
}


@router.get("/{file_id}/content", response_class=Response, responses=_CONTENT_RESPONSE)
async def get_file_content(
    file_id: FileId,
    files: FilesDep,
    principal: PrincipalDep,
    range_header: Annotated[
        str | None,
        Header(
            alias="range",
            max_length=200,
            description="`bytes=first-last`, `bytes=first-` or `bytes=-suffix`: part of the file (206).",
        ),
    ] = None,
) -> StreamingResponse:
    """A file's bytes, or the range asked for, read from storage a part at a time as they are sent."""
    found, span, parts = await files.content(principal, file_id, range_header)
    disposition = "inline" if found.media_type.startswith("image/") else "attachment"
    ascii_name = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "_" for c in found.name)
    media_type = found.media_type
    if media_type.startswith("text/") or media_type == "application/json":
        media_type += "; charset=utf-8"
    headers = {
        "Content-Length": str(found.size),
        "Content-Disposition": f'{disposition}; filename="{ascii_name}"; '
        f"filename*=UTF-8''{quote(found.name)}",
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "default-src 'none'; sandbox",
        "Cache-Control": "private, max-age=31536000, immutable",
        "Accept-Ranges": "bytes",
    }
    if span is None:
        return StreamingResponse(parts, media_type=media_type, headers=headers)
    first, last = span
    headers["Content-Length"] = str(last - first + 1)
    headers["Content-Range"] = f"bytes {first}-{last}/{found.size}"
    return StreamingResponse(parts, status_code=206, media_type=media_type, headers=headers)


@router.delete("/{file_id}", status_code=status.HTTP_204_NO_CONTENT, responses=v1_errors(404, 409, 422))
async def delete_file(file_id: FileId, files: FilesDep, principal: PrincipalDep) -> Response:
    """Delete a file; 409 `file_in_use` while a message uses it (it goes when its sessions are deleted)."""
    await files.delete(principal, file_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
