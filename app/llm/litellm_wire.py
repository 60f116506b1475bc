"""The wire between the service and its LiteLLM child: versioned, newline-delimited JSON over one socket.

Each line is a JSON array of messages, and each message an array whose first item names it. A side
gathers everything one turn of its event loop produced (the parts of many streams, opens, cancels) and
writes it as one line, with one `write`: never a syscall per part.

    service -> child
      ["init", VERSION, {"env": {...}, "affinity": [cpu, ...] | null, "demo_token_delay": s, "log_level": n}]
      ["open", stream_id, kwargs]          `litellm.acompletion(**kwargs)`, kwargs as JSON
      ["cancel", stream_id]                the stream's consumer is gone: cancel it (its aclose ends the call)
    child -> service
      ["hello", VERSION, pid]              once, in answer to init
      ["parts", stream_id, [part, ...]]    part: ["t", text] | ["c", index, id, name, arguments]
                                           | ["u", prompt, completion, total, estimated] | ["f", reason]
      ["end", stream_id, error]            error: null, or [code, message, status, retryable]
      ["log", level, logger_name, text]    a record of the child's logging, for the service's own logging

A cancelled stream gets no "end". Closing the connection is the stop, either way: the child cancels every
stream and exits; the service fails every open stream (the child is gone).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, cast

from app.llm.types import (
    FinishPart,
    ProviderError,
    ReasoningPart,
    StreamPart,
    TextPart,
    ToolCallPart,
    UsagePart,
)

log = logging.getLogger(__name__)

VERSION = 3  # 2: a usage part carries `estimated`; 3: and the cached and reasoning token counts

_dumps = json.JSONEncoder(separators=(",", ":")).encode


def encode_part(part: StreamPart) -> list[Any]:
    if isinstance(part, TextPart):
        return ["t", part.text]
    if isinstance(part, ToolCallPart):
        return ["c", part.index, part.id, part.name, part.arguments]
    if isinstance(part, UsagePart):
        return [
            "u",
            part.prompt_tokens,
            part.completion_tokens,
            part.total_tokens,
            part.estimated,
            part.cache_read_tokens,
            part.cache_write_tokens,
            part.reasoning_tokens,
        ]
    if isinstance(part, ReasoningPart):
        return ["r", part.text, part.signature, part.redacted]
    return ["f", part.reason]


def decode_part(item: list[Any]) -> StreamPart:
    kind = item[0]
    if kind == "t":
        return TextPart(item[1])
    if kind == "c":
        return ToolCallPart(index=item[1], id=item[2], name=item[3], arguments=item[4])
    if kind == "u":
        return UsagePart(*item[1:8])
    if kind == "f":
        return FinishPart(item[1])
    if kind == "r":
        return ReasoningPart(item[1], item[2], item[3])
    raise ValueError(f"unknown part kind {kind!r}")


def encode_error(error: ProviderError | None) -> list[Any] | None:
    if error is None:
        return None
    return [error.code, error.message, error.status, error.retryable, error.retry_after]


def decode_error(item: list[Any] | None) -> ProviderError | None:
    if item is None:
        return None
    code, message, status, retryable, retry_after = item
    return ProviderError(code, message, status=status, retryable=bool(retryable), retry_after=retry_after)


class Outbox:
    """Messages for the peer, written as one line at the end of the loop iteration that produced them.

    A message is encoded when it is sent (a value JSON cannot hold fails its sender, not the batch); parts
    are merged per stream and go before the other messages of the line, so a stream's "end" always
    follows its last parts. Once detached (the connection is gone) it drops what it is given.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._transport: asyncio.WriteTransport | None = None
        self._detached = False
        self._parts: dict[int, list[list[Any]]] = {}
        self._messages: list[str] = []
        self._scheduled = False

    def attach(self, transport: asyncio.WriteTransport) -> None:
        self._transport = transport
        self._schedule()

    def detach(self) -> None:
        self._transport, self._detached = None, True
        self._parts.clear()
        self._messages.clear()

    @property
    def attached(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    def send(self, message: list[Any]) -> None:
        if not self._detached:
            self._messages.append(_dumps(message))
            self._schedule()

    def send_parts(self, stream_id: int, parts: list[list[Any]]) -> None:
        if self._detached:
            return
        kept = self._parts.get(stream_id)
        if kept is None:
            self._parts[stream_id] = parts
        else:
            kept.extend(parts)
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Writes what is pending now (also called directly before a close)."""
        self._scheduled = False
        transport = self._transport
        if transport is None or transport.is_closing() or not (self._parts or self._messages):
            return
        items = [_dumps(["parts", sid, parts]) for sid, parts in self._parts.items()]
        items += self._messages
        self._parts, self._messages = {}, []
        transport.write(("[" + ",".join(items) + "]\n").encode())


class LineReader:
    """Splits what arrives into lines and returns their messages, in order."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes | memoryview) -> list[list[Any]]:
        self._buffer += data
        end = self._buffer.rfind(b"\n")
        if end < 0:
            return []
        complete = self._buffer[:end]
        del self._buffer[: end + 1]
        messages: list[list[Any]] = []
        for line in complete.split(b"\n"):
            messages.extend(json.loads(line))
        return messages


class Peer(asyncio.BaseProtocol):
    """What both ends of the connection share: an `Outbox` attached to the transport, and lines read into
    messages; a line that is not the protocol aborts the connection (`peer` names the sender in the log)."""

    peer = "the peer"

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._reader = LineReader()
        self._outbox = Outbox(loop)
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not asyncio.Transport subclasses, hence no isinstance check).
        self._transport = cast(asyncio.Transport, transport)
        self._outbox.attach(self._transport)

    def read(self, data: bytes | memoryview) -> list[list[Any]]:
        """The messages of the lines `data` completes; none if it broke the protocol (then aborted)."""
        try:
            return self._reader.feed(data)
        except ValueError:
            log.exception("%s sent a line that is not the wire protocol", self.peer)
            self.abort()
            return []

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
