"""One error model for every 4xx and 5xx: {"error": {"code", "message", "details", "request_id"}}."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.middleware import BodyTooLarge, error_body

log = logging.getLogger(__name__)


class ApiError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, message: str, *, details: Any = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details
        if code is not None:
            self.code = code


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


def _respond(
    request: Request, status: int, code: str, message: str, details: Any = None, **kw: Any
) -> JSONResponse:
    # The request id ties what the client saw to the server's log line.
    log.info("%s %s -> %d %s", request.method, request.url.path, status, code)
    return JSONResponse(error_body(code, message, details), status_code=status, **kw)


_HTTP_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    415: "unsupported_media_type",
    413: "payload_too_large",
}


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _respond(request, exc.status, exc.code, exc.message, exc.details)

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
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        return _respond(
            request, exc.status_code, code, str(exc.detail), headers=getattr(exc, "headers", None)
        )

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return JSONResponse(error_body("internal_error", "Internal server error."), status_code=500)
