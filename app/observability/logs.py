"""Log output of `python -m app`: uvicorn's human lines (the default) or one JSON object per line.

uvicorn's own logging set-up gives handlers only to its loggers, so the service's (`app.*`, `parley`)
had none: their lines (a 4xx's, a failed turn's) reached only Python's last-resort handler, warnings and
up, bare. Here they get the same handler and INFO level as uvicorn's.

The JSON format puts `request_id`, `session_id`, `turn_id` and `trace_id` (context.py fills them) on every
line, and for an access line its method, path and status as fields too.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any, Literal

APP_LOGGERS = ("app", "parley")
CONTEXT_FIELDS = ("request_id", "session_id", "turn_id", "trace_id")
HUMAN_APP_FORMAT = "%(levelprefix)s %(name)s: %(message)s"
HUMAN_ACCESS_FORMAT = '%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s'


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the context ids, and any traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, "-")
            line[name] = None if value in ("-", None) else value
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
            client, method, path, _version, status = record.args
            line.update(client=client, method=method, path=path, status=status)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def log_config(
    log_format: Literal["human", "json"], level: str, *, trace_ids: bool = False
) -> dict[str, Any]:
    """The dictConfig for uvicorn.Config(log_config=...): uvicorn's loggers and the service's, one format.
    `trace_ids` adds the trace id to each human access line (tracing is on)."""
    access = HUMAN_ACCESS_FORMAT + (" trace=%(trace_id)s" if trace_ids else "")
    if log_format == "json":
        formatters: dict[str, Any] = {name: {"()": JsonFormatter} for name in ("default", "access", "app")}
    else:
        formatters = {
            "default": {"()": "uvicorn.logging.DefaultFormatter", "fmt": "%(levelprefix)s %(message)s"},
            "access": {"()": "uvicorn.logging.AccessFormatter", "fmt": access},
            "app": {"()": "uvicorn.logging.DefaultFormatter", "fmt": HUMAN_APP_FORMAT},
        }
    handlers = {
        name: {"formatter": name, "class": "logging.StreamHandler", "stream": stream}
        for name, stream in (
            ("default", "ext://sys.stderr"),
            ("access", "ext://sys.stdout"),
            ("app", "ext://sys.stderr"),
        )
    }
    loggers: dict[str, Any] = {
        "uvicorn": {"handlers": ["default"], "level": level.upper(), "propagate": False},
        "uvicorn.error": {"level": level.upper()},
        "uvicorn.access": {"handlers": ["access"], "level": level.upper(), "propagate": False},
    }
    for name in APP_LOGGERS:
        loggers[name] = {"handlers": ["app"], "level": level.upper(), "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": formatters,
        "handlers": handlers,
        "loggers": loggers,
    }
