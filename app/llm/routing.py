"""Which models the lean OpenAI-compatible reader takes, and everything it needs, without LiteLLM.

The provider of a name comes from LiteLLM's files read as data (litellm_tables.ModelMap: a known provider
prefix, or a bare name LiteLLM's model map routes), the base URL, key and headers from the models file and
the provider's usual environment variables (as LiteLLM and the openai SDK read them), the request body is
the plain OpenAI chat-completions body. Only the stream is read by our code (openai_compat.py).

"auto" takes the lean reader for `openai` models (unless LiteLLM's map says the model speaks only the
Responses API) and `hosted_vllm` (with a base URL). Everything else is a tail model: LiteLLM's own stream,
in its child process.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.llm.litellm_tables import ModelMap
from app.llm.types import ResolvedModel

log = logging.getLogger(__name__)

OPENAI_COMPATIBLE = frozenset({"openai", "hosted_vllm"})
OPENAI_BASE = "https://api.openai.com/v1"
# What hosted_vllm sends without a key of its own (LiteLLM's HostedVLLMChatConfig does the same).
VLLM_PLACEHOLDER_KEY = "fake-api-key"

Prepare = Callable[[Sequence[dict[str, Any]], Sequence[dict[str, Any]]], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One model behind an OpenAI-compatible `/chat/completions`; `api_key` None means none is configured."""

    url: str
    model: str
    provider: str | None
    api_key: str | None = field(repr=False)
    headers: dict[str, str] = field(repr=False)
    prepare: Prepare = field(repr=False)  # (messages, tools) -> the whole request body
    finish_reason: Callable[[str], str] = field(repr=False)


def resolve_endpoint(
    models: ModelMap, model: ResolvedModel, *, forced: bool, reasoning_effort: str | None = None
) -> Endpoint | None:
    """The lean reader's endpoint for `model`, or None when LiteLLM's own stream must read it.

    `forced` (the models file's `"adapter": "openai"`) also takes models of other providers, or unknown to
    LiteLLM, when the file gives their base URL: the bare name and the messages are sent as they are.
    `reasoning_effort` (the models file's `reasoning.effort`) goes with every request.
    """
    routed = models.route(model.name)
    bare, provider = routed if routed is not None else (model.name, None)
    compatible = provider in OPENAI_COMPATIBLE
    if not compatible:
        if not forced:
            return None
        if not model.api_base:
            log.warning(
                "model %s needs an api_base for the OpenAI-compatible reader: LiteLLM reads it", model.name
            )
            return None
        provider = None  # sent as it is, under its bare name where a known prefix gives one
    if provider == "openai" and not forced and _responses_only(models, model.name):
        return None
    api_base = model.api_base or _environment_base(provider)
    if not api_base:
        if forced:
            log.warning(
                "model %s has no base URL for the OpenAI-compatible reader: LiteLLM reads it", model.name
            )
        return None
    key = _api_key(model, provider)
    url = api_base.rstrip("/") + "/chat/completions"
    prepare = _prepare(bare, strip_schemas=provider == "hosted_vllm", effort=reasoning_effort)
    finish: Callable[[str], str] = map_finish_reason if compatible else str
    return Endpoint(url, bare, provider, key, _headers(provider, key), prepare, finish)


def _responses_only(models: ModelMap, name: str) -> bool:
    """Models LiteLLM's map lists for the Responses API only (o1-pro, the codex models): LiteLLM bridges
    them there, the lean reader speaks chat completions only."""
    info = models.info(name)
    return info is not None and info.mode == "responses"


def _environment_base(provider: str | None) -> str | None:
    if provider == "openai":
        return os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_BASE") or OPENAI_BASE
    if provider == "hosted_vllm":
        return os.environ.get("HOSTED_VLLM_API_BASE") or None
    return None


def _api_key(model: ResolvedModel, provider: str | None) -> str | None:
    """The models file's key, or the placeholder for a base URL without a key variable, or none when the
    entry's key variable is unset; otherwise the provider's variable (OPENAI_API_KEY, HOSTED_VLLM_API_KEY)."""
    if configured := model.configured_key:
        return configured
    if model.key_env:
        # The entry names its key variable and it is unset: no stand-in key; the call fails as
        # provider_auth_missing and the launcher said why.
        return None
    if provider == "openai":
        return os.environ.get("OPENAI_API_KEY") or None
    if provider == "hosted_vllm":
        return os.environ.get("HOSTED_VLLM_API_KEY") or VLLM_PLACEHOLDER_KEY
    return None


def _headers(provider: str | None, key: str | None) -> dict[str, str]:
    headers = {"content-type": "application/json", "accept": "text/event-stream"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    if provider == "openai":
        # What the openai SDK reads from the environment.
        organization = os.environ.get("OPENAI_ORGANIZATION") or os.environ.get("OPENAI_ORG_ID")
        if organization:
            headers["openai-organization"] = organization
        if project := os.environ.get("OPENAI_PROJECT_ID"):
            headers["openai-project"] = project
    return headers


def _prepare(bare: str, *, strip_schemas: bool, effort: str | None = None) -> Prepare:
    def prepare(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": bare,
            "messages": [_without_thinking(m) for m in messages],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if effort is not None:
            body["reasoning_effort"] = effort
        if tools:
            body["tools"] = [_without_strict_keys(t) for t in tools] if strip_schemas else list(tools)
        return body

    return prepare


def _without_thinking(message: dict[str, Any]) -> dict[str, Any]:
    """A copy without the Anthropic thinking an assistant message may keep (`thinking_blocks`): OpenAI-
    compatible servers take no reasoning back (docs/protocol.md, The prompt a model reads)."""
    if "thinking_blocks" not in message:
        return dict(message)
    return {key: value for key, value in message.items() if key != "thinking_blocks"}


_VLLM_REFUSED_KEYS = frozenset({"additionalProperties", "strict"})


def _without_strict_keys(value: Any) -> Any:
    """A copy of a tool definition without `additionalProperties` and `strict` at any depth: vLLM's guided
    decoding refuses them (LiteLLM's hosted_vllm mapping removes them the same way)."""
    if isinstance(value, dict):
        return {k: _without_strict_keys(v) for k, v in value.items() if k not in _VLLM_REFUSED_KEYS}
    if isinstance(value, list):
        return [_without_strict_keys(v) for v in value]
    return value


# Finish reasons as LiteLLM normalizes them (its map_finish_reason), for servers that answer in another
# provider's words; anything unknown is "stop", as there.
_FINISH_REASONS = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "function_call",
    "content_filter": "content_filter",
    "stop_sequence": "stop",
    "end_turn": "stop",
    "eos": "stop",
    "eos_token": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


def map_finish_reason(reason: str) -> str:
    return _FINISH_REASONS.get(reason, "stop")
