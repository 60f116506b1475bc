"""The event stream's HTTP response: sse-starlette's EventSourceResponse, through its public API only.

sse-starlette sends the body (its encoding), bounds every send (`send_timeout`) and watches for the
client's disconnect. What it is told here, and why:

- `sep`: LF, as every frame of the stream (streaming.frames.SSE_LINE_END).
- `ping=0`: the heartbeat comes from the broker's single task (the body yields it on an empty batch),
  so no stream runs a pinger of its own.
- `send_timeout`: a client that reads nothing for that long is cut. sse-starlette raises SendTimeoutError
  out of the response (its documented flow); here that is a warning, not a server error: the client
  resumes by Last-Event-ID.
- `shutdown_grace_period`: at the server's exit sse-starlette would cancel every stream; the broker's drain
  ends them instead, after their last events, so the library waits for it (and cancels only a stream the
  drain did not end in time).

A wrapper, not a subclass: sse-starlette documents no method to override, and everything here happens
around its ASGI call.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, Callable, Mapping

from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.sse import SendTimeoutError
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.streaming.frames import SSE_LINE_END

log = logging.getLogger(__name__)


class EventStreamResponse(Response):
    """An endless stream of body chunks (bytes, or a ServerSentEvent) that ends when the body ends, the
    client leaves, a send times out or the server shuts down; `on_close` runs once, after any of them,
    also when the body never started (HEAD, a client gone at once)."""

    def __init__(
        self,
        content: AsyncIterable[bytes | ServerSentEvent],
        *,
        media_type: str,
        headers: Mapping[str, str],
        send_timeout: float,
        shutdown_grace: float,
        on_close: Callable[[], None],
    ) -> None:
        self._response = EventSourceResponse(
            content,
            media_type=media_type,
            headers=headers,
            ping=0,
            sep=SSE_LINE_END,
            send_timeout=send_timeout,
            shutdown_grace_period=shutdown_grace,
        )
        self._send_timeout = send_timeout
        self._on_close = on_close
        # What Starlette and FastAPI read of a response; Response.__init__ would render an empty body.
        self.status_code = self._response.status_code
        self.media_type = media_type
        self.raw_headers = self._response.raw_headers
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._response(scope, receive, send)
        except SendTimeoutError:
            # Returning with the response unfinished makes the server close the connection.
            log.warning("an event stream was cut: its client read nothing for %s s", self._send_timeout)
        finally:
            self._on_close()
        if self.background is not None:
            await self.background()
