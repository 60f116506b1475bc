"""Which models the lean OpenAI-compatible reader takes, and everything it needs, as LiteLLM resolves it.

LiteLLM stays the authority on providers: `get_llm_provider` gives the bare model name, the provider, its
default key and base URL; the provider's chat config (`ProviderConfigManager`) maps the parameters and
messages exactly as `acompletion` would (O-series system messages, vLLM's tool schemas, ...) and builds
the URL; `map_finish_reason` normalizes the finish reason. Only the stream itself is read by our code.

"auto" takes the lean reader for the providers whose LiteLLM path is a plain OpenAI chat-completions
call: `openai` (unless LiteLLM would bridge the model to the Responses API) and `hosted_vllm` (with a
base URL). Everything else keeps LiteLLM's stream.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from app.llm.provider_errors import map_error
from app.llm.types import ResolvedModel

log = logging.getLogger(__name__)

OPENAI_COMPATIBLE = frozenset({"openai", "hosted_vllm"})

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


def resolve_endpoint(litellm: ModuleType, model: ResolvedModel, *, forced: bool) -> Endpoint | None:
    """The lean reader's endpoint for `model`, or None when LiteLLM's own stream must read it.

    `forced` (the models file's `"adapter": "openai"`) also takes models of other providers, or unknown to
    LiteLLM, when the file gives their base URL: the bare name and the messages are sent as they are.
    """
    try:
        bare, provider, dynamic_key, api_base = litellm.get_llm_provider(model.name, api_base=model.api_base)
    except Exception:
        if not forced:
            return None
        bare, provider, dynamic_key, api_base = model.name, None, None, model.api_base
    compatible = provider in OPENAI_COMPATIBLE
    if not compatible and not (forced and model.api_base):
        if forced:
            log.warning(
                "model %s needs an api_base for the OpenAI-compatible reader: LiteLLM reads it", model.name
            )
        return None
    if provider == "openai":
        if not forced and _bridged_to_responses(litellm, bare, api_base):
            return None
        api_base = litellm.OpenAIGPTConfig.get_api_base(api_base)
    api_base = model.api_base or api_base or litellm.api_base
    if not api_base:
        if forced:
            log.warning(
                "model %s has no base URL for the OpenAI-compatible reader: LiteLLM reads it", model.name
            )
        return None
    key = _api_key(litellm, model, provider, dynamic_key)
    if compatible:
        assert provider is not None
        config = litellm.ProviderConfigManager.get_provider_chat_config(
            model=bare, provider=litellm.LlmProviders(provider)
        )
        url = str(config.get_complete_url(api_base, key, bare, {}, {}))
        prepare = _litellm_prepare(litellm, config, bare, provider, api_base)
        finish: Callable[[str], str] = _map_finish_reason
    else:
        url = api_base.rstrip("/") + "/chat/completions"
        prepare = _plain_prepare(bare)
        finish = str
    return Endpoint(url, bare, provider, key, _headers(litellm, provider, key), prepare, finish)


def _bridged_to_responses(litellm: ModuleType, bare: str, api_base: str | None) -> bool:
    """Whether LiteLLM would send this OpenAI model to the Responses API (assuming tools are offered)."""
    check = getattr(getattr(litellm, "main", None), "responses_api_bridge_check", None)
    if check is None:
        return True
    try:
        info, _ = check(
            model=bare, custom_llm_provider="openai", tools=[{"type": "function"}], api_base=api_base
        )
    except Exception:
        return True
    return isinstance(info, dict) and info.get("mode") == "responses"


def _api_key(
    litellm: ModuleType, model: ResolvedModel, provider: str | None, dynamic: str | None
) -> str | None:
    """The models file's key, or the placeholder for a base URL without a key variable (as LiteLLMAdapter
    sends), or none when the entry's key variable is unset;
    otherwise LiteLLM's own lookup (OPENAI_API_KEY, HOSTED_VLLM_API_KEY, litellm.api_key)."""
    if configured := model.configured_key:
        return configured
    if model.key_env:
        # The entry names its key variable and it is unset: no stand-in key (LiteLLM's own, such as
        # hosted_vllm's "fake-api-key"); the call fails as provider_auth_missing and the launcher said why.
        return None
    if provider == "openai":
        key = litellm.OpenAIGPTConfig.get_api_key()
        return str(key) if key else None
    key = dynamic or litellm.api_key
    return str(key) if key else None


def _headers(litellm: ModuleType, provider: str | None, key: str | None) -> dict[str, str]:
    headers = {"content-type": "application/json", "accept": "text/event-stream"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    if provider == "openai":
        # What LiteLLM hands the openai SDK, and what the SDK itself reads from the environment.
        organization = (
            litellm.organization or os.environ.get("OPENAI_ORGANIZATION") or os.environ.get("OPENAI_ORG_ID")
        )
        if organization:
            headers["openai-organization"] = str(organization)
        if project := os.environ.get("OPENAI_PROJECT_ID"):
            headers["openai-project"] = project
    return headers


def _litellm_prepare(litellm: ModuleType, config: Any, bare: str, provider: str, api_base: str) -> Prepare:
    def prepare(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
        try:
            # LiteLLM's mappings edit what they are given (vLLM strips schema keys in place): copies.
            optional = litellm.get_optional_params(
                model=bare,
                custom_llm_provider=provider,
                tools=copy.deepcopy(list(tools)) or None,
                stream=True,
                stream_options={"include_usage": True},
            )
            body: dict[str, Any] = config.transform_request(
                bare,
                [_without_thinking(m) for m in messages],
                optional,
                {"custom_llm_provider": provider, "api_base": api_base},
                {},
            )
        except Exception as exc:
            raise map_error(litellm, exc, streamed=False) from exc
        # The openai SDK merges `extra_body` into the JSON it sends; so do we.
        extra = body.pop("extra_body", None)
        if isinstance(extra, dict):
            body.update(extra)
        return body

    return prepare


def _plain_prepare(bare: str) -> Prepare:
    def prepare(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": bare,
            "messages": [_without_thinking(m) for m in messages],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            body["tools"] = list(tools)
        return body

    return prepare


def _without_thinking(message: dict[str, Any]) -> dict[str, Any]:
    """A copy without the Anthropic thinking an assistant message may keep (`thinking_blocks`): OpenAI-
    compatible servers take no reasoning back (docs/protocol.md, The prompt a model reads)."""
    if "thinking_blocks" not in message:
        return dict(message)
    return {key: value for key, value in message.items() if key != "thinking_blocks"}


def _map_finish_reason(reason: str) -> str:
    """LiteLLM's normalization ("eos" -> "stop", ...); only called once LiteLLM is loaded."""
    from litellm.litellm_core_utils.core_helpers import map_finish_reason

    return str(map_finish_reason(reason))
