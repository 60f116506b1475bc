"""The model layer: which stream adapter each model gets, and no litellm in the service's process unless a
tail model streams. Where LiteLLM's streams run (a child process): test_litellm_process.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import pytest

from app.llm.anthropic import AnthropicAdapter, AnthropicEndpoint
from app.llm.demo import DemoAdapter
from app.llm.gateway import ModelGateway
from app.llm.litellm_adapter import LiteLLMAdapter
from app.llm.openai_compat import OpenAICompatAdapter
from app.llm.types import ModelRequest, ProviderError, ResolvedModel
from app.settings import DEMO_MODEL, Settings

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
BASE = "http://127.0.0.1:9/v1"

MODELS: dict[str, Any] = {
    "providers": {
        "vllm": {"api_base": BASE, "models": ["hosted_vllm/qwen", "openai/local"]},
        "pinned": {"adapter": "litellm", "api_base": BASE, "models": ["openai/pinned"]},
        "forced": {"adapter": "openai", "api_base": BASE, "models": ["ollama_chat/llama3.1", "house-model"]},
        "no-base": {"models": ["hosted_vllm/nobase"]},
        "forced-no-base": {"adapter": "openai", "models": ["ollama_chat/nobase"]},
        "claude": {
            "api_key_env": "PARLEY_TEST_CLAUDE_KEY",
            "max_output_tokens": 2000,
            "models": {
                "anthropic/claude-opus-4-1": {"prompt_cache": False},
                "anthropic/claude-sonnet-4-5": {},
            },
        },
        "claude-pinned": {"adapter": "litellm", "models": ["anthropic/claude-3-haiku-20240307"]},
    }
}


def _settings(tmp_path: Path, stream_adapter: Literal["auto", "litellm"] = "auto") -> Settings:
    path = tmp_path / "models.json"
    path.write_text(json.dumps(MODELS), encoding="utf-8")
    return Settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'unused.db'}",
        models_file=path,
        demo_token_delay=0.0,
        stream_adapter=stream_adapter,
    )


@pytest.fixture
async def layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ModelGateway]:
    for variable in ("OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    model_layer = ModelGateway(_settings(tmp_path))
    model_layer.start()
    await model_layer.ready()
    yield model_layer
    await model_layer.stop()


# --- which adapter ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "url", "sent_as"),
    [
        ("hosted_vllm/qwen", f"{BASE}/chat/completions", "qwen"),
        ("openai/local", f"{BASE}/chat/completions", "local"),
        (
            "gpt-4o-mini",
            "https://api.openai.com/v1/chat/completions",
            "gpt-4o-mini",
        ),  # LiteLLM's default base
        # "adapter": "openai" takes providers LiteLLM does not call OpenAI-compatible, and unknown names.
        ("ollama_chat/llama3.1", f"{BASE}/chat/completions", "llama3.1"),
        ("house-model", f"{BASE}/chat/completions", "house-model"),
    ],
)
async def test_openai_compatible_models_take_the_lean_reader(
    layer: ModelGateway, model: str, url: str, sent_as: str
) -> None:
    adapter = await layer.adapter(await layer.resolve(model))
    assert isinstance(adapter, OpenAICompatAdapter)
    assert (adapter.endpoint.url, adapter.endpoint.model) == (url, sent_as)


@pytest.mark.parametrize(
    "model",
    [
        "openai/pinned",  # "adapter": "litellm" in the models file
        "hosted_vllm/nobase",  # no base URL to call
        "ollama_chat/nobase",  # "adapter": "openai", but no base URL for a provider LiteLLM maps itself
        "o1-pro",  # LiteLLM bridges it to the Responses API
        "anthropic/claude-3-haiku-20240307",  # "adapter": "litellm" in the models file
        "threadprobe/anything",  # a custom provider
    ],
)
async def test_other_models_keep_litellms_stream(layer: ModelGateway, model: str) -> None:
    assert isinstance(await layer.adapter(await layer.resolve(model)), LiteLLMAdapter)


async def test_anthropic_models_take_the_native_reader(
    layer: ModelGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARLEY_TEST_CLAUDE_KEY", "sk-ant-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    sonnet = await layer.adapter(await layer.resolve("anthropic/claude-sonnet-4-5"))
    assert isinstance(sonnet, AnthropicAdapter)
    assert sonnet.endpoint == AnthropicEndpoint(
        "https://api.anthropic.com/v1/messages", "claude-sonnet-4-5", "sk-ant-test", 2000, True
    )
    opus = await layer.adapter(await layer.resolve("anthropic/claude-opus-4-1"))
    assert isinstance(opus, AnthropicAdapter)
    assert (opus.endpoint.max_tokens, opus.endpoint.prompt_cache) == (2000, False)
    # Not in the models file: the key from ANTHROPIC_API_KEY, max_tokens the model's known maximum output
    # (LiteLLM's table), else 4096.
    for name, max_tokens in (("anthropic/claude-haiku-4-5", 64000), ("anthropic/claude-unheard-of", 4096)):
        other = await layer.adapter(await layer.resolve(name))
        assert isinstance(other, AnthropicAdapter)
        assert other.endpoint.api_key == "sk-ant-env"
        assert (other.endpoint.max_tokens, other.endpoint.prompt_cache) == (max_tokens, True)


async def test_the_demo_streams_in_process(layer: ModelGateway) -> None:
    assert isinstance(await layer.adapter(await layer.resolve(DEMO_MODEL)), DemoAdapter)


async def test_stream_adapter_litellm_forces_litellm_for_every_model_but_the_demo(tmp_path: Path) -> None:
    forced = ModelGateway(_settings(tmp_path, stream_adapter="litellm"))
    forced.start()
    await forced.ready()
    try:
        for model in ("hosted_vllm/qwen", "gpt-4o-mini", "house-model", "anthropic/claude-sonnet-4-5"):
            assert isinstance(await forced.adapter(await forced.resolve(model)), LiteLLMAdapter), model
        assert isinstance(await forced.adapter(await forced.resolve(DEMO_MODEL)), DemoAdapter)
    finally:
        await forced.stop()


async def test_keys_as_litellm_finds_them(layer: ModelGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = await layer.adapter(await layer.resolve("gpt-4o-mini"))
    assert isinstance(adapter, OpenAICompatAdapter)
    request = ModelRequest(ResolvedModel("gpt-4o-mini", None), [{"role": "user", "content": "hi"}], [], 5.0)
    # No key anywhere: refused before any connection is tried (the default base is not reachable here).
    with pytest.raises(ProviderError) as caught:
        await anext(adapter.stream(request))
    assert (caught.value.code, caught.value.retryable) == ("provider_auth_missing", False)

    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    adapter = await layer.adapter(await layer.resolve("gpt-4o-mini"))
    assert isinstance(adapter, OpenAICompatAdapter)
    assert adapter.endpoint.headers["authorization"] == "Bearer sk-from-env"
    # A configured base URL without a key sends a placeholder, as LiteLLMAdapter does.
    local = await layer.adapter(await layer.resolve("openai/local"))
    assert isinstance(local, OpenAICompatAdapter)
    assert local.endpoint.headers["authorization"] == "Bearer no-key"


# --- the LiteLLM child: tests/llm/test_litellm_process.py ---------------------------------------------------


async def test_stop_without_any_litellm_stream(tmp_path: Path) -> None:
    model_layer = ModelGateway(_settings(tmp_path))
    model_layer.start()
    await model_layer.ready()
    assert model_layer.litellm_process.pid is None  # started by the first LiteLLM stream only
    await model_layer.stop()
    assert model_layer.litellm_process.pid is None


# --- no litellm in the service's process without a tail model ---------------------------------------------

_NO_LITELLM_SCRIPT = """
import json, sys
import httpx
from app.settings import DEMO_MODEL, Settings
from tests.fakes.upstream import FakeUpstream, Script
from tests.support.server import live_server, migrate

