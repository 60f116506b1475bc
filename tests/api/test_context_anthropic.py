"""Context compaction on the Anthropic path with extended thinking (docs/context.md, Composes with): a
Claude model that thinks before each answer and each tool round, parallel tool calls with bulky results,
and a window the strict fake Messages API enforces as Anthropic does (400 "prompt is too long"). The fake
refuses any request Anthropic would: a tool round's assistant message must start with its signed thinking
block, every tool_use must be answered in the next message, roles alternate. So every turn that completes
here sent a valid, signed history within the window, however the history was elided or summarised."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.settings import Settings
from app.tools.registry import ToolRegistry, build_default_registry
from tests.api.test_context import Pages
from tests.fakes.upstream import FakeUpstream, Script
from tests.support.server import LiveServer, live_server
from tests.support.sse import EventReader

pytestmark = pytest.mark.anyio

MODEL = "anthropic/claude-fake-thinking"
KEY = "sk-ant-test"
WINDOW = 4000
SUMMARY = "- The user asked for pages; Claude read them and answered."


class Claude:
    """Answers by what a request holds, thinking first each time: a summary request gets a summary; tool
    results an answer; `fetch N` two parallel calls of N characters each; anything else a short answer."""

    def __init__(self) -> None:
        self.ids = itertools.count(1)

    def __call__(self, body: dict[str, Any]) -> Script:
        last = body["messages"][-1]
        content = last["content"]
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        text = " ".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
        if "[summary request]" in text:
            return Script.text(SUMMARY, thinking="Condensing the early turns.")
        if any(b.get("type") == "tool_result" for b in blocks):
            return Script.text("I read the pages.", thinking="The pages say enough.")
        words = text.split()
        if words[:1] == ["fetch"]:
            size = json.dumps({"size": int(words[1])})
            calls = [(f"toolu_{next(self.ids):04d}", "fetch_page", size) for _ in range(2)]
            return Script.tool_calls(calls, thinking="Two pages will answer this.")
        return Script.text("Noted: " + " ".join(words[:6]), thinking="A short answer will do.")


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(api_key=KEY, window=WINDOW, responder=Claude()) as running:
        yield running


@pytest.fixture
def server(
    settings: Settings, upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LiveServer]:
    monkeypatch.setenv("PARLEY_TEST_CLAUDE_KEY", KEY)
    path = tmp_path / "models.json"
    claude = {
        "api_base": upstream.root_url,
        "api_key_env": "PARLEY_TEST_CLAUDE_KEY",
        "context_window": WINDOW,
        "max_output_tokens": 1024,
        "models": {MODEL: {"reasoning": {"budget_tokens": 1024}}},
    }
    path.write_text(json.dumps({"providers": {"claude": claude}}), encoding="utf-8")
    tools: ToolRegistry = build_default_registry()
    tools.add_provider(Pages())
    configured = settings.model_copy(update={"models_file": path, "default_model": MODEL})
    with live_server(configured, tools) as running:
        yield running


@pytest.mark.both_backends
async def test_a_thinking_claude_session_longer_than_its_window_keeps_every_request_valid_and_signed(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    contents = [
        f"fetch 2400 turn {n}" if n % 3 == 0 else f"Turn {n}: " + "tell me more about it " * 30
        for n in range(15)
    ]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        created = await client.post("/v1/sessions", json={"tools": ["fetch_page"]})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            for done, content in enumerate(contents, start=1):
                posted = await client.post(f"/v1/sessions/{sid}/messages", json={"content": content})
                assert posted.status_code == 202, posted.text
                await reader.wait_type("turn_done", count=done, timeout=30)
        page = await client.get(f"/v1/sessions/{sid}/messages", params={"limit": 1000})
        history = page.json()["chat_messages"]

    assert [d["status"] for d in reader.of_type("turn_done")] == ["completed"] * len(contents)
    # Every request Anthropic's rules and the window allow: none refused, none over the window.
    assert upstream.requests, "no request reached the fake"
    for request in upstream.requests:
        assert request.path == "/v1/messages"
        assert request.problems == [], request.problems
        assert request.status == 200
    compacted = reader.of_type("context_compacted")
    assert any(c["summary_written"] for c in compacted), "the session never needed a summary"
    assert any(c["elided_tool_call_ids"] for c in compacted), "no bulky result was ever elided"
    # Each tool round went back with its signed thinking first (the fake checks the signature is there).
    rounds = [
        r.body
        for r in upstream.requests
        if isinstance(r.body, dict)
        and any(b.get("type") == "tool_result" for b in _blocks(r.body["messages"][-1]))
    ]
    assert rounds, "no tool round was sent back"
    for body in rounds:
        assert _blocks(body["messages"][-2])[0]["type"] == "thinking"
    # The record is whole: every question, every result in full, every answer's reasoning kept.
    assert [m["content"] for m in history if m["type"] == "text" and m["role"] == "user"] == contents
    results = [m for m in history if m["type"] == "tool_group"]
    assert len(results) == 2 * 5 and all(len(m["result"]) == 2400 for m in results)
    assert sum(1 for m in history if m["type"] == "reasoning") >= len(contents)


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message["content"]
    return content if isinstance(content, list) else [{"type": "text", "text": content}]
