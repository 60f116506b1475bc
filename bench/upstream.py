"""A lean OpenAI-compatible streaming upstream for the benchmark, in a process of its own.

`python -m bench.upstream [--chunks N] [--delay-ms D] [--cpu K]` binds a free port on 127.0.0.1, prints
`PORT <n>` on stdout, and serves:

- `POST /v1/chat/completions` with `"stream": true`: a role chunk at once, then N text chunks, chunk i at
  start + i x D ms (an absolute schedule, so a late tick does not push the others), then the finish chunk,
  a usage chunk when `stream_options.include_usage`, and `[DONE]`. Chunk bytes are encoded once per model.
  Without `stream` it answers the whole completion at once.
- `GET /stats`: every request since the last reset, with `start` (request received), `first` (first text
  chunk written), `end` (last byte written: the upstream's own duration is end - start) and
  `disconnected` (the moment it saw the client go away, None if it did not), all `time.monotonic()`,
  which on Linux is one clock for every process; and the request's `user_agent` (which client sent it).
- `POST /reset`: forget the recorded requests.

Per request, N, D and a tag (to match the request to the client that caused it) come from, in order: a
`[bench tag=T chunks=N delay_ms=D]` directive in the last user message (the server under test forwards
it untouched), the headers `x-bench-tag`, `x-bench-chunks`, `x-bench-delay-ms`, the model name
(`...-c200-d20`), then the process's arguments.

Plain asyncio protocol (uvloop when installed) and timer callbacks instead of a task per stream: the
upstream must stay cheap so that it is never what the benchmark measures. `--cpu K` pins it to core K.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, cast

# Sixteen words, each one chunk: a realistic token size (a few bytes of text per SSE event).
_SENTENCE = "The quick brown fox jumps over the lazy dog, and then it naps in the sun."
_WORDS = [word + " " for word in _SENTENCE.split()]
_DIRECTIVE = re.compile(r"\[bench((?:\s+[a-z_]+=[^\s\]]+)*)\s*\]")
_MODEL_PACE = re.compile(r"c(\d+)[-_]d(\d+(?:\.\d+)?)")
_HEAD_END = b"\r\n\r\n"
_MAX_HEAD = 64 * 1024
_CREATED = 1_700_000_000


@dataclass
class Pace:
    chunks: int
    delay_ms: float


@dataclass
class Record:
    """One chat-completions request as this process saw it (monotonic seconds)."""

    id: int
    tag: str | None
    model: str
    chunks: int
    delay_ms: float
    include_usage: bool
    start: float
    user_agent: str = ""
    first: float | None = None  # the first text chunk written
    end: float | None = None
    disconnected: float | None = None
    sent: int = 0


def _frame(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk holding one SSE event."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(obj: dict[str, Any]) -> bytes:
    return _frame(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _chunk(model: str, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": _CREATED,
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


class Encoded:
    """The byte strings of one model's stream, built once."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.role = _event(_chunk(model, {"role": "assistant", "content": ""}))
        self.words = [_event(_chunk(model, {"content": word})) for word in _WORDS]
        self.finish = _event(_chunk(model, {}, "stop"))
        self.done = _frame(b"data: [DONE]\n\n") + b"0\r\n\r\n"

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        usage = _usage(prompt_tokens, completion_tokens)
        return _event({**_chunk(self.model, {}), "choices": [], "usage": usage})


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def bench_content(tag: str, chunks: int, delay_ms: float) -> str:
    """A user message whose directive tells this upstream how to answer and names the request."""
    return f"[bench tag={tag} chunks={chunks} delay_ms={delay_ms:g}] Tell me a story."


def directive(messages: Any) -> dict[str, str]:
    """The `[bench k=v ...]` settings of the last user message."""
    if not isinstance(messages, list):
        return {}
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            found = _DIRECTIVE.findall(_text_of(message.get("content")))
            if not found:
                return {}
            pairs = (item.split("=", 1) for item in found[-1].split())
            return {key: value for key, value in pairs}
    return {}


class Upstream:
    def __init__(self, default: Pace) -> None:
        self.default = default
        self.records: list[Record] = []
        self._next_id = 0
        self._encoded: dict[str, Encoded] = {}

    def encoded(self, model: str) -> Encoded:
        found = self._encoded.get(model)
        if found is None:
            found = self._encoded[model] = Encoded(model)
        return found

    def pace(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[Pace, str | None]:
        chunks, delay = self.default.chunks, self.default.delay_ms
        model = str(body.get("model", ""))
        match = _MODEL_PACE.search(model)
        if match:
            chunks, delay = int(match.group(1)), float(match.group(2))
        if "x-bench-chunks" in headers:
            chunks = int(headers["x-bench-chunks"])
        if "x-bench-delay-ms" in headers:
            delay = float(headers["x-bench-delay-ms"])
        tag = headers.get("x-bench-tag")
        found = directive(body.get("messages"))
        chunks = int(found.get("chunks", chunks))
        delay = float(found.get("delay_ms", delay))
        tag = found.get("tag", tag)
        return Pace(max(0, chunks), max(0.0, delay)), tag

    def record(self, tag: str | None, model: str, pace: Pace, include_usage: bool, agent: str) -> Record:
        self._next_id += 1
        record = Record(
            self._next_id, tag, model, pace.chunks, pace.delay_ms, include_usage, time.monotonic(), agent
        )
        self.records.append(record)
        return record

    def stats(self) -> bytes:
        return json.dumps({"requests": [asdict(r) for r in self.records], "now": time.monotonic()}).encode()

    def reset(self) -> None:
        self.records.clear()


class Stream:
    """One streamed response, driven by loop timers; stops as soon as the connection is lost."""

    def __init__(
        self,
        conn: Connection,
        record: Record,
        encoded: Encoded,
        prompt_tokens: int,
    ) -> None:
        self.conn = conn
        self.record = record
        self.encoded = encoded
        self.prompt_tokens = prompt_tokens
        self.delay = record.delay_ms / 1000.0
        self.index = 0
        self.handle: asyncio.TimerHandle | asyncio.Handle | None = None
        self.loop = asyncio.get_running_loop()

    def begin(self) -> None:
        self.conn.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + self.encoded.role
        )
        self._schedule()

    def _schedule(self) -> None:
        if self.index >= self.record.chunks:
            self._finish()
            return
        deadline = self.record.start + (self.index + 1) * self.delay
        wait = deadline - time.monotonic()
        if wait > 0:
            self.handle = self.loop.call_later(wait, self._tick)
        else:
            self.handle = self.loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.handle = None
        if self.conn.closed:
            return
        words = self.encoded.words
        self.conn.write(words[self.index % len(words)])
        if self.index == 0:
            self.record.first = time.monotonic()
        self.index += 1
        self.record.sent = self.index
        self._schedule()

    def _finish(self) -> None:
        tail = self.encoded.finish
        if self.record.include_usage:
            tail += self.encoded.usage(self.prompt_tokens, self.record.chunks)
        self.conn.write(tail + self.encoded.done)
        self.record.end = time.monotonic()
        self.conn.stream_done()

    def abort(self, at: float) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        if self.record.end is None and self.record.disconnected is None:
            self.record.disconnected = at


