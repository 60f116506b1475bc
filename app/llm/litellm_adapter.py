"""The LiteLLM stream adapter: any provider LiteLLM knows, read through `litellm.acompletion(stream=True)`."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from types import ModuleType
from typing import Any

from app.llm.types import (
    FinishPart,
    ModelRequest,
    ProviderError,
    StreamPart,
    TextPart,
    ToolCallPart,
    UsagePart,
)

log = logging.getLogger(__name__)


class LiteLLMAdapter:
    def __init__(self, litellm: ModuleType) -> None:
        self._litellm = litellm

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
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
            kwargs["api_key"] = request.model.api_key or "no-key"
        elif request.model.api_key:
            kwargs["api_key"] = request.model.api_key
        try:
            response = await self._litellm.acompletion(**kwargs)
        except Exception as exc:
            raise map_error(self._litellm, exc, streamed=False) from exc
        try:
            async for chunk in response:
                for part in _parts(chunk):
                    yield part
        except Exception as exc:
            raise map_error(self._litellm, exc, streamed=True) from exc
        finally:
            # Without aclose a cancelled or abandoned stream keeps the upstream request open (notes §4).
            await response.aclose()


def _parts(chunk: Any) -> list[StreamPart]:
    parts: list[StreamPart] = []
    choices = chunk.choices
    if choices:
        choice = choices[0]
        delta = choice.delta
        if delta is not None:
            if delta.content:
                parts.append(TextPart(delta.content))
            for tc in delta.tool_calls or ():
                fn = tc.function
                parts.append(
                    ToolCallPart(
                        index=tc.index or 0,
                        id=tc.id,
                        name=fn.name if fn is not None else None,
                        arguments=(fn.arguments or "") if fn is not None else "",
                    )
                )
        if choice.finish_reason:
            parts.append(FinishPart(choice.finish_reason))
    usage = getattr(chunk, "usage", None)
    if usage is not None:
        parts.append(
            UsagePart(
                prompt_tokens=int(usage.prompt_tokens or 0),
                completion_tokens=int(usage.completion_tokens or 0),
                total_tokens=int(usage.total_tokens or 0),
            )
        )
    return parts


def map_error(litellm: ModuleType, exc: Exception, *, streamed: bool) -> ProviderError:
    """Turns LiteLLM's exception zoo (notes §6) into one error with a safe message and a stable code."""
    log.warning("provider call failed: %s: %s", type(exc).__name__, exc)
    status = getattr(exc, "status_code", None)
    mid_stream = getattr(getattr(litellm, "exceptions", None), "MidStreamFallbackError", None)
    if streamed or (mid_stream is not None and isinstance(exc, mid_stream)):
        return ProviderError(
            "provider_stream_interrupted",
            "The model provider's stream broke off before the response was complete.",
            status=status,
            retryable=not streamed,
        )
    # ContextWindowExceededError subclasses BadRequestError: test it first.
    table: list[tuple[str, str, str, bool]] = [
        (
            "ContextWindowExceededError",
            "context_window_exceeded",
            "The conversation no longer fits the model's context window.",
            False,
        ),
        (
            "AuthenticationError",
            "provider_auth_failed",
            "The model provider rejected the credentials (check the API key).",
            False,
        ),
        ("RateLimitError", "provider_rate_limited", "The model provider is rate limiting requests.", True),
        ("NotFoundError", "provider_model_not_found", "The model provider does not know this model.", False),
        ("BadRequestError", "provider_bad_request", "The model provider rejected the request.", False),
        ("Timeout", "provider_timeout", "The model provider did not answer in time.", True),
        ("ServiceUnavailableError", "provider_unavailable", "The model provider is unavailable.", True),
    ]
    for class_name, code, message, retryable in table:
        cls = getattr(litellm, class_name, None)
        if cls is not None and isinstance(exc, cls):
            return ProviderError(code, message, status=status, retryable=retryable)
    text = str(exc)
    if "Missing credentials" in text or "api_key client option must be set" in text:
        return ProviderError(
            "provider_auth_missing",
            "No API key is configured for this model's provider: set it in the server's environment.",
            status=status,
        )
    if "Connection error" in text or "Connect" in type(exc).__name__:
        return ProviderError(
            "provider_unreachable", "The model provider could not be reached.", status=status, retryable=True
        )
    if isinstance(status, int) and status >= 500:
        return ProviderError(
            "provider_error", f"The model provider failed (HTTP {status}).", status=status, retryable=True
        )
    if isinstance(status, int) and status == 403:
        return ProviderError("provider_forbidden", "The model provider refused access.", status=status)
    return ProviderError("provider_error", "The model call failed.", status=status)
