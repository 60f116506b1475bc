"""The use-case layer's own refusals (each a typed error with its code; app.errors renders them)."""

from __future__ import annotations

from app.errors import ApiError


class UnknownModel(ApiError):
    code = "unknown_model"


class UnknownTool(ApiError):
    code = "unknown_tool"


class InvalidCursor(ApiError):
    code = "invalid_cursor"
