"""One client connection of the fake upstream: an asyncio protocol that parses requests as bytes arrive,
answers them one at a time, and writes each `Answer` from loop timers.

A protocol and timer callbacks rather than streams and a task per connection, for two reasons. The
moment the peer leaves (FIN or RST) is seen at once, even while an answer waits between two pieces, and
the answer stops there. And a paced chunk costs one timer callback and one write: the benchmark runs
this fake on the core its load client uses, and measures the server's CPU per chunk, not ours.
Clients used here never half-close after sending a request, so EOF on the socket means the client left.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Protocol, cast

from tests.fakes import http11
from tests.fakes.answer import Answer
from tests.fakes.record import RecordedRequest
from tests.fakes.script import error_body


class Responder(Protocol):
    def respond(self, conn: Connection, request: http11.Request) -> None:
        """Answer `request`: `conn.send(...)` or `conn.reply(...)`, now or later."""


class Connection(asyncio.Protocol):
    """Requests in the order they came, each answered before the next is parsed; numbered for the record."""

    def __init__(
        self,
        responder: Responder,
        number: int,
        notify: Callable[[], None],
        closed: Callable[[Connection], None],
    ) -> None:
        self.responder, self.number = responder, number
        self._notify, self._closed = notify, closed
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.gone_at: float | None = None  # when the client left, if it did
        self.closing = False  # we closed it
        self.gone = False  # either: nothing more is written
        self._request: http11.Request | None = None  # the one being answered
        self._sending: Sending | None = None
        self._parsing = False

    # ----- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._next()

    def eof_received(self) -> bool:
        self._gone()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone()
        self._closed(self)

    # ----- answering ---------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.gone and data:
            self.transport.write(data)

    def close(self, *, abort: bool = False) -> None:
        """Close after what was written (`abort`: at once, dropping it)."""
        self.closing = self.gone = True
        if self.transport is not None:
            if abort:
                self.transport.abort()
            else:
                self.transport.close()

    def send(self, answer: Answer, record: RecordedRequest) -> None:
        """Write `answer` on its schedule, keeping `record` up to date."""
        self._sending = Sending(self, answer, record, self._notify)
        self._sending.start()

    def reply(self, data: bytes) -> None:
        """Write a whole response at once (nothing recorded)."""
        self.write(data)
        self.done(keep_alive=True)

    def done(self, *, keep_alive: bool) -> None:
        """The current answer is complete: close, or go on with the next request."""
        request, self._request, self._sending = self._request, None, None
        if not keep_alive or (request is not None and request.wants_close):
            self.close()
        elif not self._parsing:
            self._next()

    def _next(self) -> None:
        self._parsing = True
        try:
            while self._request is None and not self.gone:
                try:
                    request = http11.parse_request(self.buf)
                except http11.BadRequest as exc:
                    body = json.dumps(error_body(400, str(exc))).encode()
                    self.write(http11.whole(400, body, {"connection": "close"}))
                    self.close()
                    return
                if request is None:
                    return
                self._request = request
                self.responder.respond(self, request)
        finally:
            self._parsing = False

    def _gone(self) -> None:
        if not self.gone:  # not when it is our own close
            self.gone_at, self.gone = time.monotonic(), True
        if self._sending is not None:
            self._sending.abort()
            self._sending = None


class Sending:
    """One answer going out on its schedule (see `Answer`); stops when the client leaves."""

    def __init__(
        self, conn: Connection, answer: Answer, record: RecordedRequest, notify: Callable[[], None]
    ) -> None:
        self.conn, self.answer, self.record, self.notify = conn, answer, record, notify
        self.loop = asyncio.get_running_loop()
        assert conn.transport is not None
        self.send = conn.transport.write  # the connection's `gone` is checked once per callback
        self.index = -1  # the next paced piece; -1: `first`
        self.start_at = 0.0
        self.handle: asyncio.Handle | None = None

    def start(self) -> None:
        self.start_at = time.monotonic() + self.answer.wait
        if self.answer.wait > 0:
            self.handle = self.loop.call_later(self.answer.wait, self._write)
        else:
            self._write()

    def _write(self) -> None:
        self.handle = None
        conn, answer, record, n = self.conn, self.answer, self.record, self.index
        if conn.gone:
            return
        if n < 0:
            record.status = answer.status
            self.send(answer.first)
            record.chunks_sent += answer.first_events
        else:
            self.send(answer.paced[n])
            record.chunks_sent += answer.paced_events
            if n < answer.content:
                record.content_sent += 1
                if n == 0:
                    record.first_content_at = time.monotonic()
        self.index = n = n + 1
        if n == len(answer.paced):
            if answer.last:
                self.send(answer.last)
            record.chunks_sent += answer.last_events
            if not answer.hold:  # held: `abort` ends it, when the client leaves
                self._end()
            return
        wait = self.start_at + (n + 1) * answer.delay - time.monotonic()
        if wait > 0:
            self.handle = self.loop.call_later(wait, self._write)
        else:
            # Never a loop inside one callback: an unpaced long answer must not starve other connections.
            self.handle = self.loop.call_soon(self._write)

    def _end(self) -> None:
        self.record.cut = self.answer.cut
        self.record.finished_at = time.monotonic()
        self.notify()
        self.conn.done(keep_alive=self.answer.keep_alive)

    def abort(self) -> None:
        """The client left (or the fake stopped) before the answer was complete."""
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        record = self.record
        if record.finished_at is None:
            if self.conn.gone_at is not None:
                record.disconnected, record.disconnected_at = True, self.conn.gone_at
            record.finished_at = time.monotonic()
            self.notify()
