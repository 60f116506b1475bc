"""The LiteLLM stream adapter: any provider LiteLLM knows, read through `litellm.acompletion(stream=True)`.

The call, the iteration and `aclose` run in the LiteLLM child process (litellm_child.py, reached through
litellm_process.py); errors are mapped there too (`map_error`, also used by routing.py here), and the
service's loop only receives batches of parts. The service's own litellm module only resolves models.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from types import ModuleType
from typing import TYPE_CHECKING, Any

from app.llm.provider_errors import call_failed, provider_error, server_failed
from app.llm.types import ModelRequest, ProviderError, StreamPart

if TYPE_CHECKING:
    from app.llm.litellm_process import LiteLLMProcess

log = logging.getLogger(__name__)


class LiteLLMAdapter:
    def __init__(self, process: LiteLLMProcess) -> None:
        self._process = process

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
        link = await self._process.link()
        stream_id, channel = link.open(_arguments(request))
        try:
            while True:
                for part in await channel.take():
                    yield part
                if channel.ended and not channel.parts:
                    if channel.error is not None:
                        raise channel.error
                    return
        finally:
            # Closed before its end (a stop, an error here): the child cancels the call, whose aclose
            # closes the upstream connection. Nothing here waits for that.
            if not channel.ended:
                link.cancel(stream_id)


def _arguments(request: ModelRequest) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "model": request.model.name,
        "messages": list(request.messages),
        "stream": True,
        # A custom api_base gets no usage chunk unless asked for explicitly (notes §1).
        "stream_options": {"include_usage": True},
        # Retries belong to the agent, which knows whether output already reached clients.
        "max_retries": 0,
        "timeout": request.timeout,
    }
    if request.tools:
        kwargs["tools"] = list(request.tools)
    if request.model.api_base:
        kwargs["api_base"] = request.model.api_base
        # Local servers (vLLM, Ollama) take no key, but the openai client refuses to send none.
        kwargs["api_key"] = request.model.api_key or PLACEHOLDER_KEY
    elif request.model.api_key:
        kwargs["api_key"] = request.model.api_key
    return kwargs


PLACEHOLDER_KEY = "no-key"


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
