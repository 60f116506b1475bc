"""The access log never shows an API key given as `?access_token=`."""

from __future__ import annotations

import logging

import pytest

from app.observability.access_log import RedactSecrets, install_access_log_redaction, redact_query

KEY = "alice-key-0123456789abcdef"


@pytest.mark.parametrize(
    ("logged", "shown"),
    [
        (f"/v1/sessions/s_1/events?access_token={KEY}", "/v1/sessions/s_1/events?access_token=[redacted]"),
        (
            f"/v1/sessions/s_1/events?after=4&access_token={KEY}&x=1",
            "/v1/sessions/s_1/events?after=4&access_token=[redacted]&x=1",
        ),
        (f"/e?access%5Ftoken={KEY}", "/e?access%5Ftoken=[redacted]"),
        (f"/e?access_token={KEY}&access_token={KEY}", "/e?access_token=[redacted]&access_token=[redacted]"),
        ("/e?after=4&token_access=1", "/e?after=4&token_access=1"),
        ("/v1/sessions", "/v1/sessions"),
    ],
)
def test_redact_query(logged: str, shown: str) -> None:
    assert redact_query(logged) == shown


def test_the_filter_rewrites_uvicorn_s_record_before_any_handler(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("tests.access_log")
    logger.addFilter(RedactSecrets())
    with caplog.at_level(logging.INFO, logger=logger.name):
        # uvicorn's own format and arguments
        logger.info(
            '%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", f"/v1/s/events?access_token={KEY}", "1.1", 200
        )
    assert caplog.messages == ['127.0.0.1:5 - "GET /v1/s/events?access_token=[redacted] HTTP/1.1" 200']


def test_it_is_installed_once_on_uvicorn_s_access_logger(caplog: pytest.LogCaptureFixture) -> None:
    install_access_log_redaction()
    install_access_log_redaction()
    logger = logging.getLogger("uvicorn.access")
    assert sum(isinstance(f, RedactSecrets) for f in logger.filters) == 1
    with caplog.at_level(logging.INFO, logger="uvicorn.access"):
        logger.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", f"/e?access_token={KEY}", "1.1", 200)
    # (litellm, once imported, adds a filter of its own that may reword the line further)
    assert KEY not in caplog.text
