"""Minimal HTTP/1.1 server-side connection for the fake upstream, built on asyncio streams.

Owns request parsing (Content-Length and chunked bodies, keep-alive friendly) and response writing, plus
the part a framework would hide: a pump task that reads the socket continuously, so the moment the
peer closes (FIN or RST) is timestamped even while the handler sleeps between chunks. Clients used here
never half-close after sending a request, so EOF on the socket means the client is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import time
from dataclasses import dataclass

_MAX_HEAD = 64 * 1024


class BadRequest(Exception):
    """The bytes received are not a request we can parse."""


@dataclass
class Request:
    method: str
    path: str
    version: str
    headers: dict[str, str]
    body: bytes


class Connection:
    """One client connection: a pump task moves bytes into `buf` and notices the peer leaving."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.buf = bytearray()
        self.eof = False
        self.gone = asyncio.Event()
        self.gone_at: float | None = None
        self._changed = asyncio.Event()
        self._pump_task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        # Always reading is what makes a disconnect visible while the handler sleeps between chunks.
        with contextlib.suppress(ConnectionError, OSError):
            while data := await self.reader.read(65536):
                self.buf += data
                self._changed.set()
        self.eof = True
        self.mark_gone()
        self._changed.set()

    def mark_gone(self) -> None:
        if self.gone_at is None:
            self.gone_at = time.monotonic()
            self.gone.set()

    async def _more(self) -> bool:
        if self.eof:
            return False
        self._changed.clear()
        await self._changed.wait()
        return True

    async def _read_until(self, sep: bytes) -> bytes:
        while (pos := self.buf.find(sep)) < 0:
            if len(self.buf) > _MAX_HEAD or not await self._more():
                raise BadRequest("incomplete request")
        data = bytes(self.buf[:pos])
        del self.buf[: pos + len(sep)]
        return data

    async def _read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not await self._more():
                raise BadRequest("incomplete body")
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    async def read_request(self) -> Request | None:
        while self.buf[:2] == b"\r\n":  # RFC 9112: ignore empty lines before a request line
            del self.buf[:2]
        while not self.buf:
            if not await self._more():
                return None
        lines = (await self._read_until(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        try:
            method, target, version = lines[0].split(" ", 2)
        except ValueError:
            raise BadRequest(f"bad request line {lines[0]!r}") from None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("expect", "").lower() == "100-continue":
            await self.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            parts = []
            while size := int((await self._read_until(b"\r\n")).split(b";")[0], 16):
                parts.append(await self._read_exact(size))
                await self._read_exact(2)
            while await self._read_until(b"\r\n"):  # trailers up to the blank line
                pass
            body = b"".join(parts)
        else:
            body = await self._read_exact(int(headers.get("content-length", "0")))
        return Request(method, target.split("?", 1)[0], version, headers, body)

    async def send(self, data: bytes) -> bool:
        """Write and drain; False (and the peer marked gone) if the client has left."""
        if self.gone.is_set():
            return False
        try:
            self.writer.write(data)
            await self.writer.drain()
        except (ConnectionError, OSError, RuntimeError):
            self.mark_gone()
            return False
        return True

    async def sleep(self, seconds: float) -> bool:
        """Sleep, waking early if the client leaves. True if it left."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.gone.wait(), seconds)
        return self.gone.is_set()

    async def send_head(self, status: int, headers: dict[str, str]) -> bool:
        try:
            phrase = http.HTTPStatus(status).phrase
        except ValueError:
            phrase = "Unknown"
        lines = [f"HTTP/1.1 {status} {phrase}"] + [f"{k}: {v}" for k, v in headers.items()]
        return await self.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    async def send_full(
        self,
        status: int,
        body: bytes,
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> bool:
        hdrs = {"content-type": content_type, "content-length": str(len(body)), **(headers or {})}
        return await self.send_head(status, hdrs) and await self.send(body)

    async def close(self) -> None:
        self._pump_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._pump_task
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()
