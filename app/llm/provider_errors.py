"""The provider failures a turn can report: one code each, with a safe message and whether to retry.

Both stream adapters build their `ProviderError`s here, so a failure reads the same whichever adapter met
it. `map_error` turns an exception LiteLLM raised (in the LiteLLM child, or in routing.py's request
mapping) into one; `from_status` classifies an HTTP error answer the way LiteLLM's OpenAI exception
mapping does (`litellm_core_utils/exception_mapping_utils.py`, `_map_openai_exception`: body text first,
then the status). `not_a_stream` and `ended_unfinished` name the answers that are no completion although
their status says success; `hidden_failure` finds them under a LiteLLM stream that ran to its end. The
upstream's own text goes to the log, never into the message.
"""

from __future__ import annotations

import datetime
import email.utils
import logging
import re
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from app.llm.types import ProviderError

log = logging.getLogger(__name__)

_KNOWN: dict[str, tuple[str, bool]] = {
    "context_window_exceeded": ("The conversation no longer fits the model's context window.", False),
    "provider_auth_failed": ("The model provider rejected the credentials (check the API key).", False),
    "provider_rate_limited": ("The model provider is rate limiting requests.", True),
    "provider_model_not_found": ("The model provider does not know this model.", False),
    "provider_bad_request": ("The model provider rejected the request.", False),
    "provider_timeout": ("The model provider did not answer in time.", True),
    "provider_unavailable": ("The model provider is unavailable.", True),
    "provider_auth_missing": (
        "No API key is configured for this model's provider: set it in the server's environment.",
        False,
    ),
    "provider_unreachable": ("The model provider could not be reached.", True),
    "provider_forbidden": ("The model provider refused access.", False),
    # Not retried once the provider has answered; map_error retries it only when acompletion raised it.
    "provider_stream_interrupted": (
        "The model provider's stream broke off before the response was complete.",
        False,
    ),
    # A success status without a completion stream (a proxy's HTML page, an empty body). Retried: nothing
    # of it reached the client, and the proxies, gateways and load balancers that send such answers fail
    # as passingly as with a 502; a base URL that always answers so costs only the retries.
    "provider_bad_response": (
        "The model provider answered with something other than a completion stream.",
        True,
    ),
}

# LiteLLM's ExceptionCheckers.is_error_str_context_window_exceeded, plus the OpenAI error code.
_CONTEXT_MARKERS = (
    "context_length_exceeded",
    "exceed context limit",
    "this model's maximum context length is",
    "model's maximum context limit",
    "is longer than the model's context length",
    "input tokens exceed the configured limit",
    "exceeds the available context size",
    "exceeds the maximum number of tokens allowed",
)
_RATE_LIMIT = re.compile(r"rate[\s_\-]*limit|service tier capacity exceeded|request too large")
_BY_STATUS = {
    400: "provider_bad_request",
    401: "provider_auth_failed",
    403: "provider_forbidden",
    404: "provider_model_not_found",
    408: "provider_timeout",
    422: "provider_bad_request",
    429: "provider_rate_limited",
    503: "provider_unavailable",
    504: "provider_timeout",
}


_MEDIA_TYPE = re.compile(r"[a-z0-9][a-z0-9.+-]{0,40}/[a-z0-9][a-z0-9.+-]{0,40}")
_HTML_TYPES = ("text/html", "application/xhtml+xml")
_EVENT_STREAM = "text/event-stream"


