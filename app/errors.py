"""One error model for every 4xx and 5xx: {"error": {"code", "message", "details", "request_id"}}."""

from __future__ import annotations

import logging
import re
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
    status = 503
    code = "unavailable"


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


def _respond(
    request: Request, status: int, code: str, message: str, details: Any = None, **kw: Any
) -> JSONResponse:
    # The request id ties what the client saw to the server's log line.
    log.info("%s %s -> %d %s", request.method, request.url.path, status, code)
    return JSONResponse(error_body(code, message, details), status_code=status, **kw)


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
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            # Starlette names only the methods of the first route of the path; there is one per method.
            headers = {**(headers or {}), "Allow": _allowed_methods(request)}
        return _respond(request, exc.status_code, code, str(exc.detail), headers=headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return JSONResponse(error_body("internal_error", "Internal server error."), status_code=500)
