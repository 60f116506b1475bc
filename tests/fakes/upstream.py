"""A fake OpenAI-compatible chat-completions upstream speaking the real wire protocol over real HTTP: the
one fake of the test suite and of the benchmark.

Owns `FakeUpstream` (served from a background thread or the current loop; a context manager), what each
route answers (`/v1/chat/completions`, Anthropic's `/v1/messages` as anthropic.py streams it, `/v1/models`,
the `/_control/*` routes that script it from another process) and the command line:

    python -m tests.fakes.upstream [--port N] [--strict] [--api-key K] [--chunks N --delay-ms D] [--cpu K]

which prints `fake upstream listening on http://HOST:PORT/v1` once it listens, and stops on SIGTERM.
What to answer lives in `script.py` (and `directive.py` for requests that name their own answer); how
an answer goes on the wire in `answer.py` and `connection.py`; history validation in `strict.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any

from tests.fakes import answer, anthropic, http11
from tests.fakes.connection import Connection
from tests.fakes.directive import directive
from tests.fakes.record import RecordedRequest
from tests.fakes.script import HttpError, Script, ToolCall, error_body, scripts_from_json
from tests.fakes.strict import validate_history, validate_messages_request

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


class FakeUpstream:
    """Scriptable fake upstream. `start()` serves from a background thread; `serve()` from the current loop.

    Each chat request takes the next queued `Script`; with none queued, a request whose last user message
    holds a `[bench chunks=N delay_ms=D]` directive gets N words D ms apart, any other gets `default`.
    `strict` validates every chat request's `messages` with `validate_history` and answers 400 on
    problems (a Script's `strict` overrides it). `api_key`, if set, makes a wrong bearer token a 401.
    `window`, if set, is a context window in tokens (`prompt_count`, the fake's own count): a chat request
    over it gets OpenAI's 400 `context_length_exceeded` (on the Messages API, Anthropic's 400 "prompt is too
    long"), and the usage of one within it reports its count.
    `responder`, if set, picks a chat or Messages request's answer from its body (None: the queue, as
    without it), for conversations whose requests a test cannot foresee in order.
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
        window: int | None = None,
        responder: Callable[[dict[str, Any]], Script | None] | None = None,
    ) -> None:
        self.window, self.responder = window, responder
        self.host, self.port = host, port
        self.strict, self.forbid_tool_then_user = strict, forbid_tool_then_user
        self.api_key, self.model = api_key, model
        self.default = default or Script.text()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue: deque[Script] = deque()
        self._requests: list[RecordedRequest] = []
        self._ids = itertools.count(1)
        self._connection_ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._connections: set[Connection] = set()

    # ----- public API --------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def root_url(self) -> str:
        """The server without a path: an Anthropic `api_base` (its client appends `/v1/messages`)."""
        return f"http://{self.host}:{self.port}"

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
        server = await self._loop.create_server(self._connection, self.host, self.port, backlog=4096)
        self.port = server.sockets[0].getsockname()[1]
        if on_ready is not None:
            on_ready()
        try:
            await self._stop.wait()
        finally:
            server.close()
            for conn in list(self._connections):
                conn.close(abort=True)
            await server.wait_closed()
            await asyncio.sleep(0)  # let the aborted connections' connection_lost run
            self._loop = None

    def request_stop(self) -> None:
        """Stop `serve()` from inside its own loop (used by the CLI's signal handlers)."""
        if self._stop is not None:
            self._stop.set()

    # ----- answering (on the server's loop) ----------------------------------------------------------

    def _connection(self) -> Connection:
        conn = Connection(self, next(self._connection_ids), self._notify, self._connections.discard)
        self._connections.add(conn)
        return conn

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def respond(self, conn: Connection, req: http11.Request) -> None:
        if req.path.startswith("/_control/"):
            conn.reply(self._control(req))
            return
        try:
            body = json.loads(req.body) if req.body else None
        except ValueError:
            body = None
        rec = RecordedRequest(req.method, req.path, req.headers, body, time.monotonic(), conn.number)
        with self._cond:
            self._requests.append(rec)
            self._cond.notify_all()
        try:
            if req.method == "POST" and req.path == "/v1/chat/completions":
                reply = self._chat(rec)
            elif req.method == "POST" and req.path == "/v1/messages":
                reply = self._messages(rec)
            elif req.method == "GET" and req.path == "/v1/models":
                models = [{"id": self.model, "object": "model", "created": 0, "owned_by": "fake-upstream"}]
                reply = answer.whole(200, json.dumps({"object": "list", "data": models}).encode())
            else:
                missing = error_body(404, f"Unknown route {req.method} {req.path}", code="unknown_url")
                reply = answer.whole(404, json.dumps(missing).encode())
        except Exception as exc:  # a bug in the fake or a bad script: answer loudly, keep serving
            rec.problems.append(f"fake upstream error: {exc!r}")
            reply = answer.whole(500, json.dumps(error_body(500, rec.problems[-1])).encode())
            reply.keep_alive = False
        conn.send(reply, rec)

    def _next_script(self, found: dict[str, str]) -> Script:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        if "chunks" in found or "delay_ms" in found:
            chunks = int(found.get("chunks", len(self.default.text_pieces)))
            delay = float(found["delay_ms"]) / 1000 if "delay_ms" in found else self.default.delay
            return Script.words(max(0, chunks), delay=max(0.0, delay))
        return self.default

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

    def _overflow(self, rec: RecordedRequest) -> HttpError | None:
        """OpenAI's answer to a prompt over the model's window (`window`), before anything is generated."""
        if self.window is None or not isinstance(rec.body, dict):
            return None
        count = prompt_count(rec.body)
        if count <= self.window:
            return None
        message = (
            f"This model's maximum context length is {self.window} tokens. However, your messages resulted "
            f"in {count} tokens. Please reduce the length of the messages."
        )
        rec.problems.append(f"over the window: {count} > {self.window} tokens")
        return HttpError(400, error_body(400, message, code="context_length_exceeded", param="messages"))

    def _chat(self, rec: RecordedRequest) -> answer.Answer:
        body: dict[str, Any] = rec.body if isinstance(rec.body, dict) else {}
        found = directive(body.get("messages"))
        rec.tag = found.get("tag")
        chosen = self.responder(body) if self.responder is not None else None
        script = chosen or self._next_script(found)
        error = self._rejection(rec, script) or self._overflow(rec) or script.http_error
        if error is not None:
            return answer.whole(error.status, error.payload(), error.headers, wait=script.hang_before_headers)
        if self.window is not None and script.usage is not None:
            script = dataclasses.replace(script, usage=(prompt_count(body), script.usage[1]))
        model = str(body.get("model") or self.model)
        completion_id = f"chatcmpl-fake{next(self._ids):06d}"
        if not body.get("stream"):
            return answer.completion(script, model=model, completion_id=completion_id)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return answer.stream(script, model=model, include_usage=include_usage, completion_id=completion_id)

    def _messages(self, rec: RecordedRequest) -> answer.Answer:
        """Anthropic's Messages API: the key in `x-api-key`, an `anthropic-version`, the request always
        validated as Anthropic does (a 400 naming the problems), the answer streamed as its events."""
        body: dict[str, Any] = rec.body if isinstance(rec.body, dict) else {}
        found = directive(body.get("messages"))
        rec.tag = found.get("tag")  # joins the benchmark's turns with these requests, as on /chat/completions
        chosen = self.responder(body) if self.responder is not None else None
        script = chosen or self._next_script(found)
        if self.api_key is not None and rec.headers.get("x-api-key") != self.api_key:
            return self._anthropic_error(401, "invalid x-api-key")
        if not rec.headers.get("anthropic-version"):
            return self._anthropic_error(400, "anthropic-version: header is required")
        rec.problems = validate_messages_request(rec.body)
        if rec.problems:
            return self._anthropic_error(400, "; ".join(rec.problems))
        if self.window is not None:
            # Anthropic's count covers the system prompt too; its refusal names both figures.
            count = prompt_count(body) + -(-len(json.dumps(body.get("system") or "")) // 4)
            if count > self.window:
                rec.problems.append(f"over the window: {count} > {self.window} tokens")
                return self._anthropic_error(
                    400, f"prompt is too long: {count} tokens > {self.window} maximum"
                )
            if script.usage is not None:
                script = dataclasses.replace(script, usage=(count, script.usage[1]))
        if script.http_error is not None:
            error = script.http_error
            return answer.whole(error.status, error.payload(), error.headers, wait=script.hang_before_headers)
        model = str(body.get("model") or self.model)
        return anthropic.stream(script, model=model, message_id=f"msg_fake{next(self._ids):06d}")

    @staticmethod
    def _anthropic_error(status: int, message: str) -> answer.Answer:
        return answer.whole(status, json.dumps(anthropic.error_body(status, message)).encode())

    def _control(self, req: http11.Request) -> bytes:
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
        return http11.whole(status, json.dumps(result).encode())


def prompt_count(body: dict[str, Any]) -> int:
    """The fake's token count of a request's prompt: its messages' and tools' JSON, four characters a
    token (more than Parley's estimate of the same prompt, which counts no JSON framing)."""
    text = json.dumps(body.get("messages") or []) + json.dumps(body.get("tools") or [])
    return -(-len(text) // 4)


def _pin(cpu: int | None) -> None:
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError as exc:
            print(f"fake upstream: cannot pin to cpu {cpu}: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.fakes.upstream", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on startup)")
    parser.add_argument("--strict", action="store_true", help="validate histories like Anthropic")
    parser.add_argument("--forbid-tool-then-user", action="store_true")
    parser.add_argument("--api-key", default=None, help="answer 401 unless this bearer token is sent")
    parser.add_argument("--chunks", type=int, default=None, help="default answer: this many one-word chunks")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="default answer: ms between chunks")
    parser.add_argument("--cpu", type=int, default=None, help="pin the process to this core")
    args = parser.parse_args(argv)
    _pin(args.cpu)
    delay = args.delay_ms / 1000
    upstream = FakeUpstream(
        host=args.host,
        port=args.port,
        strict=args.strict,
        forbid_tool_then_user=args.forbid_tool_then_user,
        api_key=args.api_key,
        default=Script.text(delay=delay) if args.chunks is None else Script.words(args.chunks, delay=delay),
    )

    def on_ready() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, upstream.request_stop)
        # Parsed by whoever spawned us when --port 0 was used.
        print(f"fake upstream listening on {upstream.base_url}", flush=True)

    try:
        import uvloop  # the benchmark's upstream shares a core with its load client: the cheaper loop
    except ImportError:
        asyncio.run(upstream.serve(on_ready))
    else:
        uvloop.run(upstream.serve(on_ready))


if __name__ == "__main__":
    main()
