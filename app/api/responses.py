"""OpenAPI error responses shared by the routes."""

from __future__ import annotations

from typing import Any

from app.protocol.schemas import ErrorResponse

_DESCRIPTIONS = {
    400: "Bad request",
    401: "Missing or unknown API key (when the server has keys)",
    404: "Not found",
    409: "Conflict",
    410: "Gone: the wait expired",
    413: "Payload too large",
    415: "Unsupported media type",
    422: "Validation error",
    429: "Too many requests: wait for Retry-After seconds",
    503: "Unavailable: not ready, or storage refuses writes for now (`storage_busy`, `storage_full`, "
    "`storage_error`); retry after Retry-After seconds",
}

_HEADERS: dict[int, dict[str, Any]] = {
    401: {
        "WWW-Authenticate": {
            "description": "`Bearer`: send the key as `Authorization: Bearer <key>`.",
            "schema": {"type": "string"},
        }
    },
    429: {
        "Retry-After": {
            "description": "Seconds to wait before trying again.",
            "schema": {"type": "integer", "minimum": 1},
        }
    },
    503: {
        "Retry-After": {
            "description": "Seconds to wait before trying again (storage refusals).",
            "schema": {"type": "integer", "minimum": 1},
        }
    },
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    responses: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        response: dict[str, Any] = {"model": ErrorResponse, "description": _DESCRIPTIONS.get(code, "Error")}
        if code in _HEADERS:
            response["headers"] = _HEADERS[code]
        responses[code] = response
    return responses


def v1_errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """errors(...) of a /v1 route, which also answers 401 when the server has keys."""
    return errors(401, *codes)
