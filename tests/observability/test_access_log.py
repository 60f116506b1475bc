"""The access log never shows an API key given as `?access_token=`, however it is encoded, and keeps the
rest of the query readable."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from uvicorn.logging import AccessFormatter

from app.observability.access_log import RedactSecrets, install_access_log_redaction, redact_query
from tests.support.keys import EVERY_CHARACTER_KEY, key_pieces_in

KEY = "alice-key-0123456789abcdef"
ENCODED = quote(EVERY_CHARACTER_KEY, safe="")
# Every form a key takes in a request target: as curl sends it (unencoded), percent-encoded (what
# encodeURIComponent and httpx's params send), with lower-case escapes, and half of each.
SENT = {
    "raw": EVERY_CHARACTER_KEY,
    "encoded": ENCODED,
    "lower-case escapes": re.sub(r"%[0-9A-F]{2}", lambda m: m[0].lower(), ENCODED),
    "half encoded": ENCODED[: len(ENCODED) // 2] + EVERY_CHARACTER_KEY[len(EVERY_CHARACTER_KEY) // 2 :],
}
# uvicorn's default access log format (uvicorn.config.LOGGING_CONFIG)
UVICORN_FORMAT = '%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s'


@pytest.mark.parametrize(
    ("logged", "shown"),
    [
        (f"/v1/sessions/s_1/events?access_token={KEY}", "/v1/sessions/s_1/events?access_token=[redacted]"),
        (
            f"/v1/sessions/s_1/events?after=4&access_token={KEY}&x=1",
            "/v1/sessions/s_1/events?after=4&access_token=[redacted]&x=1",
        ),
        # The name as the server reads it: a log line that showed `access%5Ftoken` would look like a secret
        # only once decoded, and LiteLLM's filter then drops the whole query (`after=` and `format=` too).
        (f"/e?access%5Ftoken={KEY}&after=4", "/e?access_token=[redacted]&after=4"),
        (f"/e?%61ccess_token={KEY}", "/e?access_token=[redacted]"),
        (f"/e?Access_Token={KEY}", "/e?Access_Token=[redacted]"),
        (f"/e?access_token={KEY}&access_token={KEY}", "/e?access_token=[redacted]&access_token=[redacted]"),
        ("/e?access_token=&after=4", "/e?access_token=[redacted]&after=4"),
        ("/e?after=4&token_access=1", "/e?after=4&token_access=1"),
        ("/e?access_token&after=4", "/e?access_token&after=4"),
        ("/v1/sessions", "/v1/sessions"),
    ],
)
def test_redact_query(logged: str, shown: str) -> None:
    assert redact_query(logged) == shown


@pytest.mark.parametrize("form", SENT)
def test_a_key_of_every_allowed_character_is_hidden_whole_and_the_rest_of_the_query_kept(form: str) -> None:
    target = f"/v1/sessions/s_1/events?after=4&access_token={SENT[form]}&format=ndjson"
    assert redact_query(target) == "/v1/sessions/s_1/events?after=4&access_token=[redacted]&format=ndjson"


@pytest.mark.parametrize("form", SENT)
def test_in_a_line_already_formatted_the_value_ends_at_the_request_line_s_space(form: str) -> None:
    line = f'127.0.0.1:5 - "GET /e?access_token={SENT[form]} HTTP/1.1" 200'
    assert redact_query(line) == '127.0.0.1:5 - "GET /e?access_token=[redacted] HTTP/1.1" 200'


@pytest.fixture
def uvicorn_like_log() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger with the service's filter and uvicorn's access formatter on its handler."""
    logger = logging.getLogger("tests.access_log.uvicorn_like")
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(AccessFormatter(UVICORN_FORMAT, use_colors=False))
    logger.addHandler(handler)
    logger.addFilter(redact := RedactSecrets())
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger, out
    finally:
        logger.removeHandler(handler)
        logger.removeFilter(redact)


@pytest.mark.parametrize("form", SENT)
def test_uvicorn_s_access_line_shows_no_piece_of_the_key(
    uvicorn_like_log: tuple[logging.Logger, io.StringIO], form: str
) -> None:
    logger, out = uvicorn_like_log
    path = f"/v1/sessions/s_1/events?after=4&access_token={SENT[form]}&format=ndjson"
    # uvicorn's own call (protocols/http/httptools_impl.py and h11_impl.py)
    logger.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", path, "1.1", 200)
    line = out.getvalue()
    assert key_pieces_in(line, EVERY_CHARACTER_KEY) == [], line
    assert '"GET /v1/sessions/s_1/events?after=4&access_token=[redacted]&format=ndjson HTTP/1.1" 200' in line


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
