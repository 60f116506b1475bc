"""A fake OpenAI-compatible chat-completions upstream speaking the real wire protocol over real HTTP.

Owns the HTTP/1.1 server (raw `asyncio.start_server`, keep-alive, chunked transfer encoding), request
recording, `FakeUpstream` (background-thread runner, context manager), the `/_control/*` endpoints and
the CLI `python -m tests.fakes.upstream --port N [--strict]`. What to answer lives in `script.py`;
history validation in `strict.py`.

The HTTP side is hand-written instead of uvicorn+starlette because the tests need full control of the
socket: close it mid-body without the terminating zero-length chunk, hang before the status line, and
timestamp the moment the client goes away (a per-connection reader task sees the peer's FIN/RST at
once, even while the handler is sleeping between chunks).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from tests.fakes.http11 import BadRequest, Connection, Request
from tests.fakes.script import HttpError, Script, ToolCall, error_body, scripts_from_json
from tests.fakes.strict import validate_history

# Everything a test needs is importable from here.
__all__ = [
    "FakeUpstream",
    "HttpError",
    "RecordedRequest",
    "Script",
    "ToolCall",
    "error_body",
    "main",
    "validate_history",
]


@dataclass
class RecordedRequest:
    """One request as the server saw it. Times are `time.monotonic()` (comparable across threads and,
    on Linux, across processes). Fields after `received_at` are filled in by the server thread."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or None when the body was empty or not JSON
    received_at: float
    status: int | None = None
    finished_at: float | None = None  # response fully sent, cut by the script, or client gone
    disconnected: bool = False  # the client went away before the response was complete
    disconnected_at: float | None = None
    cut: bool = False  # the script dropped the connection on purpose
    chunks_sent: int = 0  # SSE events written (role chunk and [DONE] included)
    problems: list[str] = field(default_factory=list)  # strict-mode findings that produced a 400

    @property
    def done(self) -> bool:
        return self.finished_at is not None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class FakeUpstream:
    """Scriptable fake upstream. `start()` serves from a background thread; `serve()` from the current loop.

    `strict` validates every chat request's `messages` with `validate_history` and answers 400 on
    problems (a Script's `strict` overrides it). `api_key`, if set, makes a wrong bearer token a 401.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        strict: bool = False,
        forbid_tool_then_user: bool = False,
        api_key: str | None = None,
        model: str = "fake",
        default: Script | None = None,
    ) -> None:
        self.host, self.port = host, port
        self.strict, self.forbid_tool_then_user = strict, forbid_tool_then_user
        self.api_key, self.model = api_key, model
        self.default = default or Script.text()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue: deque[Script] = deque()
        self._requests: list[RecordedRequest] = []
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._conn_tasks: set[asyncio.Task[None]] = set()

    # ----- public API --------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def requests(self) -> list[RecordedRequest]:
        """Snapshot of recorded requests (not `/_control/*`); the items keep being updated."""
        with self._lock:
            return list(self._requests)

    def enqueue(self, *scripts: Script) -> None:
        with self._lock:
            self._queue.extend(scripts)

    def clear_scripts(self) -> None:
        """Forget the queued scripts only (recorded requests stay for checks)."""
        with self._lock:
            self._queue.clear()

    def reset(self) -> None:
        """Forget queued scripts and recorded requests."""
        with self._lock:
            self._queue.clear()
            self._requests.clear()

    def wait_for(self, predicate: Callable[[RecordedRequest], bool], within: float = 2.0) -> RecordedRequest:
        """Block until some recorded request satisfies `predicate`; TimeoutError after `within` s."""
        deadline = time.monotonic() + within
        with self._cond:
            while True:
                for rec in self._requests:
                    if predicate(rec):
                        return rec
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no matching request within {within}s")
                self._cond.wait(left)

    def wait_for_disconnect(self, within: float = 2.0) -> RecordedRequest:
        return self.wait_for(lambda r: r.disconnected, within)

    async def await_request(
        self, predicate: Callable[[RecordedRequest], bool], within: float = 2.0
    ) -> RecordedRequest:
        """Async twin of `wait_for` for a loop in another thread (polls; never blocks that loop)."""
        deadline = time.monotonic() + within
        while True:
            for rec in self.requests:
                if predicate(rec):
                    return rec
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no matching request within {within}s")
            await asyncio.sleep(0.002)

    async def await_disconnect(self, within: float = 2.0) -> RecordedRequest:
        return await self.await_request(lambda r: r.disconnected, within)

    def start(self) -> FakeUpstream:
        """Serve from a daemon thread with its own event loop; returns once listening."""
        if self._thread is not None:
            raise RuntimeError("already started")
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(self.serve(ready.set))
            except BaseException as exc:  # surfaced to start() if it happens before listening
                errors.append(exc)
                ready.set()

        self._thread = threading.Thread(target=run, name="fake-upstream", daemon=True)
        self._thread.start()
        ready.wait(10)
        if errors:
            self._thread = None
            raise RuntimeError("fake upstream failed to start") from errors[0]
        return self

    def stop(self) -> None:
        loop, stop, thread = self._loop, self._stop, self._thread
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(stop.set)
        if thread is not None:
            thread.join(10)
        self._thread = None

    def __enter__(self) -> FakeUpstream:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def serve(self, on_ready: Callable[[], None] | None = None) -> None:
        """Listen and serve on the current loop until `stop()` (or `request_stop()`)."""
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        server = await asyncio.start_server(self._on_connection, self.host, self.port)
        self.port = server.sockets[0].getsockname()[1]
        if on_ready is not None:
            on_ready()
        try:
            await self._stop.wait()
        finally:
            server.close()
            for task in list(self._conn_tasks):
                task.cancel()
            await asyncio.gather(*self._conn_tasks, return_exceptions=True)
            await server.wait_closed()
            self._loop = None

    def request_stop(self) -> None:
        """Stop `serve()` from inside its own loop (used by the CLI's signal handlers)."""
        if self._stop is not None:
            self._stop.set()

    # ----- connection handling -----------------------------------------------------------------------

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conn_tasks.add(task)
        conn = Connection(reader, writer)
        try:
            while True:
                try:
                    req = await conn.read_request()
                except (BadRequest, ValueError) as exc:
                    await conn.send_full(
                        400, json.dumps(error_body(400, str(exc))).encode(), {"connection": "close"}
                    )
                    break
                if req is None:
                    break
                keep_alive = await self._dispatch(conn, req)
                wants_close = (
                    req.headers.get("connection", "").lower() == "close" or req.version == "HTTP/1.0"
                )
                if not keep_alive or wants_close or conn.gone.is_set():
                    break
        except asyncio.CancelledError:
            # Only serve()'s shutdown cancels us. Returning normally matters: asyncio's stream callback
            # calls task.exception(), which would log a traceback for a cancelled task.
            pass
        finally:
            self._conn_tasks.discard(task)
            await conn.close()

    async def _dispatch(self, conn: Connection, req: Request) -> bool:
        """Answer one request; returns whether the connection may be reused."""
        if req.path.startswith("/_control/"):
            return await self._control(conn, req)
        try:
            body = json.loads(req.body) if req.body else None
        except ValueError:
            body = None
        rec = RecordedRequest(req.method, req.path, req.headers, body, time.monotonic())
        with self._cond:
            self._requests.append(rec)
            self._cond.notify_all()
        try:
            if req.method == "POST" and req.path == "/v1/chat/completions":
                return await self._chat(conn, rec)
            if req.method == "GET" and req.path == "/v1/models":
                models = {
                    "object": "list",
                    "data": [
                        {"id": self.model, "object": "model", "created": 0, "owned_by": "fake-upstream"}
                    ],
                }
                return await self._answer(conn, rec, 200, json.dumps(models).encode())
            return await self._answer(
                conn,
                rec,
                404,
                json.dumps(
                    error_body(404, f"Unknown route {req.method} {req.path}", code="unknown_url")
                ).encode(),
            )
        except Exception as exc:  # a bug in the fake or a bad script: answer loudly, keep serving
            rec.problems.append(f"fake upstream error: {exc!r}")
            if rec.status is None:
                await self._answer(conn, rec, 500, json.dumps(error_body(500, rec.problems[-1])).encode())
            return False
        finally:
            if rec.finished_at is None:  # cancelled by stop()
                rec.finished_at = time.monotonic()
            self._notify()

    def _finish(self, conn: Connection, rec: RecordedRequest, ok: bool) -> None:
        if not ok:
            rec.disconnected = True
            rec.disconnected_at = conn.gone_at or time.monotonic()
        rec.finished_at = time.monotonic()
        self._notify()

    async def _answer(
        self,
        conn: Connection,
        rec: RecordedRequest,
        status: int,
        body: bytes,
        headers: dict[str, str] | None = None,
    ) -> bool:
        rec.status = status
        ok = await conn.send_full(status, body, headers)
        self._finish(conn, rec, ok)
        return ok

    def _next_script(self) -> Script:
        with self._lock:
            return self._queue.popleft() if self._queue else self.default

    def _rejection(self, rec: RecordedRequest, script: Script) -> HttpError | None:
        """The 401/400 a real provider would send before generating anything, if any."""
        auth = rec.headers.get("authorization", "")
        if self.api_key is not None and auth != f"Bearer {self.api_key}":
            return HttpError(401)
        if not isinstance(rec.body, dict) or not isinstance(rec.body.get("messages"), list):
            return HttpError(400, error_body(400, "'messages' is a required property", param="messages"))
        strict = self.strict if script.strict is None else script.strict
        if strict:
            forbid = script.forbid_tool_then_user
            rec.problems = validate_history(
                rec.body["messages"],
                forbid_tool_then_user=self.forbid_tool_then_user if forbid is None else forbid,
            )
            if rec.problems:
                return HttpError(
                    400,
                    error_body(400, "; ".join(rec.problems), type="invalid_request_error", param="messages"),
                )
        return None

    async def _chat(self, conn: Connection, rec: RecordedRequest) -> bool:
        script = self._next_script()
        if script.hang_before_headers and await conn.sleep(script.hang_before_headers):
            self._finish(conn, rec, False)
            return False
        error = self._rejection(rec, script) or script.http_error
        if error is not None:
            return await self._answer(conn, rec, error.status, error.payload(), error.headers)
        body: dict[str, Any] = rec.body
        model = str(body.get("model") or self.model)
        completion_id = f"chatcmpl-fake{next(self._ids):06d}"
        if not body.get("stream"):
            payload = json.dumps(script.completion_body(model=model, completion_id=completion_id)).encode()
            if script.cut_after is None:
                return await self._answer(conn, rec, 200, payload)
            # Non-streaming cut: announce the full length, send half, hang up.
            rec.status, rec.cut = 200, True
            ok = await conn.send_head(
                200, {"content-type": "application/json", "content-length": str(len(payload))}
            )
            ok = ok and await conn.send(payload[: len(payload) // 2])
            self._finish(conn, rec, ok)
            return False
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        events = script.stream_events(model=model, include_usage=include_usage, completion_id=completion_id)
        return await self._stream(conn, rec, script, events)

    async def _stream(
        self, conn: Connection, rec: RecordedRequest, script: Script, events: list[bytes]
    ) -> bool:
        rec.status = 200
        ok = await conn.send_head(
            200,
            {
                "content-type": "text/event-stream; charset=utf-8",
                "cache-control": "no-cache",
                "transfer-encoding": "chunked",
            },
        )
        limit = len(events) + 1 if script.cut_after is None else script.cut_after
        for n, event in enumerate(events[:limit]):
            if not ok:
                break
            if n and script.delay and await conn.sleep(script.delay):
                ok = False
                break
            if not script.delay:
                # drain() does not yield below the high-water mark; without this one long unpaced
                # stream would starve every other connection (matters for the benchmark).
                await asyncio.sleep(0)
            data = b"data: " + event + b"\n\n"
            # One HTTP chunk per SSE event, as OpenAI's servers do.
            ok = await conn.send(b"%x\r\n%s\r\n" % (len(data), data))
            rec.chunks_sent += ok
        if ok and script.cut_after is None:
            ok = await conn.send(b"0\r\n\r\n")  # the terminating zero-length chunk
            self._finish(conn, rec, ok)
            return ok
        # Cut (or the client left): returning False closes the socket with the chunked body unterminated.
        rec.cut = ok
        self._finish(conn, rec, ok)
        return False

    # ----- control endpoints -------------------------------------------------------------------------

    async def _control(self, conn: Connection, req: Request) -> bool:
        status, result = 200, dict[str, Any](ok=True)
        try:
            if req.method == "POST" and req.path == "/_control/scripts":
                scripts = scripts_from_json(json.loads(req.body or b"null"))
                self.enqueue(*scripts)
                result = {"ok": True, "queued": len(scripts)}
            elif req.method == "POST" and req.path == "/_control/reset":
                self.reset()
            elif req.method == "GET" and req.path == "/_control/requests":
                result = {"requests": [r.to_json() for r in self.requests]}
            else:
                status, result = 404, error_body(404, f"Unknown control route {req.method} {req.path}")
        except (ValueError, TypeError, KeyError) as exc:
            status, result = 400, error_body(400, f"bad control request: {exc}")
        return await conn.send_full(status, json.dumps(result).encode())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.fakes.upstream", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on startup)")
    parser.add_argument("--strict", action="store_true", help="validate histories like Anthropic")
    parser.add_argument("--forbid-tool-then-user", action="store_true")
    parser.add_argument("--api-key", default=None, help="answer 401 unless this bearer token is sent")
    args = parser.parse_args(argv)
    upstream = FakeUpstream(
        host=args.host,
        port=args.port,
        strict=args.strict,
        forbid_tool_then_user=args.forbid_tool_then_user,
        api_key=args.api_key,
    )

    def on_ready() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, upstream.request_stop)
        # Parsed by whoever spawned us when --port 0 was used.
        print(f"fake upstream listening on {upstream.base_url}", flush=True)

    asyncio.run(upstream.serve(on_ready))


if __name__ == "__main__":
    main()
