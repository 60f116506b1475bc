"""One error model for every 4xx and 5xx: {"error": {"code", "message", "details", "request_id"}}."""

from __future__ import annotations

import logging
import re
import sqlite3
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.observability.context import request_id_var

log = logging.getLogger(__name__)


def error_body(code: str, message: str, details: object = None) -> dict[str, object]:
    return {
        "error": {"code": code, "message": message, "details": details, "request_id": request_id_var.get()}
    }


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit


class ApiError(Exception):
    status = 400
    code = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        details: Any = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details = details
        self.headers = headers
        if code is not None:
            self.code = code


class InvalidRequest(ApiError):
    """A request the schema lets through but that is not valid: rendered as the validation errors are."""

    status = 422
    code = "validation_error"

    def __init__(self, field: str, message: str, type_: str) -> None:
        details = [{"field": field, "message": message, "type": type_}]
        super().__init__("The request is not valid.", details=details)


class NotFound(ApiError):
    status = 404
    code = "not_found"


class Conflict(ApiError):
    status = 409
    code = "conflict"


class Unavailable(ApiError):
    """`retry_after`, when given: whole seconds, also sent as the Retry-After header."""

    status = 503
    code = "unavailable"

    def __init__(
        self, message: str, *, details: Any = None, code: str | None = None, retry_after: int | None = None
    ) -> None:
        headers = None
        if retry_after is not None:
            details = {**(details or {}), "retry_after": retry_after}
            headers = {"Retry-After": str(retry_after)}
        super().__init__(message, details=details, code=code, headers=headers)


class PayloadTooLarge(ApiError):
    status = 413
    code = "payload_too_large"


class WaitTimeout(ApiError):
    """A `?wait=true` request's limit passed first: the turn goes on; its id lets the client wait again."""

    status = 504
    code = "wait_timeout"


class ClientClosedRequest(ApiError):
    """The client closed the connection while it waited (nginx's 499): logged, never seen by anyone."""

    status = 499
    code = "client_closed_request"


class Unauthorized(ApiError):
    status = 401
    code = "unauthorized"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class TooManyRequests(ApiError):
    """`retry_after`: whole seconds, also sent as the Retry-After header."""

    status = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: int, code: str | None = None) -> None:
        details = {"retry_after": retry_after}
        super().__init__(message, code=code, details=details, headers={"Retry-After": str(retry_after)})


class StorageUnavailable(Unavailable):
    """The database refused work: its write lock held past the busy timeout (`storage_busy`), its disk
    full (`storage_full`), an I/O error (`storage_error`), or PostgreSQL out of reach
    (`storage_unavailable`). A request gets it as a 503 with Retry-After; a
    turn that meets it ends with an `error` of the same code once storage works again."""


# SQLite's primary result codes (the low byte of an extended one, as sqlite3 reports it).
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_IOERR, _SQLITE_FULL = 5, 6, 10, 13
# Seconds a client is told to wait: a write lock is usually held for milliseconds, while a full disk waits
# for someone to free space.
STORAGE_BUSY_RETRY_AFTER = 1
STORAGE_FULL_RETRY_AFTER = 30


def _storage_refusal(error: sqlite3.Error) -> StorageUnavailable | None:
    """The 503 for SQLite refusing work. None for any other SQLite error (a constraint, a bug)."""
    primary = getattr(error, "sqlite_errorcode", -1) & 0xFF
    text = str(error).lower()
    if primary in (_SQLITE_BUSY, _SQLITE_LOCKED) or "is locked" in text:
        message = "The database is busy; retry in a moment."
        return StorageUnavailable(message, code="storage_busy", retry_after=STORAGE_BUSY_RETRY_AFTER)
    if primary == _SQLITE_FULL or "database or disk is full" in text:
        message = "The server's storage is full; retry later."
        return StorageUnavailable(message, code="storage_full", retry_after=STORAGE_FULL_RETRY_AFTER)
    if primary == _SQLITE_IOERR or "disk i/o error" in text:
        message = "The server's storage failed; retry later."
        return StorageUnavailable(message, code="storage_error", retry_after=STORAGE_FULL_RETRY_AFTER)
    return None


def storage_refusal(exc: BaseException) -> StorageUnavailable | None:
    """What `exc` means when storage refused the work (busy, full, failing), or None when it is anything
    else. Looks through SQLAlchemy's wrapping and exception groups to the driver's error."""
    if isinstance(exc, StorageUnavailable):
        return exc
    error = _sqlite_error(exc)
    if error is not None:
        return _storage_refusal(error)
    return _database_unavailable(exc)


def _sqlite_error(exc: BaseException) -> sqlite3.Error | None:
    """The driver's error behind `exc`, if any: SQLAlchemy raises its own errors `from` the driver's."""
    found = _in_chain(exc, sqlite3.Error)
    return found if isinstance(found, sqlite3.Error) else None


def _in_chain(
    exc: BaseException, kinds: type[BaseException] | tuple[type[BaseException], ...]
) -> BaseException | None:
    """The first exception of `kinds` in `exc`, its causes and (groups) its members."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, kinds):
            return current
        todo.append(current.__cause__)
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
    return None


# Seconds a client is told to wait when PostgreSQL cannot be reached: the pool reconnects by itself.
STORAGE_UNAVAILABLE_RETRY_AFTER = 2


def _database_unavailable(exc: BaseException) -> StorageUnavailable | None:
    """The 503 for PostgreSQL out of reach: the connection refused or cut (a restart, a failover, the
    network), no pooled connection free within the pool timeout, or a statement past the statement timeout.
    None for any other error."""
    # Imported here: the error model must not load a driver the SQLite deployment never uses.
    import psycopg
    from sqlalchemy import exc as sa_exc

    kinds = (psycopg.OperationalError, psycopg.InterfaceError, sa_exc.TimeoutError, sa_exc.OperationalError)
    if _in_chain(exc, kinds) is None:
        return None
    message = "The database is unavailable; retry in a moment."
    return StorageUnavailable(
        message, code="storage_unavailable", retry_after=STORAGE_UNAVAILABLE_RETRY_AFTER
    )


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
    cause = _sqlite_error(exc) or exc
    _log(request, refusal.status, refusal.code, level=level, cause=f"{type(cause).__name__}: {cause}")
    body = error_body(refusal.code, refusal.message, refusal.details)
    return JSONResponse(body, status_code=refusal.status, headers=refusal.headers)


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
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _respond(request, exc.status, exc.code, exc.message, exc.details, headers=exc.headers)

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
