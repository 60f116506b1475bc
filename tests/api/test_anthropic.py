"""Anthropic models end to end: a server whose models file names `anthropic/...` models, the native reader
(app/llm/anthropic.py) and the strict fake Messages API (tests/fakes/anthropic.py) over real HTTP.

The fake answers 400 to any request Anthropic would refuse, so every turn that completes here sent a
valid history: a tool round then an answer, several tool calls in one response, thinking blocks in the
stream, stops mid-text and mid-tool-input (the fake sees the disconnect, the next turn completes),
`overloaded_error` mid-stream, 429 with retry-after, a stream cut short, HTML with status 200, cache
tokens in the usage and the cache breakpoints (absent for a model with `"prompt_cache": false`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.settings import Settings
from tests.fakes import anthropic as fake_anthropic
from tests.fakes.upstream import FakeUpstream, Script
from tests.support.server import LiveServer, live_server
from tests.support.sse import EventReader

pytestmark = pytest.mark.anyio

MODEL = "anthropic/claude-fake"
UNCACHED = "anthropic/claude-fake-uncached"
THINKING = "anthropic/claude-fake-thinking"
KEY = "sk-ant-test"
CALLS = [
    ("toolu_a", "current_time", '{"timezone": "UTC"}'),
    ("toolu_b", "calculate", '{"expression": "6*7"}'),
]
HTML_PAGE = "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>\n"
EPHEMERAL = {"type": "ephemeral"}


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(api_key=KEY) as running:
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
        "context_window": 200_000,
        "max_output_tokens": 1024,
        "models": {
            MODEL: {},
            UNCACHED: {"prompt_cache": False},
            THINKING: {"reasoning": {"budget_tokens": 2048}},
        },
    }
    path.write_text(json.dumps({"providers": {"claude": claude}}), encoding="utf-8")
    with live_server(settings.model_copy(update={"models_file": path, "default_model": MODEL})) as running:
        yield running


async def _session(server: LiveServer, model: str = MODEL) -> str:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        created = await client.post("/v1/sessions", json={"model": model})
        assert created.status_code == 201, created.text
        return str(created.json()["id"])


async def _post(server: LiveServer, sid: str, content: str) -> EventReader:
    """Posts a message and reads the session's events until that turn is done."""
    async with (
        httpx.AsyncClient(base_url=server.base_url, timeout=30) as client,
        EventReader(client, f"/v1/sessions/{sid}/events") as reader,
    ):
        posted = await client.post(f"/v1/sessions/{sid}/messages", json={"content": content})
        assert posted.status_code == 202
        await reader.wait_type("turn_done")
    return reader


