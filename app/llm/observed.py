"""Every model call as the gateway hands it out: observed (a span and timings, observability/hooks.py)
and never without token usage.

A provider that sends no usage chunk (some OpenAI-compatible servers, or one without `include_usage`)
still gets its `token_usage`: the prompt and the completion are estimated (tokens.py), and the usage is
marked `estimated`. A stream closed early (a stop) gets no estimate: it has no usage either way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from app.llm.types import (
    FinishPart,
    ModelAdapter,
    ModelRequest,
    ProviderError,
    StreamPart,
    TextPart,
    ToolCallPart,
    UsagePart,
)
from app.observability.hooks import observe_model_call

# (model, request, the completion's text and tool call fragments) -> (prompt tokens, completion tokens)
Estimator = Callable[[str, ModelRequest, str], tuple[int, int]]


@dataclass(frozen=True, slots=True)
class ObservedAdapter:
    inner: ModelAdapter
    label: str  # the bounded metric label: the model's name when the server knows it, else "other"
    provider: str | None
    estimate: Estimator

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
        model = request.model.name
        with observe_model_call(model, self.label, self.provider, request.messages) as call:
            parts = self.inner.stream(request)
            output: list[str] = []
            usage_seen = False
            try:
                async for part in parts:
                    if isinstance(part, TextPart):  # per chunk: the hook only for the first
                        if not output:
                            call.first_output()
                        output.append(part.text)
                    elif isinstance(part, ToolCallPart):
                        call.first_output()
                        output.append((part.name or "") + part.arguments)
                    elif isinstance(part, UsagePart):
                        usage_seen = True
                        call.usage(part.prompt_tokens, part.completion_tokens, estimated=part.estimated)
                    elif isinstance(part, FinishPart):
                        call.finished(part.reason)
                    yield part
            except (GeneratorExit, asyncio.CancelledError):
                # Closed at a yield (a stop) or cancelled: close the upstream now, and time it.
                stopping = time.monotonic()
                await parts.aclose()
                call.stopped(time.monotonic() - stopping)
                raise
            except ProviderError as exc:
                call.failed(exc.code)
                raise
            except Exception as exc:
                call.failed(type(exc).__name__)
                raise
            await parts.aclose()
            completion = "".join(output)
            call.output_text(completion)
            if not usage_seen:
                prompt_tokens, completion_tokens = self.estimate(model, request, completion)
                call.usage(prompt_tokens, completion_tokens, estimated=True)
                yield UsagePart(
                    prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens,
                    total_tokens=prompt_tokens + completion_tokens,
                    estimated=True,
                )
