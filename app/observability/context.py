"""What a log record knows about where it was made: the request, the chat session, the turn and the trace.

`request_id` is set by the request middleware, `session_id` by the observability middleware (from the
path) and by a turn's task (`bind_turn`), `turn_id` by the turn's task; the trace id is the current
OpenTelemetry span's (none unless tracing is on).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from opentelemetry import trace

request_id_var: ContextVar[str] = ContextVar("request_id", default="-")
session_id_var: ContextVar[str | None] = ContextVar("session_id", default=None)
turn_id_var: ContextVar[str | None] = ContextVar("turn_id", default=None)


_SESSION_PATH = re.compile(r"^/v1/sessions/([^/]+)")


class SessionIdMiddleware:
    """Log records made while a request under /v1/sessions/{session_id} is served carry that id (pure ASGI:
    the contextvar is set in the request's own task, so the access line sees it too)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        found = _SESSION_PATH.match(scope.get("path", "")) if scope["type"] == "http" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        token = session_id_var.set(found[1][:100])
        try:
            await self.app(scope, receive, send)
        finally:
            session_id_var.reset(token)


def current_trace_id() -> str | None:
    """The current span's trace id as 32 hex digits; None outside a recorded trace."""
    context = trace.get_current_span().get_span_context()
    return f"{context.trace_id:032x}" if context.is_valid else None


@contextmanager
def bind_turn(session_id: str, turn_id: str) -> Iterator[None]:
    """Log records made inside carry the session and turn ids."""
    session_token = session_id_var.set(session_id)
    turn_token = turn_id_var.set(turn_id)
    try:
        yield
    finally:
        turn_id_var.reset(turn_token)
        session_id_var.reset(session_token)


def install_request_id_logging() -> None:
    """Every log record gets `request_id`, `session_id`, `turn_id` and `trace_id`, so any handler's format
    can show them (`-` when unknown, so a %-format never fails).

    A record factory rather than a filter: filters on a logger miss records propagated from its children.
    """
    previous = logging.getLogRecordFactory()
    if getattr(previous, "parley_request_id", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        record.request_id = request_id_var.get()
        record.session_id = session_id_var.get() or "-"
        record.turn_id = turn_id_var.get() or "-"
        record.trace_id = current_trace_id() or "-"
        return record

    factory.parley_request_id = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