async def _rows(server: LiveServer, sid: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        page = (await client.get(f"/v1/sessions/{sid}/messages")).json()
        rows: list[dict[str, Any]] = page["chat_messages"]
        return rows


def _text(reader: EventReader) -> str:
    return "".join(d["text"] for d in reader.of_type("text_delta"))


def _status(reader: EventReader) -> str:
    return str(reader.of_type("turn_done")[0]["status"])


def _marked(body: dict[str, Any]) -> list[str]:
    """Where the request's cache breakpoints are."""
    found = [f"system.{n}" for n, b in enumerate(body.get("system") or []) if "cache_control" in b]
    found += [f"tools.{n}" for n, t in enumerate(body.get("tools") or []) if "cache_control" in t]
    for n, message in enumerate(body["messages"]):
        found += [f"messages.{n}.{k}" for k, b in enumerate(message["content"]) if "cache_control" in b]
    return found


def _assert_valid(upstream: FakeUpstream) -> None:
    for request in upstream.requests:
        assert request.path == "/v1/messages"
        assert request.problems == [], request.problems
        assert request.status == 200


async def test_text_with_cache_tokens_in_the_usage(server: LiveServer, upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.text("Hello from Claude.", chunks=4, usage=(40, 7), cache=(900, 60)))
    reader = await _post(server, await _session(server), "hi")
    assert _text(reader) == "Hello from Claude."
    usage = reader.of_type("response_done")[0]["response"]["usage"]
    # The prompt counts what was read from the cache and written to it: the context the call used.
    assert usage == {
        "prompt_tokens": 1000,
        "completion_tokens": 7,
        "total_tokens": 1007,
        "estimated": False,
        "cache_read_tokens": 900,
        "cache_write_tokens": 60,
        "reasoning_tokens": None,
    }
    context = reader.of_type("token_usage")[0]
    assert (context["context_used"], context["cache_read_tokens"], context["cache_write_tokens"]) == (
        1000,
        900,
        60,
    )
    assert reader.of_type("response_done")[0]["response"]["finish_reason"] == "stop"
    [request] = upstream.requests
    assert request.headers["x-api-key"] == KEY
    assert request.body["model"] == "claude-fake"
    assert request.body["max_tokens"] == 1024
    assert request.body["messages"][-1] == {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    _assert_valid(upstream)


async def test_a_tool_round_with_two_calls_then_an_answer(server: LiveServer, upstream: FakeUpstream) -> None:
    upstream.enqueue(
        Script.tool_calls(CALLS, fragments=4, text_before="Checking.", thinking="Two tools at once."),
        Script.text("It is late and the answer is 42.", redacted_thinking=True),
    )
    sid = await _session(server)
    reader = await _post(server, sid, "time and 6*7?")
    assert _status(reader) == "completed"
    starts = reader.of_type("tool_exec_start")
    assert [s["tool_call"] for s in starts] == [
        {"id": "toolu_a", "name": "current_time", "arguments": {"timezone": "UTC"}},
        {"id": "toolu_b", "name": "calculate", "arguments": {"expression": "6*7"}},
    ]
    assert _text(reader) == "Checking.It is late and the answer is 42."
    _assert_valid(upstream)
    second = upstream.requests[1].body
    assistant, results = second["messages"][-2:]
    # The response's signed thinking goes back first, as Anthropic requires of a tool round.
    assert [b["type"] for b in assistant["content"]] == ["thinking", "text", "tool_use", "tool_use"]
    assert assistant["content"][0] == {
        "type": "thinking",
        "thinking": "Two tools at once.",
        "signature": fake_anthropic.SIGNATURE,
    }
    assert [(b["type"], b["tool_use_id"]) for b in results["content"]] == [
        ("tool_result", "toolu_a"),
        ("tool_result", "toolu_b"),
    ]
    n = len(second["messages"]) - 2
    assert _marked(second)[-1] == f"messages.{n}.3"  # the last block before the results
    assert f"tools.{len(second['tools']) - 1}" in _marked(second)

    # The next turn: alternation kept (the answer, then the new user message), the answer cached.
    upstream.enqueue(Script.text("You are welcome."))
    again = await _post(server, sid, "thanks")
    assert _status(again) == "completed"
    _assert_valid(upstream)
    third = upstream.requests[2].body
    assert [m["role"] for m in third["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert _marked(third)[-1] == f"messages.{len(third['messages']) - 2}.0"


async def test_thinking_a_tool_round_and_an_answer(server: LiveServer, upstream: FakeUpstream) -> None:
    upstream.enqueue(
        Script.tool_calls(CALLS[:1], thinking="The user wants the time; the tool knows it."),
        Script.text("It is noon.", thinking="The tool said noon."),
    )
    sid = await _session(server, THINKING)
    reader = await _post(server, sid, "time?")
    assert _status(reader) == "completed"
    _assert_valid(upstream)  # the strict fake refuses a tool round without its signed thinking first
    first, second = (r.body for r in upstream.requests)
    assert first["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert first["max_tokens"] > 2048
    assistant = second["messages"][-2]
    assert [b["type"] for b in assistant["content"]] == ["thinking", "tool_use"]
    assert assistant["content"][0]["signature"] == fake_anthropic.SIGNATURE
    deltas = reader.of_type("reasoning_delta")
    assert "".join(d["text"] for d in deltas if d["id"] == deltas[0]["id"]) == (
        "The user wants the time; the tool knows it."
    )
    assert (deltas[0]["model"], "timestamp" in deltas[0], "model" in deltas[1]) == (THINKING, True, False)
    kinds = [e.event for e in reader.events if e.event in ("reasoning_delta", "text_delta")]
    assert kinds.index("text_delta") > kinds.index("reasoning_delta")
    assert _text(reader) == "It is noon."
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        rows = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
        turn = (await client.get(f"/v1/sessions/{sid}/turns")).json()["turns"][-1]
    reasoning = [r for r in rows if r["type"] == "reasoning"]
    assert [r["content"] for r in reasoning] == [
        "The user wants the time; the tool knows it.",
        "The tool said noon.",
    ]
    assert all(r["duration_ms"] is not None and r["model"] == THINKING for r in reasoning)
    assert fake_anthropic.SIGNATURE not in json.dumps(rows)  # kept for the provider, never shown
    assert [n["kind"] for n in turn["nodes"]] == ["reasoning", "tool", "reasoning", "llm"]
    # The next turn rebuilds the history from the rows: the signed thinking goes back again.
    upstream.enqueue(Script.text("Bye.", thinking="Short."))
    assert _status(await _post(server, sid, "thanks")) == "completed"
    _assert_valid(upstream)
    third = upstream.requests[2].body
    assert [b["type"] for b in third["messages"][1]["content"]] == ["thinking", "tool_use"]


async def test_no_breakpoints_when_prompt_cache_is_off(server: LiveServer, upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.tool_calls(CALLS[:1]), Script.text("Done."))
    reader = await _post(server, await _session(server, UNCACHED), "time?")
    assert _status(reader) == "completed"
    assert [_marked(r.body) for r in upstream.requests] == [[], []]
    _assert_valid(upstream)


# Each script paces its content deltas 50 ms apart; the stop comes after `wanted` of them.
STOPS = {
    "text": (Script.text(" ".join(f"w{n}" for n in range(40)), chunks=40, delay=0.05), 3),
    # Past the text ("Let me see." in three deltas), into the JSON input.
    "tool input": (Script.tool_calls(CALLS[:1], fragments=10, text_before="Let me see.", delay=0.05), 4),
    # Inside the thinking block (three thinking deltas and the signature's), before any text.
    "thinking": (Script.text("The answer.", thinking="Let me think about this carefully.", delay=0.05), 2),
}


@pytest.mark.parametrize("where", list(STOPS))
async def test_a_stop_mid_stream_disconnects_and_the_next_turn_completes(
    server: LiveServer, upstream: FakeUpstream, where: str
) -> None:
    script, wanted = STOPS[where]
    upstream.enqueue(script)
    sid = await _session(server)
    async with (
        httpx.AsyncClient(base_url=server.base_url, timeout=30) as client,
        EventReader(client, f"/v1/sessions/{sid}/events") as reader,
    ):
        assert (await client.post(f"/v1/sessions/{sid}/messages", json={"content": "go"})).status_code == 202
        await upstream.await_request(lambda r: r.content_sent >= wanted, within=10)
        cancelled = await client.post(f"/v1/sessions/{sid}/cancel", json={})
        assert cancelled.status_code == 202
        request = await upstream.await_disconnect(within=5)
        await reader.wait_type("turn_done")
    assert request.content_sent < len(fake_anthropic.stream(script, model="m", message_id="m").paced)
    assert _status(reader) == "cancelled"
    if where == "thinking":  # the reasoning streamed so far is kept, marked, and named as cut short
        [reasoning] = [r for r in await _rows(server, sid) if r["type"] == "reasoning"]
        assert reasoning["interrupted"] and reasoning["content"]
        assert reasoning["id"] in reader.of_type("agent_cancelled")[0]["interrupted_message_ids"]
    upstream.enqueue(Script.text("Fine now."))
    again = await _post(server, sid, "again")
    assert _status(again) == "completed"
    _assert_valid(upstream)


async def test_overloaded_before_any_text_is_retried(server: LiveServer, upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.text("Hello there.", error_after=2), Script.text("Recovered."))
    reader = await _post(server, await _session(server), "hi")
    assert len(upstream.requests) == 2
    assert _text(reader) == "Recovered."


async def test_overloaded_mid_text_fails_the_turn_and_keeps_the_text(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(Script.text("one two three four", chunks=4, error_after=5))
    sid = await _session(server)
    reader = await _post(server, sid, "hi")
    assert len(upstream.requests) == 1
    assert reader.of_type("error")[0]["code"] == "provider_stream_interrupted"
    streamed = _text(reader)
    assert streamed
    assert "one two three four".startswith(streamed)
    assert streamed != "one two three four"
    upstream.enqueue(Script.text("Fine now."))
    assert _status(await _post(server, sid, "again")) == "completed"
    _assert_valid(upstream)


async def test_rate_limited_with_retry_after_is_retried(server: LiveServer, upstream: FakeUpstream) -> None:
    limited = Script.error(429, body=fake_anthropic.error_body(429), retry_after=1)
    upstream.enqueue(limited, Script.text("Recovered."))
    reader = await _post(server, await _session(server), "hi")
    assert [r.status for r in upstream.requests] == [429, 200]
    # The wait asked for, at least, before the retry (a lower bound, not a timing).
    assert upstream.requests[1].received_at - upstream.requests[0].received_at >= 1
    assert _text(reader) == "Recovered."

    upstream.enqueue(limited, limited, limited)
    failed = await _post(server, await _session(server), "hi")
    assert failed.of_type("error")[0]["code"] == "provider_rate_limited"
    assert failed.of_type("error")[0]["retry_after"] == 1

    # Longer than the server waits out itself (PARLEY_PROVIDER_RETRY_MAX_WAIT, 10 s): failed at once.
    before = len(upstream.requests)
    overloaded = Script.error(529, body=fake_anthropic.error_body(529), retry_after=60)
    upstream.enqueue(overloaded)
    refused = await _post(server, await _session(server), "hi")
    assert len(upstream.requests) == before + 1
    [error] = refused.of_type("error")
    assert (error["code"], error["retry_after"]) == ("provider_unavailable", 60)


@pytest.mark.parametrize(
    ("script", "code", "requests"),
    [
        pytest.param(Script.cut("one two three", after=4), "provider_stream_interrupted", 1, id="cut"),
        pytest.param(Script.raw(HTML_PAGE), "provider_bad_response", 3, id="html-200"),
        pytest.param(
            Script.error(529, body=fake_anthropic.error_body(529)),
            "provider_unavailable",
            3,
            id="overloaded-529",
        ),
        pytest.param(
            Script.error(401, body=fake_anthropic.error_body(401)), "provider_auth_failed", 1, id="auth"
        ),
    ],
)
async def test_failures_are_the_openai_paths_codes(
    server: LiveServer, upstream: FakeUpstream, script: Script, code: str, requests: int
) -> None:
    upstream.enqueue(*([script] * requests))
    reader = await _post(server, await _session(server), "hi")
    await asyncio.sleep(0)
    assert len(upstream.requests) == requests
    assert reader.of_type("error")[0]["code"] == code
    assert _status(reader) == "failed"
