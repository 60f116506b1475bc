"""The API edge of the error model: every 4xx and 5xx as
{"error": {"code", "message", "details", "request_id"}}.

Domain errors (app.errors) carry a code; `STATUS` below is the one table from a code to its HTTP status,
and `http_headers` the one place their headers come from (Retry-After from `retry_after`, WWW-Authenticate for
`unauthorized`). The errors of the HTTP layer itself (validation, unknown route, wrong method, a body too
large) and anything unexpected are rendered here too. See docs/api.md, "Errors".
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.errors import DomainError
from app.errors.storage import sqlite_error, storage_refusal
from app.observability.context import request_id_var

# The logger keeps its historical name: log lines and their `logger` field stay what operators know.
log = logging.getLogger("app.errors")

# Every domain error code, with its HTTP status (tests/api/test_error_model.py checks that it names each
# code once, and no other).
STATUS: dict[str, int] = {
    # The request is not valid (the schema let it through).
    "validation_error": 422,
    "unknown_model": 422,
    "unknown_tool": 422,
    "invalid_cursor": 422,
    "invalid_position": 422,
    "invalid_idempotency_key": 422,
    "idempotency_key_reused": 422,
    "invalid_answer": 422,
    "unsupported_attachment": 422,
    # A client tool named as one of the session's server tools.
    "tool_name_clash": 400,
    "unauthorized": 401,
    "invalid_token": 401,
    "not_found": 404,
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    "range_not_satisfiable": 416,
    # The request conflicts with the state of what it names.
    "conflict": 409,
    "turn_running": 409,
    "already_taken": 409,
    "withdrawn": 409,
    "no_pending_call": 409,
    "answer_conflict": 409,
    "file_in_use": 409,
    # A frontend kit's request with nothing new in it (app.chat.kit_chats).
    "no_new_input": 409,
    # Gone: it was there, and is no more.
    "expired": 410,
    "session_deleted": 410,
    "rate_limited": 429,
    "too_many_streams": 429,
    # nginx's code for a client that closed the connection first: logged, never seen by anyone.
    "client_closed_request": 499,
    # The server cannot do it now.
    "unavailable": 503,
    "shutting_down": 503,
    "turn_owner_unreachable": 503,
    "storage_busy": 503,
    "storage_full": 503,
    "storage_error": 503,
    "storage_unavailable": 503,
    "wait_timeout": 504,
}

_CODE_HEADERS: dict[str, dict[str, str]] = {
    "unauthorized": {"WWW-Authenticate": "Bearer"},
    # RFC 6750 §3.1: the token was presented and refused.
    "invalid_token": {"WWW-Authenticate": 'Bearer error="invalid_token"'},
}


def http_status(error: DomainError) -> int:
    return STATUS[error.code]


def http_headers(error: DomainError) -> dict[str, str] | None:
    """The headers that go with the error's status: Retry-After when it names a wait."""
    found = dict(_CODE_HEADERS.get(error.code, {}))
    if error.code == "range_not_satisfiable" and isinstance(error.details, dict):
        found["Content-Range"] = f"bytes */{error.details.get('size')}"  # RFC 9110 §15.5.17
    if error.retry_after is not None:
        found["Retry-After"] = str(error.retry_after)
    return found or None


def error_body(code: str, message: str, details: object = None) -> dict[str, object]:
    return {
        "error": {"code": code, "message": message, "details": details, "request_id": request_id_var.get()}
    }


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit


def _log(
    request: Request,
    status: int,
    code: str,
    *,
    level: int = logging.INFO,
    cause: str = "",
    exc: BaseException | None = None,
) -> None:
    # The request id ties what the client saw to the server's log line: in the line's text, so that any
    # log format shows it (the record's `request_id` field has it too).
    log.log(
        level,
        "%s %s -> %d %s, request %s%s",
        request.method,
        request.url.path,
        status,
        code,
        request_id_var.get(),
        f": {cause}" if cause else "",
        exc_info=exc,
    )


def _respond(
    request: Request, status: int, code: str, message: str, details: Any = None, **kw: Any
) -> JSONResponse:
    _log(request, status, code)
    return JSONResponse(error_body(code, message, details), status_code=status, **kw)


def server_error(request: Request, exc: Exception) -> JSONResponse:
    """The answer to an exception no handler took: 503 when SQLite refused the work or PostgreSQL is out of
    reach, else 500.

    RequestContextMiddleware calls it inside the request's context, so that the body, the X-Request-ID
    header and the log line carry the request id. The app's `Exception` handler, which Starlette runs
    outside every middleware, answers only what escapes that middleware itself. The detail goes to the
    log, never to the client.
    """
    refusal = storage_refusal(exc)
    if refusal is None:
        _log(request, 500, "internal_error", level=logging.ERROR, exc=exc)
        return JSONResponse(error_body("internal_error", "Internal server error."), status_code=500)
    # An error only when someone must act (a full or failing disk); busy or out of reach is transient.
    level = logging.ERROR if refusal.code in ("storage_full", "storage_error") else logging.WARNING
    cause = sqlite_error(exc) or exc
    _log(request, http_status(refusal), refusal.code, level=level, cause=f"{type(cause).__name__}: {cause}")
    body = error_body(refusal.code, refusal.message, refusal.details)
    return JSONResponse(body, status_code=http_status(refusal), headers=http_headers(refusal))


_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
_HTTP_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    415: "unsupported_media_type",
    413: "payload_too_large",
}


def _allowed_methods(request: Request) -> str:
    """The methods the spec documents for the request's path (HEAD wherever GET is, as Starlette serves)."""
    methods: set[str] = set()
    for template, item in request.app.openapi().get("paths", {}).items():
        if re.fullmatch(re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(template)), request.url.path):
            methods |= {method.upper() for method in item if method in _METHODS}
    if "GET" in methods:
        methods.add("HEAD")
    return ", ".join(sorted(methods))


def install(app: FastAPI) -> None:
    @app.exception_handler(DomainError)
    async def domain_error(request: Request, exc: DomainError) -> JSONResponse:
        status = http_status(exc)
        return _respond(request, status, exc.code, exc.message, exc.details, headers=http_headers(exc))

    @app.exception_handler(BodyTooLarge)
    async def body_too_large(request: Request, exc: BodyTooLarge) -> JSONResponse:
        return _respond(request, 413, "payload_too_large", f"The request body exceeds {exc.limit} bytes.")

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        details = [
            {
                "field": ".".join(str(p) for p in err.get("loc", ())),
                "message": err.get("msg", ""),
                "type": err.get("type"),
            }
            for err in exc.errors()
        ]
        return _respond(request, 422, "validation_error", "The request is not valid.", details)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI turns any failure while it reads a JSON body, other than a JSON syntax error, into a
        # plain 400: a chunked body past the limit, or bytes that are not UTF-8.
        cause = exc.__cause__
        if isinstance(cause, BodyTooLarge):
            return await body_too_large(request, cause)
        if isinstance(cause, UnicodeDecodeError):
            details = [{"field": "body", "message": "The body is not UTF-8 text.", "type": "json_invalid"}]
            return _respond(request, 422, "validation_error", "The request is not valid.", details)
        if isinstance(cause, RecursionError):
            details = [{"field": "body", "message": "The JSON is nested too deeply.", "type": "json_invalid"}]
            return _respond(request, 422, "validation_error", "The request is not valid.", details)
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            # Starlette names only the methods of the first route of the path; there is one per method.
            headers = {**(headers or {}), "Allow": _allowed_methods(request)}
        return _respond(request, exc.status_code, code, str(exc.detail), headers=headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        return server_error(request, exc)
