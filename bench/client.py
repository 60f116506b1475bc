"""The load client: raw asyncio HTTP/1.1, so that it costs little next to the server it measures.

`HttpConn` is one keep-alive connection for JSON requests; `EventStream` reads one session's SSE stream
(chunked transfer encoding, frames split on the blank line) and timestamps events as they arrive, keeping
only what the benchmark needs: the first arrival of each type, counts, the last id, and the data of a few
types. Arrival = `time.monotonic()` when the body chunk holding the frame was read (the server sends one
chunk per committed batch), comparable with the upstream's and the baselines' clocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from typing import Any

HOST = "127.0.0.1"
_KEEP_DATA = frozenset({b"turn_done", b"agent_cancelled", b"resync", b"error"})


class HttpError(RuntimeError):
    def __init__(self, status: int, body: bytes, what: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {body[:300]!r}")
        self.status = status
        self.body = body


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head[:-4].split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


def _chunked(headers: dict[bytes, bytes]) -> bool:
    return headers.get(b"transfer-encoding", b"").lower() == b"chunked"


def _chunk_size(line: bytes) -> int:
    """The size of a chunk of a chunked body, from its size line (0: the last chunk)."""
    return int(line.split(b";")[0].strip() or b"0", 16)


async def _read_body(reader: asyncio.StreamReader, headers: dict[bytes, bytes]) -> bytes:
    if _chunked(headers):
        body = bytearray()
        while True:
            size = _chunk_size(await reader.readline())
            if size == 0:
                await reader.readline()
                return bytes(body)
            body += await reader.readexactly(size + 2)
            del body[-2:]
    length = int(headers.get(b"content-length", b"0") or b"0")
    return await reader.readexactly(length) if length else b""


def _request_bytes(method: str, path: str, body: bytes | None, extra: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: {HOST}\r\n{extra}"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + (body or b"")


class HttpConn:
    """One keep-alive connection; requests on it are sequential.

    uvicorn closes a keep-alive connection after 5 s without a request (`timeout_keep_alive`), and a
    session's connection waits a whole turn between its requests. So a connection idle for more than
    `REUSE_S` is replaced before it is used, and a request on a reused connection that the server closed
    before answering a single byte is sent once more on a new one (the server never read it)."""

    REUSE_S = 3.0

    def __init__(self, port: int) -> None:
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._used = 0.0

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
        stale = time.monotonic() - self._used > self.REUSE_S
        if self._reader is None or self._writer is None or self._writer.is_closing() or stale:
            await self.close()
            self._reader, self._writer = await asyncio.open_connection(HOST, self.port)
            return self._reader, self._writer, True
        return self._reader, self._writer, False

    async def request(self, method: str, path: str, payload: Any = None) -> tuple[int, bytes]:
        body = None if payload is None else json.dumps(payload).encode()
        while True:
            reader, writer, fresh = await self._open()
            writer.write(_request_bytes(method, path, body))
            try:
                status, headers = await _read_head(reader)
                data = await _read_body(reader, headers)
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                await self.close()
                unanswered = not isinstance(exc, asyncio.IncompleteReadError) or not exc.partial
                if fresh or not unanswered:
                    raise
                continue
            self._used = time.monotonic()
            if headers.get(b"connection", b"").lower() == b"close":
                await self.close()
            return status, data

    async def json(self, method: str, path: str, payload: Any = None, expect: int = 200) -> Any:
        status, data = await self.request(method, path, payload)
        if status != expect:
            raise HttpError(status, data, f"{method} {path}")
        return json.loads(data) if data else None

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()


class EventStream:
    """One open SSE stream of a session, read in a task."""

    def __init__(
        self, port: int, session_id: str, after: int | None = None, *, arrivals: bool = False
    ) -> None:
        self.port = port
        self.session_id = session_id
        self.after = after
        # With `arrivals`: when every event, by id, was read (the multi-replica stage compares two streams
        # of one session event by event); off elsewhere, where a stream reads thousands of events.
        self.arrivals: dict[int, float] | None = {} if arrivals else None
        self.first: dict[str, float] = {}
        self.counts: Counter[str] = Counter()
        self.data: dict[str, list[dict[str, Any]]] = {}
        self.last_id = 0
        self.last_at = 0.0
        self.opened = asyncio.Event()
        self.error: BaseException | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._writer: asyncio.StreamWriter | None = None
        self.ended = False

    async def open(self, timeout: float = 30.0) -> EventStream:
        self._task = asyncio.create_task(self._run())
        opened = asyncio.ensure_future(self.opened.wait())
        await asyncio.wait([opened, self._task], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if not self.opened.is_set():
            opened.cancel()
            await self.close()
            raise RuntimeError(f"stream of {self.session_id} did not open: {self.error!r}")
        return self

    async def _run(self) -> None:
        try:
            await self._read()
        except (asyncio.IncompleteReadError, ConnectionError, OSError, RuntimeError) as exc:
            self.error = exc
        finally:
            self.ended = True
            self._changed.set()

    async def _read(self) -> None:
        reader, writer = await asyncio.open_connection(HOST, self.port)
        self._writer = writer
        path = f"/v1/sessions/{self.session_id}/events"
        if self.after is not None:
            path += f"?after={self.after}"
        writer.write(_request_bytes("GET", path, None, "Accept: text/event-stream\r\n"))
        status, headers = await _read_head(reader)
        if status != 200:
            raise HttpError(status, await _read_body(reader, headers), f"GET {path}")
        chunked = _chunked(headers)
        buffer = bytearray()
        while True:
            if chunked:
                size = _chunk_size(await reader.readline())
                if size == 0:
                    return
                data = await reader.readexactly(size + 2)
                buffer += data[:-2]
            else:
                data = await reader.read(65536)
                if not data:
                    return
                buffer += data
            if b"\r" in buffer:  # older servers end SSE lines in CRLF (bench.compare runs them)
                buffer[:] = buffer.replace(b"\r\n", b"\n")
            self._frames(buffer, time.monotonic())

    def _frames(self, buffer: bytearray, at: float) -> None:
        start = 0
        while True:
            end = buffer.find(b"\n\n", start)  # the service ends SSE lines in LF (streaming.frames)
            if end < 0:
                break
            self._frame(bytes(buffer[start:end]), at)
            start = end + 2
        if start:
            del buffer[:start]
            self.last_at = at
        self._changed.set()

    def _frame(self, frame: bytes, at: float) -> None:
        kind = b""
        data = b""
        for line in frame.split(b"\n"):
            if line.startswith(b"event: "):
                kind = line[7:]
            elif line.startswith(b"id: "):
                self.last_id = int(line[4:])
                if self.arrivals is not None:
                    self.arrivals.setdefault(self.last_id, at)
            elif line.startswith(b"data: "):
                data = line[6:]
            elif line.startswith(b"retry:"):
                self.opened.set()
        if not kind:
            return
        name = kind.decode()
        if name not in self.first:
            self.first[name] = at
        self.counts[name] += 1
        if kind in _KEEP_DATA:
            self.data.setdefault(name, []).append(json.loads(data))

    def reset(self) -> None:
        """Forget the marks so far: a session's next turn is timed from a clean slate (its stream stays)."""
        self.first.clear()
        self.counts.clear()
        self.data.clear()

    async def wait(self, kind: str, timeout: float) -> float:
        """The arrival time of the first `kind` event (waiting for it)."""

        async def first() -> float:
            while kind not in self.first:
                if self.ended:
                    raise RuntimeError(f"stream of {self.session_id} ended before {kind}: {self.error!r}")
                self._changed.clear()
                await self._changed.wait()
            return self.first[kind]

        return await asyncio.wait_for(first(), timeout)

    async def wait_id(self, seq: int, timeout: float) -> float:
        """The time the event numbered `seq` (or a later one) had arrived."""

        async def reached() -> float:
            while self.last_id < seq:
                if self.ended:
                    raise RuntimeError(
                        f"stream of {self.session_id} ended at id {self.last_id}: {self.error!r}"
                    )
                self._changed.clear()
                await self._changed.wait()
            return self.last_at

        return await asyncio.wait_for(reached(), timeout)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