url, path = sys.argv[1], sys.argv[2]
report = {}
with FakeUpstream(api_key="sk-test") as upstream:
    keyed = {"api_key_env": "PARLEY_TEST_KEY"}
    providers = {
        "house": {**keyed, "api_base": upstream.base_url, "models": ["openai/house"]},
        "vllm": {**keyed, "api_base": upstream.base_url, "models": ["hosted_vllm/q"]},
        "claude": {**keyed, "api_base": upstream.root_url, "models": ["anthropic/claude-sonnet-4-5"]},
    }
    with open(path, "w") as file:
        json.dump({"providers": providers}, file)
    migrate(url)
    settings = Settings(database_url=url, models_file=path, demo_token_delay=0.0)
    with live_server(settings) as server, httpx.Client(base_url=server.base_url, timeout=60) as client:
        for model in (DEMO_MODEL, "openai/house", "hosted_vllm/q", "anthropic/claude-sonnet-4-5"):
            if model != DEMO_MODEL:
                upstream.enqueue(Script.text("answered"))
            sid = client.post("/v1/sessions", json={"model": model}).json()["id"]
            turn = client.post(f"/v1/sessions/{sid}/messages?wait=true", json={"content": "hello"}).json()
            report[model] = turn["status"]
        report["gpt-4o window"] = client.post("/v1/sessions", json={"model": "gpt-4o"}).json()
report["litellm"] = sorted(name for name in sys.modules if name.split(".")[0] == "litellm")
print(json.dumps(report))
"""


@pytest.mark.slow
@pytest.mark.processes
def test_the_service_never_imports_litellm_without_a_tail_model(tmp_path: Path) -> None:
    """A fresh process serves the demo, an OpenAI-compatible, a vLLM and an Anthropic model over real HTTP
    (fake upstreams), and resolves a model from LiteLLM's map: litellm is never imported (only a tail
    model's stream starts the child that imports it: test_litellm_process.py)."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'parley.db'}"
    env = {**os.environ, "PARLEY_TEST_KEY": "sk-test"}
    done = subprocess.run(
        [sys.executable, "-c", _NO_LITELLM_SCRIPT, url, str(tmp_path / "models.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    statuses = {name: report[name] for name in (DEMO_MODEL, "openai/house", "hosted_vllm/q")}
    assert set(statuses.values()) == {"completed"}, report
    assert report["anthropic/claude-sonnet-4-5"] == "completed", report
    assert report["gpt-4o window"]["context_window"] == 128000
    assert report["litellm"] == []
