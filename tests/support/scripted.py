"""A scripted `ModelAdapter` for tests of the agent loop (in the spirit of pydantic-ai's test model).

`ScriptedModel(responses)` answers the n-th `stream()` call with `responses[n]`:

* a sequence of items streamed in order, where an item is a `StreamPart` to yield, a `ProviderError`
  to raise at that point (so `[TextPart("Hi"), ProviderError(...)]` fails after some text), or a
  `Sleep(seconds)` to pause the stream there (`Sleep(math.inf)` hangs until cancelled);
* or a bare `ProviderError`, raised before any part.

`delay` pauses before every part. Every request is recorded with a deep copy of its messages (the agent
keeps appending to the list it passes), and every stream gets a `StreamRecord` telling how far it got
and whether it was closed (its generator's `finally` ran). A call beyond the script fails the test.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import math
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field

from app.llm.types import ModelRequest, ProviderError, StreamPart, TextPart, ToolCallPart

__all__ = ["Response", "ScriptItem", "ScriptedModel", "Sleep", "StreamRecord", "text", "tool_call"]


@dataclass(frozen=True, slots=True)
class Sleep:
    """Pause the stream at this point; `math.inf` waits until the consumer cancels or closes it."""

    seconds: float


ScriptItem = StreamPart | ProviderError | Sleep
Response = Sequence[ScriptItem] | ProviderError


@dataclass
class StreamRecord:
    """What happened to one `stream()` call."""

    request: ModelRequest
    parts_sent: int = 0
    completed: bool = False  # every scripted item was streamed and the generator returned normally
    raised: ProviderError | None = None
    closed: bool = False  # the generator's `finally` ran: exhausted, raised, cancelled or aclose()d
    cancelled: bool = False  # a CancelledError arrived while the stream was waiting


@dataclass
class ScriptedModel:
    responses: Sequence[Response]
    delay: float = 0.0
    requests: list[ModelRequest] = field(default_factory=list, init=False)
    streams: list[StreamRecord] = field(default_factory=list, init=False)
    # Set while a stream is paused (`delay` or `Sleep`), so a test can act at exactly that moment.
    sleeping: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    @property
    def closed(self) -> list[bool]:
        return [record.closed for record in self.streams]

    def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
        index = len(self.requests)
        if index >= len(self.responses):
            raise AssertionError(f"ScriptedModel: unexpected request #{index + 1}, script has {index}")
        snapshot = dataclasses.replace(request, messages=copy.deepcopy(list(request.messages)))
        self.requests.append(snapshot)
        record = StreamRecord(snapshot)
        self.streams.append(record)
        return self._play(self.responses[index], record)

    async def _play(self, response: Response, record: StreamRecord) -> AsyncGenerator[StreamPart, None]:
        try:
            items: Sequence[ScriptItem] = [response] if isinstance(response, ProviderError) else response
            for item in items:
                if isinstance(item, Sleep):
                    await self._sleep(item.seconds, record)
                    continue
                if self.delay:
                    await self._sleep(self.delay, record)
                if isinstance(item, ProviderError):
                    record.raised = item
                    raise item
                yield item
                record.parts_sent += 1
            record.completed = True
        finally:
            record.closed = True

    async def _sleep(self, seconds: float, record: StreamRecord) -> None:
        self.sleeping.set()
        try:
            if math.isinf(seconds):
                await asyncio.Event().wait()
            else:
                await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            record.cancelled = True
            raise
        finally:
            self.sleeping.clear()


def text(*pieces: str) -> list[ScriptItem]:
    """A response made of text pieces only."""
    return [TextPart(piece) for piece in pieces]


def tool_call(index: int, name: str, arguments: str, id: str | None = None) -> ToolCallPart:
    """A complete tool call in one fragment (`id` defaults to `call_<index>`)."""
    return ToolCallPart(index, id if id is not None else f"call_{index}", name, arguments)
