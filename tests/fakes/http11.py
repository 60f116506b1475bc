"""HTTP/1.1 framing for the fake upstream, without I/O: requests parsed off a connection's buffer, and the
bytes of responses (heads, whole bodies, chunks of a chunked body).

Requests may come with a Content-Length or a chunked body, several on one keep-alive connection.
"""

from __future__ import annotations

import http
from dataclasses import dataclass

_MAX_HEAD = 64 * 1024
LAST_CHUNK = b"0\r\n\r\n"  # ends a chunked body; a cut stream is one without it


class BadRequest(Exception):
    """The bytes received are not a request we can parse."""


@dataclass
class Request:
    method: str
    path: str
    version: str
    headers: dict[str, str]
    body: bytes

    @property
    def wants_close(self) -> bool:
        return self.headers.get("connection", "").lower() == "close" or self.version == "HTTP/1.0"


def _chunked_body(buf: bytearray, start: int) -> tuple[bytes, int] | None:
    """The chunked body that starts at `buf[start]` and where it ends; None while incomplete."""
    parts: list[bytes] = []
    pos = start
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        try:
            size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
        except ValueError:
            raise BadRequest("bad chunk size") from None
        if size == 0:
            end = buf.find(b"\r\n\r\n", eol)  # no trailers are expected: up to the blank line
            return None if end < 0 else (b"".join(parts), end + 4)
        if len(buf) < eol + 2 + size + 2:
            return None
        parts.append(bytes(buf[eol + 2 : eol + 2 + size]))
        pos = eol + 2 + size + 2


def parse_request(buf: bytearray) -> Request | None:
    """Take the first complete request off `buf`; None (and `buf` as it was) until all of it is there."""
    while buf[:2] == b"\r\n":  # RFC 9112: ignore empty lines before a request line
        del buf[:2]
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > _MAX_HEAD:
            raise BadRequest("request head too large")
        return None
    lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ", 2)
    except ValueError:
        raise BadRequest(f"bad request line {lines[0]!r}") from None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        found = _chunked_body(buf, end + 4)
        if found is None:
            return None
        body, stop = found
    else:
        try:
            length = int(headers.get("content-length") or 0)
        except ValueError:
            raise BadRequest("bad content-length") from None
        stop = end + 4 + length
        if len(buf) < stop:
            return None
        body = bytes(buf[end + 4 : stop])
    del buf[:stop]
    return Request(method, target.split("?", 1)[0], version, headers, body)


def head(status: int, headers: dict[str, str]) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    lines = [f"HTTP/1.1 {status} {phrase}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def whole(
    status: int,
    body: bytes,
    headers: dict[str, str] | None = None,
    content_type: str = "application/json",
) -> bytes:
    """A complete response with a Content-Length."""
    return (
        head(status, {"content-type": content_type, "content-length": str(len(body)), **(headers or {})})
        + body
    )


STREAM_HEAD = head(
    200,
    {
        "content-type": "text/event-stream; charset=utf-8",
        "cache-control": "no-cache",
        "transfer-encoding": "chunked",
    },
)


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)
