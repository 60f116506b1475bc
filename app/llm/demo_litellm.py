"""The demo model registered with LiteLLM: its context window for `get_model_info`, and a custom provider.

The service streams "parley/demo" through `DemoAdapter` (demo.py). The custom provider serves the same
parts through `litellm.acompletion`, for `PARLEY_STREAM_ADAPTER=litellm` (comparison runs) and for tests
of LiteLLM's own stream path. Import this module only after LITELLM_LOCAL_MODEL_COST_MAP=True is set:
importing litellm otherwise fetches the cost map over the network.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TypedDict

import litellm

from app.llm.demo import (
    DEFAULT_TOKEN_DELAY,
    DEMO_CONTEXT_WINDOW,
    DEMO_MAX_OUTPUT_TOKENS,
    DEMO_MODEL,
    PROVIDER,
    demo_completion,
    demo_parts,
)
from app.llm.types import FinishPart, TextPart, ToolCallPart, UsagePart


class DemoChunk(TypedDict):
    """The keys of litellm's `GenericStreamingChunk` (mypy sees litellm as Any, hence this mirror)."""

    text: str
    tool_use: dict[str, object] | None
    is_finished: bool
    finish_reason: str
    usage: dict[str, int] | None
    index: int


def _chunk(text: str = "", tool_use: dict[str, object] | None = None) -> DemoChunk:
    return {
        "text": text,
        "tool_use": tool_use,
        "is_finished": False,
        "finish_reason": "",
        "usage": None,
        "index": 0,
    }


def _usage(part: UsagePart) -> dict[str, int]:
    return {
        "prompt_tokens": part.prompt_tokens,
        "completion_tokens": part.completion_tokens,
        "total_tokens": part.total_tokens,
    }


class DemoLLM(litellm.CustomLLM):  # type: ignore[misc]  # litellm is untyped (Any) for mypy
    """The handler behind "parley/...". litellm strips the provider prefix: `model` arrives as "demo"."""

    def __init__(self, token_delay: float = DEFAULT_TOKEN_DELAY) -> None:
        super().__init__()
        self.token_delay = token_delay

    # litellm calls handlers with keyword arguments only (main.py `_complete_custom_providers`), so the
    # dozen unused ones (api_base, api_key, logging_obj, timeout, ...) are absorbed by **_unused.
    async def astreaming(
        self,
        *,
        messages: Sequence[Mapping[str, object]],
        optional_params: Mapping[str, object],
        **_unused: object,
    ) -> AsyncIterator[DemoChunk]:
        finish, usage = "stop", None
        async for part in demo_parts(messages, optional_params.get("tools"), self.token_delay):
            if isinstance(part, TextPart):
                yield _chunk(text=part.text)
            elif isinstance(part, ToolCallPart):
                function = {"name": part.name, "arguments": part.arguments}
                yield _chunk(
                    tool_use={"id": part.id, "type": "function", "index": part.index, "function": function}
                )
            elif isinstance(part, FinishPart):
                finish = part.reason or finish
            elif isinstance(part, UsagePart):
                usage = _usage(part)
        yield {**_chunk(), "is_finished": True, "finish_reason": finish, "usage": usage}

    async def acompletion(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, object]],
        optional_params: Mapping[str, object],
        **_unused: object,
    ) -> litellm.ModelResponse:
        message, finish, usage = demo_completion(messages, optional_params.get("tools"))
        return litellm.ModelResponse(
            model=model,
            choices=[{"index": 0, "finish_reason": finish, "message": message}],
            usage=_usage(usage),
        )


def register_demo(token_delay: float = DEFAULT_TOKEN_DELAY) -> None:
    """Make "parley/demo" callable through litellm and known to `get_model_info`. Idempotent.

    Mutates litellm's process-global state: call once at startup, never per request.
    """
    others = [item for item in litellm.custom_provider_map if item.get("provider") != PROVIDER]
    litellm.custom_provider_map = [*others, {"provider": PROVIDER, "custom_handler": DemoLLM(token_delay)}]
    # acompletion re-reads the map on every call (utils.function_setup -> custom_llm_setup), but until
    # then "parley" is not in litellm.provider_list, so get_llm_provider("parley/demo") would fail.
    litellm.utils.custom_llm_setup()
    litellm.register_model(
        {
            DEMO_MODEL: {
                "max_input_tokens": DEMO_CONTEXT_WINDOW,
                "max_output_tokens": DEMO_MAX_OUTPUT_TOKENS,
                "max_tokens": DEMO_MAX_OUTPUT_TOKENS,
                "litellm_provider": PROVIDER,
                "mode": "chat",
                "supports_function_calling": True,
                "supports_parallel_function_calling": True,
                "input_cost_per_token": 0.0,
                "output_cost_per_token": 0.0,
                # Without the cache prices, register_model logs a WARNING for a model with custom pricing.
                "cache_creation_input_token_cost": 0.0,
                "cache_read_input_token_cost": 0.0,
            }
        }
    )
