"""The request id of the request being served, and the log record field that carries it everywhere."""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any

request_id_var: ContextVar[str] = ContextVar("request_id", default="-")


def install_request_id_logging() -> None:
    """Every log record gets `request_id`, so any handler's format can show `%(request_id)s`.

    A record factory rather than a filter: filters on a logger miss records propagated from its children.
    """
    previous = logging.getLogRecordFactory()
    if getattr(previous, "parley_request_id", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        record.request_id = request_id_var.get()
        return record

    factory.parley_request_id = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
