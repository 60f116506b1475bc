"""Pure ASGI middleware (no buffering, so SSE streams pass untouched): request ids and request bodies.

Every request gets an id (the client's `X-Request-ID` when it is sane, else a new one) that is echoed in
the response header, put in every error body and attached to log records. An exception that escapes the
app before its response started is answered here, inside the request's context, so that the 500 (or the
503 of a busy or full database) carries the id too: Starlette's own last handler runs outside every
middleware, after this one has let go of the id.

Headers larger than `max_header_bytes` in all (names and values) are refused with 431 before anything
reads them: the HTTP parser in front (httptools) takes headers of any size. Bodies are refused before they
are read when they are too large (413) or not JSON (415), except at /v1/files: its upload route reads
multipart and counts the bytes against its own limit as they stream in (app.chat.files), and a wrong
method there (or on a file's paths, which take no body) is the router's 405, never a refusal of its body.
A server without API keys that is reached on a non-loopback address, and was not told PARLEY_ALLOW_OPEN,
refuses everything but the health probes (403): the launcher refuses to start that way, and this covers a
server started some other way.
"""

from __future__ import annotations

import json
import re
import secrets

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.errors import BodyTooLarge, error_body, server_error
from app.chat.auth import OPEN_MODE_HELP, is_loopback
from app.observability.context import request_id_var

_SANE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_BODY_METHODS = {"POST", "PUT", "PATCH"}
_PROBES = {"/healthz", "/readyz"}
# Bodies the routes read and limit themselves (multipart uploads, app.api.files).
_OWN_BODIES = "/v1/files"


class RequestContextMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        max_header_bytes: int = 32_768,
        loopback_only: bool = False,
    ) -> None:
        """`loopback_only`: the service runs without keys and was not told it may serve beyond loopback."""
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes
        self.loopback_only = loopback_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        given = headers.get("x-request-id", "")
        request_id = given if _SANE_ID.match(given) else "req_" + secrets.token_hex(8)
        token = request_id_var.set(request_id)
        started = False
        try:

            async def send_with_id(message: Message) -> None:
                nonlocal started
                if message["type"] == "http.response.start":
                    started = True
                    message = {
                        **message,
                        "headers": [*message.get("headers", []), (b"x-request-id", request_id.encode())],
                    }
                await send(message)

            path = scope["path"]
            own_body = path == _OWN_BODIES or path.startswith(_OWN_BODIES + "/")
            refusal = (
                self._exposed(scope)
                or self._oversized_headers(scope)
                or (None if own_body else self._refusal(scope["method"], headers))
            )
            if refusal is not None:
                status, code, text = refusal
                await _send_json(send_with_id, status, error_body(code, text))
                return
            try:
                await self.app(scope, receive if own_body else self._limited(receive), send_with_id)
            except Exception as exc:
                if started:
                    raise  # a response cut short: no status left to answer with; the server closes it
                # Answered and logged, so not raised on: the server would log it again without the id.
                await server_error(Request(scope), exc)(scope, receive, send_with_id)
        finally:
            request_id_var.reset(token)

    def _exposed(self, scope: Scope) -> tuple[int, str, str] | None:
        server = scope.get("server")
        if not self.loopback_only or server is None or scope["path"] in _PROBES:
            return None  # no server address: a Unix socket, reachable only on this machine
        host = str(server[0])
        if is_loopback(host):
            return None
        return (
            403,
            "open_mode_refused",
            f"This server has no API keys and was reached on {host}, beyond loopback: the operator must "
            f"{OPEN_MODE_HELP}.",
        )

    def _oversized_headers(self, scope: Scope) -> tuple[int, str, str] | None:
        size = sum(len(name) + len(value) for name, value in scope["headers"])
        if size <= self.max_header_bytes:
            return None
        return (
            431,
            "request_header_fields_too_large",
            f"The request headers hold {size} bytes; the limit is {self.max_header_bytes}.",
        )

    def _refusal(self, method: str, headers: dict[str, str]) -> tuple[int, str, str] | None:
        if method not in _BODY_METHODS:
            return None
        length = headers.get("content-length")
        has_body = (length is not None and length.strip() not in ("", "0")) or "transfer-encoding" in headers
        if length is not None and length.strip().isdigit() and int(length) > self.max_body_bytes:
            return 413, "payload_too_large", f"The request body exceeds {self.max_body_bytes} bytes."
        content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if has_body and not (content_type == "application/json" or content_type.endswith("+json")):
            return (
                415,
                "unsupported_media_type",
                "Send the request body as JSON (Content-Type: application/json).",
            )
        return None

    def _limited(self, receive: Receive) -> Receive:
        """Counts body bytes of chunked uploads too, which carry no Content-Length to check up front, and
        refuses a body that is not UTF-8 (RFC 8259 §8.1) before the JSON parser guesses another encoding:
        Python's json reads UTF-16 and UTF-32 too, whose text always holds a NUL byte, which UTF-8 JSON
        never does (a NUL inside a string is escaped)."""
        seen = 0
        limit = self.max_body_bytes

        async def wrapped() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                body = message.get("body", b"")
                seen += len(body)
                if seen > limit:
                    raise BodyTooLarge(limit)
                nul = body.find(b"\x00")
                if nul >= 0 or (seen == len(body) and body.startswith((b"\xfe\xff", b"\xff\xfe"))):
                    at = max(nul, 0)
                    raise UnicodeDecodeError("utf-8", body, at, at + 1, "not UTF-8 JSON (UTF-16 or UTF-32)")
            return message

        return wrapped


async def _send_json(send: Send, status: int, body: dict[str, object]) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
