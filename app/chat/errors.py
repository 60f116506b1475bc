"""The use-case layer's own refusals (each a typed error with its code; app.errors renders them)."""

from __future__ import annotations

from app.errors import ApiError

# A request that names something that does not exist (a model, a tool, a position) is not valid: 422,
# as every request the spec's schemas let through but the server cannot take.


class UnknownModel(ApiError):
    status = 422
    code = "unknown_model"


class UnknownTool(ApiError):
    status = 422
    code = "unknown_tool"


class InvalidCursor(ApiError):
    status = 422
    code = "invalid_cursor"


class SessionDeleted(ApiError):
    """An Idempotency-Key replay whose session has since been deleted: its answer would name a session
    that no longer exists, and creating another would not be what the first request did."""

    status = 410
    code = "session_deleted"
