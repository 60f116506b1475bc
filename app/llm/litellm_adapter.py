"""The LiteLLM stream adapter: any provider LiteLLM knows, read through `litellm.acompletion(stream=True)`.

The call, the iteration and `aclose` run on the `LiteLLMWorker`'s loop (see litellm_worker.py); errors are
mapped there too, and the consumer's loop only receives batches of parts.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncGenerator
from types import ModuleType
from typing import Any

from app.llm.litellm_worker import LiteLLMWorker, PartChannel
from app.llm.provider_errors import call_failed, provider_error, server_failed
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

_WARM_UP_SECONDS = 2.0


class LiteLLMAdapter:
    def __init__(self, litellm: ModuleType, worker: LiteLLMWorker) -> None:
        self._litellm = litellm
        self._worker = worker

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
        channel = PartChannel(asyncio.get_running_loop())
        running = self._worker.submit(self._pump(_arguments(request), channel))
        try:
            while True:
                parts, ended, error = await channel.take()
                for part in parts:
                    yield part
                if ended:
                    if error is not None:
                        raise error
                    return
        finally:
            # Cancels the task on the worker's loop: its `finally` closes the upstream response there.
            running.cancel()

    async def warm_up(self) -> None:
        """One call through LiteLLM's OpenAI path, on the worker's loop, against a local port nobody
        listens on: it fails at once, after LiteLLM has imported and built what it otherwise builds on
        the first real call (~450 modules, ~45k lasting objects, ~0.4 s, measured). The model layer then
        freezes those objects with the rest of the import, out of every later full collection."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        kwargs = {
            "model": "openai/parley-warm-up",
            "messages": [{"role": "user", "content": "."}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_retries": 0,
            "timeout": _WARM_UP_SECONDS,
            "api_base": f"http://127.0.0.1:{port}/v1",
            "api_key": PLACEHOLDER_KEY,
        }

        async def call() -> None:
            try:
                response = await self._litellm.acompletion(**kwargs)
                try:
                    async for _ in response:
                        pass
                finally:
                    await response.aclose()
            except Exception as exc:  # refused, as intended (anything else only means a colder first call)
                log.debug("LiteLLM warm-up call ended: %s", type(exc).__name__)

        await asyncio.wait_for(asyncio.wrap_future(self._worker.submit(call())), _WARM_UP_SECONDS * 2)

    async def _pump(self, kwargs: dict[str, Any], channel: PartChannel) -> None:
        """Runs on the worker's loop: the whole LiteLLM call, its parts sent over in batches."""
        litellm = self._litellm
        error: ProviderError | None = provider_error("provider_stream_interrupted")
        try:
            try:
                response = await litellm.acompletion(**kwargs)
            except Exception as exc:
                error = map_error(litellm, exc, streamed=False)
                return
            kept = getattr(response, "chunks", None)
            try:
                async for chunk in response:
                    parts = _parts(chunk)
                    if parts:
                        channel.put(parts)
                    if type(kept) is list and len(kept) >= TRIM_AT:
                        trim_kept_chunks(kept)
                error = None
            except Exception as exc:
                error = map_error(litellm, exc, streamed=True)
            finally:
                # Without aclose a cancelled or abandoned stream keeps the upstream request open (notes §4).
                await response.aclose()
        finally:
            # Also when cancelled or shut down: the consumer must never wait for a stream that is gone.
            channel.end(error)


# LiteLLM's stream wrapper keeps every chunk it returned (`CustomStreamWrapper.chunks`, ~4 KB and a dozen
# objects each) only to rebuild the whole response when the stream ends: for the usage (read from the
# chunks that carry one), for its logging callbacks (none here) and to compare the last two chunks
# (its repetition check). Kept whole, that list grows for the stream's life, the rebuild at the end takes
# ~110 ms per 1,000 chunks, and at 100 streams the collector walks hundreds of thousands of live objects
# (full collections of 200-400 ms were measured, stopping both loops). Trimmed to the chunks with usage
# plus the last two, usage and the checks come out the same (tests/api/test_providers.py) at a constant
# cost.
TRIM_AT = 64
_LAST_KEPT = 2


def trim_kept_chunks(chunks: list[Any]) -> None:
    """Keeps the chunks that carry usage, in order, and the last two; drops the rest, in place."""
    older = chunks[:-_LAST_KEPT]
    chunks[:] = [*(c for c in older if getattr(c, "usage", None) is not None), *chunks[-_LAST_KEPT:]]


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
