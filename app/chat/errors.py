"""The use-case layer's own refusals: domain errors, each with its code (app.api.errors gives its status)."""

from __future__ import annotations

from app.errors import Conflict, DomainError

# A request that names something that does not exist (a model, a tool, a position) is not valid, as
# every request the spec's schemas let through but the server cannot take.


class UnknownModel(DomainError):
    code = "unknown_model"


class UnknownTool(DomainError):
    code = "unknown_tool"


class InvalidCursor(DomainError):
    code = "invalid_cursor"


class SessionDeleted(DomainError):
    """An Idempotency-Key replay whose session has since been deleted: its answer would name a session
    that no longer exists, and creating another would not be what the first request did."""

    code = "session_deleted"


class TurnInProgress(Conflict):
    """A message that asked to start a turn at once while one runs."""

    code = "turn_running"


class AlreadyTaken(Conflict):
    """A waiting message withdrawn after a turn took it."""

    code = "already_taken"


class Withdrawn(Conflict):
    """A message waited for (`?wait=true`) that was withdrawn before a turn took it."""

    code = "withdrawn"


class UnsupportedMediaType(DomainError):
    """A file whose bytes are not of an allowed type (docs/files.md), or an upload that is not multipart."""

    code = "unsupported_media_type"


class FileInUse(DomainError):
    code = "file_in_use"


class RangeNotSatisfiable(DomainError):
    """A `Range` that starts past a file's end: `details.size` is the file's (sent as `Content-Range`)."""

    code = "range_not_satisfiable"


class UnsupportedAttachment(DomainError):
    """An attachment the session's model cannot take (an image for a model without vision, a PDF for one
    without documents)."""

    code = "unsupported_attachment"
