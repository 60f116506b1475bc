"""What every provider adapter yields: a small normalized stream, independent of any SDK."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class TextPart:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningPart:
    """A fragment of the model's reasoning: `text` shown to clients; `signature` (Anthropic's, closing a
    thinking block) and `redacted` (a redacted_thinking block's encrypted data) kept only to send back to
    the provider, never shown."""

    text: str = ""
    signature: str | None = None
    redacted: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCallPart:
    """A fragment of a tool call; fragments of one call share `index` (ids and names come only once)."""

    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclass(frozen=True, slots=True)
class UsagePart:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    # Estimated because the provider sent no usage (app/llm/observed.py).
    estimated: bool = False
    # Of prompt_tokens, those read from the provider's prompt cache and those written to it (Anthropic's
    # cache_read_input_tokens and cache_creation_input_tokens, anthropic.py; OpenAI's
    # prompt_tokens_details.cached_tokens, openai_compat.py); 0 where not reported.
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    # Of completion_tokens, the reasoning's (OpenAI's completion_tokens_details.reasoning_tokens); None
    # where the provider does not count them apart (Anthropic).
    reasoning_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class FinishPart:
    reason: str | None


StreamPart = TextPart | ReasoningPart | ToolCallPart | UsagePart | FinishPart


# Sent as the key to a base URL configured without one: local servers (vLLM, Ollama) take no key, but the
# openai client refuses to send none.
PLACEHOLDER_KEY = "no-key"


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A model name with everything needed to call it and to report its context use."""

    name: str
    context_window: int | None
    api_base: str | None = None
    api_key: str | None = field(default=None, repr=False)
    provider: str | None = None
    # The models file's api_key_env: when it names a variable that is unset, no placeholder key is sent.
    key_env: str | None = None

    @property
    def configured_key(self) -> str | None:
        """The key to send as configured: the models file's, or PLACEHOLDER_KEY with a base URL and no key
        variable at all; None leaves the key to the provider's own lookup (its environment variable). An
        entry whose api_key_env is unset never sends the placeholder: the launcher reports that variable."""
        if self.api_key:
            return self.api_key
        if self.api_base and self.key_env is None:
            return PLACEHOLDER_KEY
        return None


@dataclass(frozen=True, slots=True)
class ModelRequest:
    model: ResolvedModel
    messages: Sequence[dict[str, Any]]
    tools: Sequence[dict[str, Any]]
    timeout: float


class ProviderError(Exception):
    """A model call failed; `message` is safe to show to end users, the cause goes to the log only."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.retryable = retryable
        # Seconds the provider asked us to wait (its Retry-After), when it said.
        self.retry_after = retry_after


class ModelAdapter(Protocol):
    """One provider call: yields parts until the model's response ends; closes the upstream on exit."""

    def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]: ...
