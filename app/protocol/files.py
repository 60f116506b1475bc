"""Files and attachments on the wire (docs/files.md): an uploaded file's metadata, a page of them, what a
message names as an attachment, and what its events and history show of one (never the bytes)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from app.protocol.ids import FILE_ID_PATTERN

# At most this many attachments in the spec; PARLEY_FILES_MAX_ATTACHMENTS may allow fewer (413 beyond).
MAX_ATTACHMENTS_SCHEMA = 20
DATA_URL_PATTERN = r"^data:[A-Za-z0-9.+-]+/[A-Za-z0-9.+-]+;base64,[A-Za-z0-9+/]*={0,2}$"


class FileOut(BaseModel):
    id: str = Field(description="`f_` and 16 hex digits.")
    name: str = Field(description="The uploaded file's name, without any directory.")
    media_type: str = Field(description="Found from the bytes (magic numbers), not only as declared.")
    size: int = Field(description="Bytes.")
    sha256: str = Field(description="Hex SHA-256 of the bytes: the same bytes uploaded again give this file.")
    created_at: str
    width: int | None = Field(None, description="Pixels, for images.")
    height: int | None = Field(None, description="Pixels, for images.")


class FilePage(BaseModel):
    files: list[FileOut] = Field(description="Newest first.")
    next_cursor: str | None = Field(description="Pass as `after` for the next page; null at the end.")


class Attachment(BaseModel):
    """A message's attached file as events, the history and the turn view show it: never its bytes."""

    model_config = ConfigDict(frozen=True)

    file_id: str
    name: str
    media_type: str
    size: int = Field(description="Bytes.")
    width: int | None = Field(description="Pixels, for images; null for other files.")
    height: int | None = Field(description="Pixels, for images; null for other files.")


class FileAttachment(BaseModel):
    model_config = ConfigDict(extra="forbid")

    file_id: str = Field(pattern=FILE_ID_PATTERN, description="A file the caller uploaded (POST /v1/files).")


class DataUrlAttachment(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        pattern=DATA_URL_PATTERN,
        description="`data:<media type>;base64,<bytes>`: stored as a file first, checked as an upload is.",
    )


AttachmentRef = FileAttachment | DataUrlAttachment
