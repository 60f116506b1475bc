"""The failures' codes and messages without a stream: what an answer that is no completion stream is
called, and how a LiteLLM failure mid-stream is told apart, a stall (a timeout) from a drop."""

from __future__ import annotations

import datetime
from types import ModuleType, SimpleNamespace

import pytest

from app.llm.provider_errors import map_error, media_type, not_a_stream

ANSWERED = "The model provider answered with {}, not a completion stream."


@pytest.mark.parametrize(
    ("content_type", "empty", "html", "message"),
    [
        ("text/html; charset=utf-8", False, False, ANSWERED.format("HTML (text/html)")),
        ("text/event-stream", False, True, ANSWERED.format("HTML (text/event-stream)")),
        (None, False, True, ANSWERED.format("HTML")),
        ("application/json", True, False, ANSWERED.format("an empty body")),
        ("Application/JSON", False, False, ANSWERED.format("application/json")),
        (None, False, False, ANSWERED.format("a body without a content type")),
        ("text/" + "x" * 200, False, False, ANSWERED.format("an unusual content type")),
        ("text/event-stream", False, False, "The model provider's event stream held no completion events."),
    ],
)
def test_an_answer_that_is_no_stream_is_named_by_what_it_was(
    content_type: str | None, empty: bool, html: bool, message: str
) -> None:
    error = not_a_stream(content_type, empty=empty, html=html)
    assert (error.code, error.message, error.status, error.retryable) == (
        "provider_bad_response",
        message,
        200,
        True,
    )


@pytest.mark.parametrize(
    ("content_type", "media"),
    [("text/html; charset=utf-8", "text/html"), ("", None), ("text/html\r\nx: y", None), ("<b>/x", None)],
)
def test_only_a_plain_media_type_is_shown(content_type: str, media: str | None) -> None:
    assert media_type(content_type) == media


class _MidStreamFallbackError(Exception):
    """LiteLLM's, in shape: the failure it wraps is `original_exception`, not the cause."""

    def __init__(self, original: Exception) -> None:
        super().__init__("mid-stream failure")
        self.original_exception = original


class TimeoutException(Exception):  # httpx's base class of its timeouts, by name
    pass


class ReadTimeout(TimeoutException):
    pass


class APIConnectionError(Exception):
    pass


def _litellm() -> ModuleType:
    module = ModuleType("litellm")
    module.exceptions = SimpleNamespace(MidStreamFallbackError=_MidStreamFallbackError)  # type: ignore[attr-defined]
    return module


def _wrapped(cause: BaseException) -> _MidStreamFallbackError:
    try:
        raise APIConnectionError("Timeout on reading data from socket") from cause
    except APIConnectionError as exc:
        return _MidStreamFallbackError(exc)


@pytest.mark.parametrize("cause", [ReadTimeout("read"), TimeoutError("socket")], ids=["httpx", "aiohttp"])
def test_a_stall_mid_stream_is_a_timeout(cause: BaseException) -> None:
    for streamed in (True, False):
        error = map_error(_litellm(), _wrapped(cause), streamed=streamed)
        assert (error.code, error.retryable) == ("provider_timeout", True)


def test_a_drop_mid_stream_stays_an_interruption() -> None:
    error = map_error(_litellm(), _wrapped(ConnectionResetError("peer closed")), streamed=True)
    assert (error.code, error.retryable) == ("provider_stream_interrupted", False)


# --- Retry-After ---------------------------------------------------------------------------------------


def test_retry_after_in_seconds_milliseconds_or_as_an_http_date() -> None:
    from email.utils import format_datetime

    from app.llm.provider_errors import retry_after_of

    assert retry_after_of({"Retry-After": "7"}) == 7
    assert retry_after_of({"retry-after": "0.25"}) == 0.25
    assert retry_after_of({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5  # OpenAI's, more precise
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=30)
    found = retry_after_of({"retry-after": format_datetime(later, usegmt=True)})
    assert found is not None and 27 <= found <= 30
    assert retry_after_of({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0  # in the past
    assert retry_after_of({"retry-after": "soon"}) is None
    assert retry_after_of({"retry-after": "nan"}) is None
    assert retry_after_of({"retry-after": "1e308"}) == 24 * 3600
    assert retry_after_of({}) is None


def test_only_waitable_failures_keep_the_retry_after() -> None:
    from app.llm.provider_errors import from_status

    assert from_status(429, "slow down", {"retry-after": "3"}).retry_after == 3
    assert from_status(503, "", {"retry-after": "3"}).retry_after == 3
    assert from_status(400, "bad", {"retry-after": "3"}).retry_after is None
    assert from_status(429, "slow down").retry_after is None
