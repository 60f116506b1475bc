"""OpenAPI error responses shared by the routes."""

from __future__ import annotations

from typing import Any

from app.protocol.schemas import ErrorResponse

_DESCRIPTIONS = {
    400: "Bad request",
    401: "Missing or unknown API key (when the server has keys)",
    403: "A server without API keys reached beyond loopback (`open_mode_refused`)",
    404: "Not found",
    409: "Conflict",
    410: "Gone: the call's wait expired, or the session an Idempotency-Key created was deleted",
    413: "Payload too large",
    415: "Unsupported media type",
    416: "Range not satisfiable: it starts past the file's end (`Content-Range: bytes */<size>`)",
    422: "Validation error",
    429: "Too many requests: wait for Retry-After seconds",
    431: "Request headers larger than PARLEY_MAX_HEADER_BYTES (`request_header_fields_too_large`)",
    503: "Unavailable: not ready or shutting down, or storage refuses work for now (`storage_busy`, "
    "`storage_full`, `storage_error`, `storage_unavailable`); retry after Retry-After seconds when sent",
}

_HEADERS: dict[int, dict[str, Any]] = {
    401: {
        "WWW-Authenticate": {
            "description": "`Bearer`: send the key as `Authorization: Bearer <key>`.",
            "schema": {"type": "string"},
        }
    },
    416: {
        "Content-Range": {
            "description": "`bytes */<size>`: the file's size.",
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
            "description": "Seconds to wait before trying again, when the server knows.",
            "schema": {"type": "integer", "minimum": 1},
        }
    },
}
# What any /v1 route may answer besides its own errors: a key missing or refused, headers too large,
# storage that cannot take the request.
_EVERY_V1 = (401, 403, 431, 503)


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    responses: dict[int | str, dict[str, Any]] = {}
    for code in sorted(set(codes)):
        response: dict[str, Any] = {"model": ErrorResponse, "description": _DESCRIPTIONS.get(code, "Error")}
        if code in _HEADERS:
            response["headers"] = _HEADERS[code]
        responses[code] = response
    return responses


def v1_errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """errors(...) of a /v1 route, which may also answer any of _EVERY_V1."""
    return errors(*_EVERY_V1, *codes)
