"""The provider failures a turn can report: one code each, with a safe message and whether to retry.

Both stream adapters build their `ProviderError`s here, so a failure reads the same whichever adapter met
it. `map_error` turns an exception LiteLLM raised (in the LiteLLM child, or in routing.py's request
mapping) into one; `from_status` classifies an HTTP error answer the way LiteLLM's OpenAI exception
mapping does (`litellm_core_utils/exception_mapping_utils.py`, `_map_openai_exception`: body text first,
then the status). The upstream's own text goes to the log, never into the message.
"""

from __future__ import annotations

import logging
import re
from types import ModuleType

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


def from_status(status: int, body: str) -> ProviderError:
    """An HTTP error answer (status and body text) as LiteLLM's OpenAI mapping and `map_error` see it."""
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
        return provider_error("provider_stream_interrupted", status=status, retryable=not streamed)
    for class_name, code in _BY_CLASS:
        cls = getattr(litellm, class_name, None)
        if cls is not None and isinstance(exc, cls):
            return provider_error(code, status=status)
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
