"""A provider that sends no usage chunk still gets its token_usage: estimated (app.llm.tokens on the lean
reader; LiteLLM's own counter in its child on the tail path), and the events say `estimated: true`. Run
through both stream adapters against the fake OpenAI-compatible upstream over HTTP. How it proves it: the
upstream's script has no usage, so any usage in the events can only be the estimate; the counts are
compared with the estimator's on the same text, and a provider that does send usage keeps its figures with
`estimated: false`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.llm import tokens
from app.llm.litellm_import import import_litellm
from app.settings import Settings
from tests.fakes.upstream import FakeUpstream, Script
from tests.support.server import live_server
from tests.support.sse import EventReader

pytestmark = pytest.mark.anyio

MODEL = "openai/fake-model"
ANSWER = "Seven words make up this short answer."


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(api_key="sk-test") as running:
        yield running


@pytest.fixture(params=["auto", "litellm"])
def configured(
    request: pytest.FixtureRequest,
    settings: Settings,
    upstream: FakeUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Settings:
    monkeypatch.setenv("PARLEY_TEST_FAKE_KEY", "sk-test")
    models = tmp_path / "models.json"
    provider = {"api_base": upstream.base_url, "api_key_env": "PARLEY_TEST_FAKE_KEY", "models": [MODEL]}
    models.write_text(json.dumps({"providers": {"fake": provider}}), encoding="utf-8")
    update = {"models_file": models, "default_model": MODEL, "stream_adapter": request.param}
    return settings.model_copy(update=update)


async def _turn(settings: Settings) -> EventReader:
    with live_server(settings) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            sid = (await client.post("/v1/sessions", json={"tools": []})).json()["id"]
            async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
                posted = await client.post(f"/v1/sessions/{sid}/messages", json={"content": "hello"})
                assert posted.status_code == 202
                await reader.wait_type("turn_done")
    return reader


async def test_no_usage_chunk_gives_an_estimated_token_usage(
    configured: Settings, upstream: FakeUpstream
) -> None:
    """The lean reader passes on only what the provider sent, and the estimate (app.llm.tokens) fills the
    gap; LiteLLM's own stream (the `litellm` adapter) counts the tokens itself when none come, and its
    figures are marked estimated because no usage chunk came from the upstream."""
    upstream.enqueue(Script.text(ANSWER, chunks=3, usage=None))
    reader = await _turn(configured)
    [usage] = reader.of_type("token_usage")
    [done] = reader.of_type("response_done")
    assert usage["estimated"] is True
    assert done["response"]["usage"]["estimated"] is True
    if configured.stream_adapter == "litellm":
        expected_completion = import_litellm().token_counter(model=MODEL, text=ANSWER)
    else:
        expected_completion = tokens.text_tokens(ANSWER)
    assert done["response"]["usage"]["completion_tokens"] == expected_completion
    prompt = done["response"]["usage"]["prompt_tokens"]
    assert usage["context_used"] == prompt and prompt > 0
    assert usage["session_total_tokens"] == prompt + expected_completion


async def test_a_providers_own_usage_is_not_estimated(configured: Settings, upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.text(ANSWER, chunks=3, usage=(42, 7)))
    reader = await _turn(configured)
    [usage] = reader.of_type("token_usage")
    assert (usage["context_used"], usage["session_total_tokens"], usage["estimated"]) == (42, 49, False)
