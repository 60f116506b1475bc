"""The LiteLLM stream adapter: any provider LiteLLM knows, read through `litellm.acompletion(stream=True)`.

The call, the iteration and `aclose` run in the LiteLLM child process (litellm_child.py, reached through
litellm_process.py); errors are mapped there too (provider_errors.py `map_error`), and the service's loop
only receives batches of parts. The service's own litellm module only resolves models.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from app.llm.litellm_process import LiteLLMProcess
from app.llm.types import ModelRequest, StreamPart


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
    if key := request.model.configured_key:
        kwargs["api_key"] = key
    return kwargs
