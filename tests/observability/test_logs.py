"""The log formats (app.observability.logs): the JSON formatter writes one parseable object per record with
the context ids (null when unknown) and an access line's fields; the configuration gives the service's
loggers a handler. How it proves it: records are formatted and parsed back, the config is applied with
logging.config and the loggers inspected."""

from __future__ import annotations

import json
import logging
import logging.config

from app.observability.context import bind_turn, install_request_id_logging
from app.observability.logs import APP_LOGGERS, JsonFormatter, log_config


def _record(name: str, message: str, args: tuple[object, ...]) -> logging.LogRecord:
    install_request_id_logging()
    return logging.getLogRecordFactory()(name, logging.INFO, __file__, 1, message, args, None)


def test_a_json_line_has_the_context_ids_and_an_access_lines_fields() -> None:
    with bind_turn("s_abc", "t_def"):
        record = _record("uvicorn.access", '%s - "%s %s HTTP/%s" %d', ("1.2.3.4:5", "GET", "/x", "1.1", 404))
    line = json.loads(JsonFormatter().format(record))
    assert (line["session_id"], line["turn_id"], line["trace_id"]) == ("s_abc", "t_def", None)
    assert (line["method"], line["path"], line["status"]) == ("GET", "/x", 404)
    assert line["message"] == '1.2.3.4:5 - "GET /x HTTP/1.1" 404'


def test_a_traceback_stays_inside_its_one_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = _record("app.x", "failed", ())
        record.exc_info = __import__("sys").exc_info()
    text = JsonFormatter().format(record)
    assert "\n" not in text and "ValueError: boom" in json.loads(text)["exception"]


def test_the_services_loggers_get_a_handler_in_both_formats() -> None:
    loggers = [
        logging.getLogger(name) for name in (*APP_LOGGERS, "uvicorn", "uvicorn.error", "uvicorn.access")
    ]
    saved = {logger.name: (logger.handlers[:], logger.level, logger.propagate) for logger in loggers}
    try:
        for log_format in ("human", "json"):
            logging.config.dictConfig(log_config(log_format, "info", trace_ids=True))
            for name in APP_LOGGERS:
                logger = logging.getLogger(name)
                assert logger.handlers and logger.level == logging.INFO
    finally:
        for name, (handlers, level, propagate) in saved.items():
            logging.getLogger(name).handlers = handlers
            logging.getLogger(name).setLevel(level)
            logging.getLogger(name).propagate = propagate