def media_type(content_type: str | None) -> str | None:
    """The Content-Type's media type, lower case, when it is a plain one (safe to show); else None."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media if _MEDIA_TYPE.fullmatch(media) else None


def not_a_stream(
    content_type: str | None, *, empty: bool, html: bool = False, status: int = 200
) -> ProviderError:
    """A success status whose body held no completion stream, said by what it was: empty, HTML (by its
    type, or `html` when its first bytes showed it), another type, or an event stream with no events."""
    media = media_type(content_type)
    if empty:
        what = "an empty body"
    elif html or media in _HTML_TYPES:
        what = f"HTML ({media})" if media else "HTML"
    elif media == _EVENT_STREAM:
        return ProviderError(
            "provider_bad_response",
            "The model provider's event stream held no completion events.",
            status=status,
            retryable=True,
        )
    elif media:
        what = media
    else:
        what = "an unusual content type" if content_type else "a body without a content type"
    return ProviderError(
        "provider_bad_response",
        f"The model provider answered with {what}, not a completion stream.",
        status=status,
        retryable=True,
    )


def ended_unfinished() -> ProviderError:
    """A stream whose body ended as a complete one does, but with neither a finish_reason nor [DONE]: the
    provider stopped short, like a stream cut off (not retried once it answered)."""
    return ProviderError(
        "provider_stream_interrupted",
        "The model provider's stream ended before the provider finished the response.",
        retryable=False,
    )


def provider_error(code: str, *, status: int | None = None, retryable: bool | None = None) -> ProviderError:
    message, default_retry = _KNOWN[code]
    return ProviderError(
        code, message, status=status, retryable=default_retry if retryable is None else retryable
    )


def server_failed(status: int) -> ProviderError:
    return ProviderError(
        "provider_error", f"The model provider failed (HTTP {status}).", status=status, retryable=True
    )


def call_failed(status: int | None = None) -> ProviderError:
    return ProviderError("provider_error", "The model call failed.", status=status)


def from_status(status: int, body: str, headers: Mapping[str, str] | None = None) -> ProviderError:
    """An HTTP error answer (status, body text, headers) as LiteLLM's OpenAI mapping and `map_error` see
    it; a rate limit or an unavailable provider keeps the wait its headers ask for (`retry_after`)."""
    error = _from_status(status, body)
    if headers is not None and error.code in _WAITABLE:
        error.retry_after = retry_after_of(headers)
    return error


# The failures a provider may ask us to wait out.
_WAITABLE = frozenset({"provider_rate_limited", "provider_unavailable"})
# Longest wait read from a header: a provider's "come back tomorrow" is not a retry.
_MAX_RETRY_AFTER = 24 * 3600.0


def retry_after_of(headers: Mapping[str, str]) -> float | None:
    """The wait a provider asks for: `retry-after-ms` (OpenAI's, milliseconds), else `retry-after` in
    seconds or as an HTTP date; None when absent or unreadable."""
    lowered = {key.lower(): value for key, value in headers.items()}
    try:
        if (ms := lowered.get("retry-after-ms")) is not None:
            return _bounded(float(ms) / 1000)
        value = lowered.get("retry-after")
        if value is None:
            return None
        try:
            return _bounded(float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            if when.tzinfo is None:
                when = when.replace(tzinfo=datetime.UTC)
            return _bounded((when - datetime.datetime.now(datetime.UTC)).total_seconds())
    except (ValueError, TypeError, OverflowError):
        return None


def _bounded(seconds: float) -> float | None:
    if seconds != seconds:  # NaN
        return None
    return round(min(max(seconds, 0.0), _MAX_RETRY_AFTER), 3)


def _from_status(status: int, body: str) -> ProviderError:
    lowered = body.lower()
    if status == 429 or _RATE_LIMIT.search(lowered):
        return provider_error("provider_rate_limited", status=status)
    if any(marker in lowered for marker in _CONTEXT_MARKERS):
        return provider_error("context_window_exceeded", status=status)
    if "invalid_request_error" in body and "model_not_found" in body:
        return provider_error("provider_model_not_found", status=status)
    if "a timeout occurred" in lowered:
        return provider_error("provider_timeout", status=status)
    if "invalid_request_error" in body and "Incorrect API key provided" not in body:
        return provider_error("provider_bad_request", status=status)
    if "the server had an error processing your request." in lowered:
        return server_failed(500)
    code = _BY_STATUS.get(status)
    if code is not None:
        return provider_error(code, status=status)
    return server_failed(status) if status >= 500 else call_failed(status)


# ContextWindowExceededError subclasses BadRequestError: it comes first.
_BY_CLASS = (
    ("ContextWindowExceededError", "context_window_exceeded"),
    ("AuthenticationError", "provider_auth_failed"),
    ("RateLimitError", "provider_rate_limited"),
    ("NotFoundError", "provider_model_not_found"),
    ("BadRequestError", "provider_bad_request"),
    ("Timeout", "provider_timeout"),
    ("ServiceUnavailableError", "provider_unavailable"),
)


def map_error(litellm: ModuleType, exc: Exception, *, streamed: bool) -> ProviderError:
    """Turns LiteLLM's exception zoo (notes §6) into one error with a safe message and a stable code."""
    log.warning("provider call failed: %s: %s", type(exc).__name__, exc)
    status = getattr(exc, "status_code", None)
    mid_stream = getattr(getattr(litellm, "exceptions", None), "MidStreamFallbackError", None)
    if streamed or (mid_stream is not None and isinstance(exc, mid_stream)):
        if _timed_out(exc):  # a stall mid-stream: no byte for `timeout` s, as before the headers
            return provider_error("provider_timeout", status=status)
        return provider_error("provider_stream_interrupted", status=status, retryable=not streamed)
    for class_name, code in _BY_CLASS:
        cls = getattr(litellm, class_name, None)
        if cls is not None and isinstance(exc, cls):
            error = provider_error(code, status=status)
            # The upstream's own headers (LiteLLM keeps them apart from its exception's `response`).
            headers = getattr(exc, "litellm_response_headers", None)
            if code in _WAITABLE and isinstance(headers, Mapping):
                error.retry_after = retry_after_of(headers)
            return error
    text = str(exc)
    if "Missing credentials" in text or "api_key client option must be set" in text:
        return provider_error("provider_auth_missing", status=status)
    if "Connection error" in text or "Connect" in type(exc).__name__:
        return provider_error("provider_unreachable", status=status)
    if isinstance(status, int) and status >= 500:
        return server_failed(status)
    if isinstance(status, int) and status == 403:
        return provider_error("provider_forbidden", status=status)
    return call_failed(status)


def hidden_failure(stream: Any, model: object) -> ProviderError | None:
    """The failure a LiteLLM stream that ran to its end hid, if any. LiteLLM ends every stream with a
    finish chunk of its own ("stop" when the upstream sent none), so an answer that held no completion
    stream (an HTML page, an empty body) or a stream that stopped short reads as complete; its stream
    wrapper still knows whether any chunk came (`sent_first_chunk`) and whether the upstream sent a
    finish_reason. Judged only for streams the openai SDK read (OpenAI-compatible upstreams, whose chunks
    always carry a finish_reason); the providers LiteLLM parses its own ways are taken as they were.
    ([DONE] is not seen here: the SDK consumes it.)"""
    http = _openai_http_response(stream)
    try:
        finished = stream.received_finish_reason or stream.intermittent_finish_reason
        started = stream.sent_first_chunk
    except AttributeError:  # a LiteLLM whose wrapper no longer says: the stream is taken as it was
        return None
    if http is None or finished:
        return None
    content_type = http.headers.get("content-type")
    received = getattr(http, "num_bytes_downloaded", None)
    if not started:
        log.warning(
            "the provider answered HTTP %s with %s (%s bytes) for %s, not a completion stream",
            http.status_code,
            content_type or "no content type",
            received,
            model,
        )
        return not_a_stream(content_type, empty=received == 0, status=http.status_code)
    log.warning(
        "the stream of %s ended with neither a finish_reason nor [DONE] (HTTP %s, %s, %s bytes)",
        model,
        http.status_code,
        content_type,
        received,
    )
    return ended_unfinished()


def _openai_http_response(stream: Any) -> Any:
    """The HTTP response under a LiteLLM stream the openai SDK reads, else None."""
    sdk_stream = getattr(stream, "completion_stream", None)
    if type(sdk_stream).__module__.partition(".")[0] != "openai":  # openai.AsyncStream says "openai"
        return None
    http = getattr(sdk_stream, "response", None)
    return http if hasattr(http, "headers") and hasattr(http, "status_code") else None


# A transport's read timeout, by the names of its classes: httpx's (TimeoutException), LiteLLM's and the
# openai SDK's; asyncio's and aiohttp's are TimeoutErrors.
_TIMEOUT_CLASSES = frozenset({"TimeoutException", "Timeout", "APITimeoutError"})


def _timed_out(exc: BaseException) -> bool:
    """Whether a read that timed out lies under `exc`. LiteLLM reports a stall mid-stream as a
    MidStreamFallbackError around an APIConnectionError (its `original_exception`) around the transport's
    timeout (httpx.ReadTimeout, from aiohttp's SocketTimeoutError), the same wrapping as a dropped
    connection: only the chain tells them apart."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, TimeoutError) or any(
            k.__name__ in _TIMEOUT_CLASSES for k in type(cause).__mro__
        ):
            return True
        original = getattr(cause, "original_exception", None)
        cause = original if isinstance(original, BaseException) else (cause.__cause__ or cause.__context__)
    return False
