"""What the agent loop says happened: its events (the recorder turns them into rows and wire events) and
the tool calls a model response asks for. Plain data, shared by the loop (turns.agent, turns.rounds)
and the recorder."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from app.llm.types import UsagePart
from app.protocol.tool_requests import Resolution
from app.tools.registry import ToolOutcome
from app.turns.context.compactor import ContextCompacted
from app.turns.pending_calls import Answer, Kind, Submission, Waiting


def arguments_text(arguments: Any) -> str:
    """Tool call arguments as the chat format carries them: a JSON object's text, or the raw text."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class CallRequest:
    id: str
    name: str
    arguments_text: str

    @property
    def arguments(self) -> Any:
        """The JSON object the model sent, else its raw text, so the history repeats it as written."""
        if not self.arguments_text.strip():
            return {}
        try:
            parsed = json.loads(self.arguments_text)
        except (ValueError, RecursionError):
            return self.arguments_text
        return parsed if isinstance(parsed, dict) else self.arguments_text


@dataclass(frozen=True, slots=True)
class ResponseStarted:
    pass


@dataclass(frozen=True, slots=True)
class TextChunk:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningChunk:
    """A piece of the reasoning the model streams before its answer (shown, docs/events.md)."""

    text: str


@dataclass(frozen=True, slots=True)
class ResponseFinished:
    text: str
    calls: list[CallRequest]
    finish_reason: str | None
    usage: UsagePart | None
    # From the model request (the last attempt's) to the response's end, and to its first text or tool
    # call fragment (None when it streamed neither).
    duration_ms: int
    first_token_ms: int | None = None
    # The response's reasoning: its text, from the request to the reasoning's end (ms), and the blocks
    # the provider needs back (Anthropic's signed thinking, redacted thinking; LiteLLM's
    # `thinking_blocks` format), none for providers that take no reasoning back.
    reasoning: str = ""
    reasoning_ms: int | None = None
    thinking_blocks: list[dict[str, Any]] = field(default_factory=list)
    # The provider's prompt count over the estimate of what was sent (turns.context), when it reported one.
    context_scale: float | None = None


@dataclass(frozen=True, slots=True)
class ToolStarted:
    call: CallRequest
    # "client": the client runs it; "approval": it runs once a person approves it; None: it runs now.
    waits_for: Kind | None = None
    source: str = "builtin"  # who runs it: ToolRegistry.source_of, or `client`


@dataclass(frozen=True, slots=True)
class ToolFinished:
    call: CallRequest
    outcome: ToolOutcome
    duration_ms: int
    interrupted: bool = False


@dataclass(frozen=True, slots=True)
class BreakpointReached:
    """Tool results are committed and a user message is waiting: the turn ends here (docs/api.md,
    Messages while a turn runs)."""


@dataclass(frozen=True, slots=True)
class InputRequested:
    """Calls of the round wait for a client's result or a person's decision: the turn is suspended until
    they are answered or expire. `resumed`: announced again after a restart (the rows exist)."""

    waiting: list[Waiting]
    resumed: bool = False


@dataclass(frozen=True, slots=True)
class InputAnswered:
    """Answers (or expiries) to record; `submission` (None for an expiry) gets its reply once they are
    committed."""

    answers: list[Answer]
    waiting: list[Waiting]
    submission: Submission | None = None
    replies: list[Resolution] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ApprovedStarting:
    """Approved calls are about to run: marked so that a crash from here never runs them again."""

    call_ids: list[str]


AgentEvent = (
    ResponseStarted
    | ReasoningChunk
    | TextChunk
    | ResponseFinished
    | ToolStarted
    | ToolFinished
    | BreakpointReached
    | InputRequested
    | InputAnswered
    | ApprovedStarting
    | ContextCompacted
)
