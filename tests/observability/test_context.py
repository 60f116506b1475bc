"""The request id in log records (app.observability.context): once installed, every record, from any logger,
carries the id of the request being served, and "-" outside one."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from app.observability.context import install_request_id_logging, request_id_var


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(request_id)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def installed() -> Iterator[None]:
    """Installed over logging's plain record factory (app.main installs it at import: it is put back)."""
    previous = logging.getLogRecordFactory()
    logging.setLogRecordFactory(logging.LogRecord)
    try:
        install_request_id_logging()
        yield
    finally:
        logging.setLogRecordFactory(previous)


@pytest.fixture
def lines() -> Iterator[Lines]:
    """What a handler on a parent logger formats, from records its child logger makes."""
    handler, parent = Lines(), logging.getLogger("parley_test_context")
    parent.addHandler(handler)
    parent.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        parent.removeHandler(handler)


@pytest.mark.usefixtures("installed")
def test_records_carry_the_request_id_and_a_dash_outside_a_request(lines: Lines) -> None:
    child = logging.getLogger("parley_test_context.child")
    child.info("before")
    token = request_id_var.set("req-0123")
    try:
        child.info("during")
    finally:
        request_id_var.reset(token)
    child.info("after")
    assert lines.lines == ["- before", "req-0123 during", "- after"]


@pytest.mark.usefixtures("installed")
def test_installing_twice_keeps_one_factory() -> None:
    factory = logging.getLogRecordFactory()
    assert factory is not logging.LogRecord
    install_request_id_logging()
    assert logging.getLogRecordFactory() is factory


def test_without_the_factory_records_have_no_request_id() -> None:
    """What the factory adds: a plain record lacks the field (so `%(request_id)s` would fail)."""
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "message", None, None)
    assert not hasattr(record, "request_id")
