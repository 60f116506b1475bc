"""Which models the lean OpenAI-compatible reader takes, and the endpoint it gets (app.llm.routing), from
LiteLLM's files read as data. Which adapter the model layer then builds: test_gateway.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from app.llm.litellm_tables import ModelMap
from app.llm.models_file import ModelCatalog
from app.llm.routing import Endpoint, resolve_endpoint
from app.llm.types import PLACEHOLDER_KEY, ResolvedModel

BASE = "http://127.0.0.1:9/v1"
KEY_ENV = "PARLEY_TEST_ROUTING_KEY"
HI = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
OPENAI_ENV = ("OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_API_KEY", "OPENAI_ORGANIZATION", "OPENAI_ORG_ID")


@pytest.fixture(scope="module")
def models() -> ModelMap:
    return ModelMap.read()


@pytest.fixture(autouse=True)
def no_openai_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in (*OPENAI_ENV, "OPENAI_PROJECT_ID", KEY_ENV):
        monkeypatch.delenv(variable, raising=False)


def from_models_file(tmp_path: Path, name: str) -> ResolvedModel:
    provider = {"api_base": BASE, "api_key_env": KEY_ENV, "models": [name]}
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"providers": {"house": provider}}), encoding="utf-8")
    return ModelCatalog.load(path).resolve(name, None)


def endpoint(models: ModelMap, model: ResolvedModel, *, forced: bool = False) -> Endpoint:
    found = resolve_endpoint(models, model, forced=forced)
    assert found is not None
    return found


def test_a_models_file_entry_is_called_at_its_base_with_its_key(
    models: ModelMap, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-house-123")
    found = endpoint(models, from_models_file(tmp_path, "hosted_vllm/qwen"))
    assert (found.url, found.model, found.provider) == (f"{BASE}/chat/completions", "qwen", "hosted_vllm")
    assert found.api_key == "sk-house-123"
    assert found.headers == {
        "content-type": "application/json",
        "accept": "text/event-stream",
        "authorization": "Bearer sk-house-123",
    }
    assert "sk-house-123" not in repr(found)
    body: dict[str, Any] = found.prepare(HI, [TOOL])
    assert body == {
        "model": "qwen",
        "messages": HI,
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [TOOL],
    }
    assert found.finish_reason("eos") == "stop"  # LiteLLM's normalization


def test_a_models_file_entry_whose_key_variable_is_unset_never_sends_the_placeholder(
    models: ModelMap, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry asked for a key: sending `Bearer no-key` would hide the missing variable behind the
    server's 401. No key is sent (the launcher names the variable at startup; a call fails with
    provider_auth_missing, which says what is wrong)."""
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv("HOSTED_VLLM_API_KEY", raising=False)
    found = endpoint(models, from_models_file(tmp_path, "hosted_vllm/qwen"))
    assert found.api_key is None
    assert "authorization" not in found.headers


def test_a_provider_prefix_takes_the_providers_base_and_environment(
    models: ModelMap, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OPENAI_ORGANIZATION", "org-1")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-1")
    found = endpoint(models, ResolvedModel("openai/gpt-4o-mini", None))
    assert (found.url, found.model, found.provider) == (
        "https://api.openai.com/v1/chat/completions",
        "gpt-4o-mini",
        "openai",
    )
    assert found.api_key == "sk-from-env"
    assert found.headers["authorization"] == "Bearer sk-from-env"
    assert (found.headers["openai-organization"], found.headers["openai-project"]) == ("org-1", "proj-1")


def test_without_any_key_none_is_sent(models: ModelMap) -> None:
    found = endpoint(models, ResolvedModel("openai/gpt-4o-mini", None))
    assert found.api_key is None
    assert "authorization" not in found.headers


@pytest.mark.parametrize(
    "model",
    [
        ResolvedModel("anthropic/claude-sonnet-4-5", None),  # not OpenAI-compatible
        ResolvedModel("no-such-model-anywhere", None),  # LiteLLM cannot route it
        ResolvedModel("hosted_vllm/nobase", None),  # compatible, but no base URL to call
        ResolvedModel("o1-pro", None),  # LiteLLM bridges it to the Responses API
    ],
)
def test_models_the_lean_reader_cannot_call_are_left_to_litellm(
    models: ModelMap, model: ResolvedModel
) -> None:
    assert resolve_endpoint(models, model, forced=False) is None


def test_forced_takes_an_unknown_model_at_its_base_as_it_is(models: ModelMap) -> None:
    found = endpoint(models, ResolvedModel("house-model", None, api_base=BASE), forced=True)
    assert (found.url, found.model, found.provider, found.api_key) == (
        f"{BASE}/chat/completions",
        "house-model",
        None,
        PLACEHOLDER_KEY,
    )
    assert found.prepare(HI, []) == {
        "model": "house-model",
        "messages": HI,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert found.finish_reason("eos") == "eos"  # no LiteLLM mapping for a provider it does not know


def test_forced_without_a_base_url_is_left_to_litellm_with_a_warning(
    models: ModelMap, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="app.llm.routing"):
        assert resolve_endpoint(models, ResolvedModel("house-model", None), forced=True) is None
    assert [r.getMessage() for r in caplog.records if r.name == "app.llm.routing"] == [
        "model house-model needs an api_base for the OpenAI-compatible reader: LiteLLM reads it"
    ]


def test_a_reasoning_effort_goes_with_every_request_and_vllm_gets_schemas_it_takes(
    models: ModelMap, tmp_path: Path
) -> None:
    found = resolve_endpoint(models, ResolvedModel("o4-mini", None), forced=False, reasoning_effort="low")
    assert found is not None
    assert found.prepare(HI, [])["reasoning_effort"] == "low"
    strict: dict[str, Any] = {
        "type": "function",
        "function": {
            "name": "f",
            "strict": True,
            "parameters": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"a": {"type": "object", "additionalProperties": False}},
            },
        },
    }
    vllm = endpoint(models, from_models_file(tmp_path, "hosted_vllm/qwen"))
    assert "reasoning_effort" not in vllm.prepare(HI, [strict])
    assert vllm.prepare(HI, [strict])["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {"type": "object", "properties": {"a": {"type": "object"}}},
            },
        }
    ]
    assert strict["function"]["strict"] is True  # the session's own definition is left as it was
    plain = endpoint(models, ResolvedModel("openai/gpt-4o", None))
    assert plain.prepare(HI, [strict])["tools"] == [strict]
    assert plain.finish_reason("end_turn") == "stop" and plain.finish_reason("tool_use") == "tool_calls"
