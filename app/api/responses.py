"""OpenAPI error responses shared by the routes."""

from __future__ import annotations

from typing import Any

from app.schemas import ErrorResponse

_DESCRIPTIONS = {
    400: "Bad request",
    404: "Not found",
    409: "Conflict",
    413: "Payload too large",
    415: "Unsupported media type",
    422: "Validation error",
    503: "Not ready",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorResponse, "description": _DESCRIPTIONS.get(code, "Error")} for code in codes}
