"""The agent loop: model stream → tool calls → results → next model call, as a stream of agent events.

It touches neither the database nor HTTP: it reads a model through a ModelAdapter, runs tools through the
registry, keeps the LLM history of the running turn in memory, and yields what happened. The recorder
turns those events into chat_messages and wire events.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any

from app.llm import tokens
from app.llm.types import (
    FinishPart,
    ModelAdapter,
    ModelRequest,
    ProviderError,
    ReasoningPart,
    ResolvedModel,
    TextPart,
    ToolCallPart,
    UsagePart,
)
from app.observability.hooks import observe_tool
from app.tools.registry import ToolContext, ToolOutcome, ToolRegistry
from app.turns.agent_events import (
    AgentEvent,
    BreakpointReached,
    CallRequest,
    ReasoningChunk,
    ResponseFinished,
    ResponseStarted,
    TextChunk,
    ToolFinished,
    ToolStarted,
    arguments_text,
)
from app.turns.context.compactor import Compactor, ContextCompacted
from app.turns.context.planner import View
from app.turns.pending_calls import Inbox
from app.turns.rounds import ResumedRound, ToolRound, WaitRules

# The loop's events live in turns.agent_events (turns.rounds yields them too); named here for its users.
__all__ = [
    "AgentError",
    "AgentEvent",
    "AgentRun",
    "BreakpointReached",
    "CallRequest",
    "ContextCompacted",
    "ReasoningChunk",
    "ResponseFinished",
    "ResponseStarted",
    "TextChunk",
    "ToolFinished",
    "ToolStarted",
    "arguments_text",
]


class AgentError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class AgentRun:
    adapter: ModelAdapter
    model: ResolvedModel
    tools: ToolRegistry
    tool_names: Sequence[str]
    messages: list[dict[str, Any]]
    session_id: str
    turn_id: str
    max_rounds: int = 25
    tool_timeout: float = 30.0
    provider_timeout: float = 120.0
    retries: int = 2
    retry_backoff: float = 0.5
    # A provider's Retry-After up to this is waited out before the retry; a longer one fails the call.
    retry_max_wait: float = 10.0
    should_pause: Callable[[], bool] = field(default=lambda: False)
    # Client tools in OpenAI "tools" format, the calls that wait (and how long), and where answers come.
    client_tools: list[dict[str, Any]] = field(default_factory=list)
    wait_rules: WaitRules = field(default_factory=WaitRules)
    inbox: Inbox | None = None
    # A round suspended before a restart, continued first (its assistant message is in `messages`).
    resume: ResumedRound | None = None
    # What each call sends when the history outgrows the window (turns.context); None: the whole history.
    compactor: Compactor | None = None

    async def run(self) -> AsyncGenerator[AgentEvent, None]:  # noqa: C901 (the call inline: chunks pass here)
        schemas = [*self.tools.schemas(self.tool_names), *self.client_tools]
        if self.resume is not None:
            plan, self.resume = self.resume, None
            async with aclosing(self._run_tools(plan.calls, plan)) as running:
                async for event in running:
                    yield event
            if self.should_pause():
                yield BreakpointReached()
                return
        overhead = tokens.text_tokens(json.dumps(schemas)) if schemas else 0
        for _ in range(self.max_rounds):
            finished: ResponseFinished | None = None
            # One model call, of the view the compactor chooses; refused for the window (the provider
            # counts otherwise than the estimate), it is compacted harder and made once more. Inline, not
            # a generator of its own: every streamed chunk passes through here, and a layer costs each.
            harder = streamed = False
            while True:
                sent, announced = await self._view(overhead, harder)
                for item in announced:
                    yield item
                yield ResponseStarted()
                try:
                    # aclosing: when the consumer closes this generator at a yield, the inner generators
                    # (the provider stream, the running tools) must close now, not at the next collection.
                    async with aclosing(self._respond(schemas, sent)) as responding:
                        async for event in responding:
                            if isinstance(event, ResponseFinished):
                                event = finished = self._calibrated(event)
                            elif not streamed:
                                streamed = isinstance(event, (TextChunk, ReasoningChunk))
                            yield event
                    break
                except ProviderError as exc:
                    refused = exc.code == "context_window_exceeded" and not streamed
                    if not refused or self.compactor is None or harder:
                        raise
                    harder = True
            assert finished is not None
            self.messages.append(_assistant_message(finished))
            if not finished.calls:
                return
            async with aclosing(self._run_tools(finished.calls)) as running:
                async for event in running:
                    yield event
            if self.should_pause():
                yield BreakpointReached()
                return
        raise AgentError(
            "max_tool_rounds",
            f"The agent stopped after {self.max_rounds} model calls without a final answer.",
        )

    async def _view(self, overhead: int, harder: bool) -> tuple[list[dict[str, Any]], list[AgentEvent]]:
        """What the next call sends (the compactor's view, else the whole history) and what announces it
        (the compactor's events come all at once, after any summary is written, just before its view)."""
        if self.compactor is None:
            return self.messages, []
        sent = self.messages
        announced: list[AgentEvent] = []
        views = self.compactor.view(self.messages, overhead=overhead, harder=harder)
        async with aclosing(views):
            async for item in views:
                if isinstance(item, View):
                    sent = item.messages
                else:
                    announced.append(item)
        return sent, announced

    def _calibrated(self, finished: ResponseFinished) -> ResponseFinished:
        """The response with the calibration its reported prompt count gives (kept by the recorder)."""
        usage = finished.usage
        if self.compactor is None or usage is None or usage.estimated:
            return finished
        scale = self.compactor.calibrate(usage.prompt_tokens)
        return replace(finished, context_scale=scale) if scale is not None else finished

    async def _respond(
        self, schemas: list[dict[str, Any]], messages: list[dict[str, Any]]
    ) -> AsyncGenerator[AgentEvent, None]:
        request = ModelRequest(self.model, messages, schemas, self.provider_timeout)
        attempt = 0
        while True:
            started = time.monotonic()
            first: float | None = None
            text: list[str] = []
            reasoning = Reasoning()
            calls: dict[int, list[str | None]] = {}
            finish: str | None = None
            usage: UsagePart | None = None
            try:
                async with aclosing(self.adapter.stream(request)) as stream:
                    async for part in stream:
                        if first is None and isinstance(part, TextPart | ToolCallPart):
                            first = time.monotonic()
                        if isinstance(part, TextPart):
                            text.append(part.text)
                            yield TextChunk(part.text)
                        elif isinstance(part, ReasoningPart):
                            reasoning.add(part, started)
                            if part.text:
                                yield ReasoningChunk(part.text)
                        elif isinstance(part, ToolCallPart):
                            entry = calls.setdefault(part.index, [None, None, ""])
                            entry[0] = entry[0] or part.id
                            entry[1] = entry[1] or part.name
                            entry[2] = (entry[2] or "") + part.arguments
                        elif isinstance(part, FinishPart):
                            finish = part.reason or finish
                        elif isinstance(part, UsagePart):
                            usage = part
            except ProviderError as exc:
                # Retry only while nothing reached the client: a retried call after visible text would
                # show the user two different beginnings.
                wait = None if text or reasoning.text else self._retry_wait(exc, attempt)
                if wait is None:
                    raise
                await asyncio.sleep(wait)  # a stop cancels the turn's task, and with it this wait
                attempt += 1
                continue
            break
        yield ResponseFinished(
            text="".join(text),
            calls=_requests(calls),
            finish_reason=finish,
            usage=usage,
            duration_ms=round((time.monotonic() - started) * 1000),
            first_token_ms=None if first is None else round((first - started) * 1000),
            reasoning="".join(reasoning.text),
            reasoning_ms=reasoning.duration_ms,
            thinking_blocks=reasoning.blocks(),
        )

    def _retry_wait(self, exc: ProviderError, attempt: int) -> float | None:
        """Seconds before retrying a call that failed before any output; None: no retry. A provider's
        Retry-After longer than retry_max_wait fails at once (the client learns when to come back)."""
        if not exc.retryable or attempt >= self.retries:
            return None
        wait: float = self.retry_backoff * 2**attempt
        asked: float | None = exc.retry_after
        if asked is None:
            return wait
        return max(wait, asked) if asked <= self.retry_max_wait else None

    async def _run_tools(
        self, calls: list[CallRequest], resumed: ResumedRound | None = None
    ) -> AsyncGenerator[AgentEvent, None]:
        """Runs (or waits for) the response's calls; results enter the history in call order."""
        round_ = ToolRound(
            self.wait_rules, self.inbox, self._execute, self._needs_approval, self.tools.source_of
        )
        running = round_.resume(resumed) if resumed is not None else round_.run(calls)
        async with aclosing(running):
            async for event in running:
                yield event
        assistant = self.messages[-1]
        for tool_call in assistant.get("tool_calls", []):
            if tool_call["id"] in round_.edited:
                tool_call["function"]["arguments"] = round_.edited[tool_call["id"]]
        for call in calls:
            self.messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": round_.outcomes[call.id].content}
            )

    def _needs_approval(self, name: str) -> bool:
        """Decided from the tool the call resolves to in the session's selection, by the registry that
        also holds the rule where the tool runs (`_execute`)."""
        return self.tools.requires_approval(
            name, allowed=self.tool_names, session_rule=self.wait_rules.approval
        )

    async def _execute(self, call: CallRequest, approved: bool) -> tuple[CallRequest, ToolOutcome, int]:
        started = time.monotonic()
        ctx = ToolContext(session_id=self.session_id, turn_id=self.turn_id, tool_call_id=call.id)
        # A name the model made up is not a label: metrics keep a bounded set of tools.
        known = call.name in self.tool_names and self.tools.get(call.name) is not None
        tool = call.name if known else "unknown"
        with observe_tool(tool, self.tools.source(tool), call.id) as observed:
            outcome = await self.tools.execute(
                call.name,
                call.arguments_text,
                ctx,
                default_timeout=self.tool_timeout,
                allowed=self.tool_names,
                session_rule=self.wait_rules.approval,
                approved=approved,
            )
            observed.outcome = "error" if outcome.is_error else "ok"
        return call, outcome, round((time.monotonic() - started) * 1000)


def _requests(calls: dict[int, list[str | None]]) -> list[CallRequest]:
    requests: list[CallRequest] = []
    seen: set[str] = set()
    for _, entry in sorted(calls.items()):
        # A missing or repeated id would give a result no call (or two calls one result).
        call_id = entry[0] if entry[0] and entry[0] not in seen else "call_" + secrets.token_hex(8)
        seen.add(call_id)
        requests.append(CallRequest(id=call_id, name=entry[1] or "", arguments_text=entry[2] or ""))
    return requests


class Reasoning:
    """A response's reasoning as it streams: its text, when it ended, and the signed or redacted blocks
    the provider wants back (a thinking block closes with its signature)."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.duration_ms: int | None = None
        self._blocks: list[dict[str, Any]] = []
        self._open: list[str] = []

    def add(self, part: ReasoningPart, started: float) -> None:
        self.duration_ms = round((time.monotonic() - started) * 1000)
        if part.text:
            self.text.append(part.text)
            self._open.append(part.text)
        if part.signature:
            self._blocks.append(
                {"type": "thinking", "thinking": "".join(self._open), "signature": part.signature}
            )
            self._open = []
        if part.redacted:
            self._blocks.append({"type": "redacted_thinking", "data": part.redacted})

    def blocks(self) -> list[dict[str, Any]]:
        return list(self._blocks)


def _assistant_message(finished: ResponseFinished) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": finished.text or None}
    if finished.thinking_blocks:
        message["thinking_blocks"] = list(finished.thinking_blocks)
    if finished.calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": arguments_text(call.arguments)},
            }
            for call in finished.calls
        ]
    return message