class Connection(asyncio.Protocol):
    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.stream: Stream | None = None
        self.closed = False
        self.keep_alive = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.stream is None:
            self._process()

    def eof_received(self) -> bool:
        self._gone()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone()

    def _gone(self) -> None:
        at = time.monotonic()
        self.closed = True
        if self.stream is not None:
            self.stream.abort(at)
            self.stream = None

    def stream_done(self) -> None:
        self.stream = None
        if not self.keep_alive and self.transport is not None:
            self.transport.close()
        elif self.buffer:
            self._process()

    def _process(self) -> None:
        while self.stream is None and not self.closed:
            end = self.buffer.find(_HEAD_END)
            if end < 0:
                if len(self.buffer) > _MAX_HEAD:
                    self._respond(431, b"{}")
                    self._close()
                return
            head = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
            method, path, _version = [*head[0].split(" ", 2), "", ""][:3]
            headers: dict[str, str] = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0") or 0)
            if len(self.buffer) < end + 4 + length:
                return
            body = bytes(self.buffer[end + 4 : end + 4 + length])
            del self.buffer[: end + 4 + length]
            self.keep_alive = headers.get("connection", "").lower() != "close"
            self._dispatch(method, path, headers, body)

    def _dispatch(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        path = path.split("?", 1)[0]
        if method == "POST" and path.endswith("/chat/completions"):
            self._completion(headers, body)
        elif method == "GET" and path == "/stats":
            self._respond(200, self.upstream.stats())
        elif method == "POST" and path == "/reset":
            self.upstream.reset()
            self._respond(200, b'{"reset":true}')
        elif method == "GET" and path == "/health":
            self._respond(200, b'{"status":"ok"}')
        else:
            self._respond(404, b'{"error":{"message":"not found"}}')

    def _respond(self, status: int, payload: bytes) -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 431: "Too Large"}.get(status, "Error")
        close = b"" if self.keep_alive else b"connection: close\r\n"
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n"
        self.write(head % (status, reason.encode(), len(payload), close) + payload)
        if not self.keep_alive:
            self._close()

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _completion(self, headers: dict[str, str], raw: bytes) -> None:
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError:
            self._respond(400, b'{"error":{"message":"bad json"}}')
            return
        pace, tag = self.upstream.pace(body, headers)
        model = str(body.get("model", "bench"))
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        # The user agent tells which client the server used (the openai SDK under litellm, or another).
        record = self.upstream.record(tag, model, pace, include_usage, headers.get("user-agent", ""))
        encoded = self.upstream.encoded(model)
        prompt_tokens = max(1, len(raw) // 4)
        if not body.get("stream"):
            record.sent = pace.chunks
            self._respond(200, _whole(model, pace.chunks, prompt_tokens))
            record.end = time.monotonic()
            return
        self.stream = Stream(self, record, encoded, prompt_tokens)
        self.stream.begin()


def _whole(model: str, chunks: int, prompt_tokens: int) -> bytes:
    """A non-streamed completion of `chunks` words."""
    text = "".join(_WORDS[i % len(_WORDS)] for i in range(chunks))
    usage = _usage(prompt_tokens, chunks)
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    reply = {"id": "chatcmpl-bench", "object": "chat.completion", "created": _CREATED, "model": model}
    return json.dumps({**reply, "choices": [choice], "usage": usage}).encode()


def pin(cpu: int | None) -> None:
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError as exc:
            print(f"upstream: cannot pin to cpu {cpu}: {exc}", file=sys.stderr)


async def serve(host: str, port: int, default: Pace) -> None:
    loop = asyncio.get_running_loop()
    upstream = Upstream(default)
    server = await loop.create_server(lambda: Connection(upstream), host, port, backlog=4096)
    sockets = list(server.sockets)
    print(f"PORT {sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.upstream", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--chunks", type=int, default=200, help="text chunks per response")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="milliseconds between chunks")
    parser.add_argument("--cpu", type=int, default=None, help="pin the process to this core")
    args = parser.parse_args(argv)
    pin(args.cpu)
    coro = serve(args.host, args.port, Pace(args.chunks, args.delay_ms))
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)
    return 0


if __name__ == "__main__":
    sys.exit(main())
