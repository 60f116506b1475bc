"""Both stream adapters against a fake OpenAI-compatible upstream over HTTP, configured by a models file.

Every test runs twice: with `stream_adapter="auto"` ("openai/..." models take the lean OpenAI-compatible
reader, LiteLLM still resolving them) and with `"litellm"` (LiteLLM's own stream, in its child process).
Both must give the same events, the same error codes and the same retries. Covers text with usage,
fragmented parallel tool calls, provider errors (with retries only before any output), streams cut,
failing, ending unfinished or stalling mid-way, answers with a success status that are no completion
stream (HTML, empty bodies), timeouts, and a model calling a tool that does not exist. Every request the
upstream receives is checked against the strict (Anthropic-like) history rules.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.llm.litellm_child import TRIM_AT, trim_kept_chunks
from app.settings import Settings
from tests.fakes.upstream import FakeUpstream, Script, validate_history
from tests.llm.procfs import connection_owners, needs_proc, running
from tests.support.mcp import wait_for
from tests.support.server import LiveServer, free_port, live_server
from tests.support.sse import EventReader

pytestmark = pytest.mark.anyio

MODEL = "openai/fake-model"
LEAN_USER_AGENT = "parley"
# What a proxy or a misconfigured base URL answers instead of a completion.
HTML_PAGE = "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n<body>nginx</body></html>\n"


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(api_key="sk-test") as running:
        yield running


def _models_file(tmp_path: Path, api_base: str) -> Path:
    path = tmp_path / "models.json"
    path.write_text(
        json.dumps(
            {
                "providers": {
                    "fake": {
                        "api_base": api_base,
                        "api_key_env": "PARLEY_TEST_FAKE_KEY",
                        "context_window": 200_000,
                        "models": {MODEL: {"context_window": 1000}, "openai/unreachable": {}},
                    },
                    "down": {"api_base": f"http://127.0.0.1:{free_port()}/v1", "models": ["openai/down"]},
                }
            }
        )
    )
    return path


@pytest.fixture(params=["auto", "litellm"])
def stream_adapter(request: pytest.FixtureRequest) -> str:
    adapter: str = request.param
    return adapter


@pytest.fixture
def configured(
    settings: Settings,
    upstream: FakeUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stream_adapter: str,
) -> Settings:
    monkeypatch.setenv("PARLEY_TEST_FAKE_KEY", "sk-test")
    return settings.model_copy(
        update={
            "models_file": _models_file(tmp_path, upstream.base_url),
            "default_model": MODEL,
            "stream_adapter": stream_adapter,
        }
    )


@pytest.fixture
def server(configured: Settings) -> Iterator[LiveServer]:
    with live_server(configured) as running:
        yield running


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


async def _turn(server: LiveServer, content: str, *, model: str | None = None) -> tuple[str, EventReader]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        created = await client.post("/v1/sessions", json={"model": model} if model else {})
        assert created.status_code == 201, created.text
        sid = str(created.json()["id"])
    return sid, await _post(server, sid, content)


async def _history(server: LiveServer, sid: str) -> list[dict[str, object]]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        messages: list[dict[str, object]] = (await client.get(f"/v1/sessions/{sid}/messages")).json()[
            "chat_messages"
        ]
        return messages


def _assert_strictly_valid(upstream: FakeUpstream) -> None:
    for request in upstream.requests:
        assert validate_history(request.body["messages"]) == [], request.body["messages"]


async def test_text_with_usage_and_the_configured_window(
    server: LiveServer, upstream: FakeUpstream, stream_adapter: str
) -> None:
    upstream.enqueue(Script.text("Hello from the fake upstream.", chunks=4, usage=(100, 7)))
    _, reader = await _turn(server, "hi")
    assert "".join(d["text"] for d in reader.of_type("text_delta")) == "Hello from the fake upstream."
    done = reader.of_type("response_done")[0]
    assert done["response"]["usage"] == {
        "prompt_tokens": 100,
        "completion_tokens": 7,
        "total_tokens": 107,
        "estimated": False,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "reasoning_tokens": None,
    }
    assert done["response"]["finish_reason"] == "stop"
    usage = reader.of_type("token_usage")[0]
    assert (usage["context_used"], usage["context_window"], usage["context_percent"]) == (100, 1000, 10.0)
    assert usage["model"] == MODEL
    [request] = upstream.requests
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.body["stream_options"] == {"include_usage": True}
    assert request.body["messages"] == [{"role": "user", "content": "hi"}]
    assert request.body["model"] == "fake-model"  # the bare name, as LiteLLM resolves it
    # Which reader sent it: the lean one names itself, LiteLLM's goes through the openai SDK.
    assert (request.headers["user-agent"] == LEAN_USER_AGENT) is (stream_adapter == "auto")


async def test_a_long_answer_keeps_every_chunk_and_the_providers_usage(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    """Longer than the LiteLLM adapter's trimming threshold (it drops the chunks LiteLLM keeps): every
    text chunk still arrives, in order, and the usage is the provider's own."""
    words = [f"w{i} " for i in range(3 * TRIM_AT)]
    upstream.enqueue(Script.text("".join(words), chunks=len(words), usage=(321, len(words))))
    sid, reader = await _turn(server, "a long one")
    assert "".join(d["text"] for d in reader.of_type("text_delta")) == "".join(words)
    done = reader.of_type("response_done")[0]
    assert done["response"]["usage"] == {
        "prompt_tokens": 321,
        "completion_tokens": len(words),
        "total_tokens": 321 + len(words),
        "estimated": False,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "reasoning_tokens": None,
    }
    assert reader.of_type("token_usage")[0]["context_used"] == 321
    texts = [m for m in await _history(server, sid) if m["type"] == "text" and m.get("model")]
    assert [m["content"] for m in texts] == ["".join(words)]


def test_trimming_keeps_usage_chunks_and_the_last_two_in_order() -> None:
    @dataclass
    class Chunk:
        n: int
        usage: object = None

    chunks: list[Any] = [Chunk(n, usage={"prompt_tokens": n} if n in (3, 70) else None) for n in range(80)]
    trim_kept_chunks(chunks)
    assert [c.n for c in chunks] == [3, 70, 78, 79]
    trim_kept_chunks(chunks)  # again: nothing more to drop
    assert [c.n for c in chunks] == [3, 70, 78, 79]


async def test_fragmented_parallel_tool_calls_then_answer(server: LiveServer, upstream: FakeUpstream) -> None:
    upstream.enqueue(
        Script.tool_calls(
            [
                ("call_a", "current_time", '{"timezone": "UTC"}'),
                ("call_b", "calculate", '{"expression": "6*7"}'),
            ],
            fragments=4,
            text_before="Checking.",
        ),
        Script.text("It is late and the answer is 42."),
    )
    sid, reader = await _turn(server, "time and 6*7?")
    starts = reader.of_type("tool_exec_start")
    assert [s["tool_call"] for s in starts] == [
        {"id": "call_a", "name": "current_time", "arguments": {"timezone": "UTC"}},
        {"id": "call_b", "name": "calculate", "arguments": {"expression": "6*7"}},
    ]
    ends = {e["tool_result"]["tool_call_id"]: e["tool_result"] for e in reader.of_type("tool_exec_end")}
    assert ends["call_b"] == {"tool_call_id": "call_b", "content": "42", "is_error": False}
    assert ends["call_a"]["is_error"] is False
    second = upstream.requests[1].body["messages"]
    assert second[1]["role"] == "assistant"
    assert [c["id"] for c in second[1]["tool_calls"]] == ["call_a", "call_b"]
    assert [(m["role"], m["tool_call_id"]) for m in second[2:]] == [("tool", "call_a"), ("tool", "call_b")]
    assert second[3]["content"] == "42"
    _assert_strictly_valid(upstream)
    kinds = [m["type"] for m in await _history(server, sid)]
    assert kinds == ["turn_start", "text", "text", "tool_group", "tool_group", "text", "turn_done"]


async def test_reasoning_content_streams_as_reasoning_and_never_goes_back(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(
        Script.tool_calls([("call_a", "current_time", '{"timezone": "UTC"}')], thinking="The clock knows."),
        Script.text("It is noon.", thinking="Noon, said the tool."),
    )
    sid, reader = await _turn(server, "time?")
    assert reader.of_type("turn_done")[0]["status"] == "completed"
    deltas = reader.of_type("reasoning_delta")
    assert "".join(d["text"] for d in deltas) == "The clock knows.Noon, said the tool."
    assert deltas[0]["model"] == MODEL
    assert "".join(d["text"] for d in reader.of_type("text_delta")) == "It is noon."
    # OpenAI-compatible providers take no reasoning back
    assert "thinking_blocks" not in json.dumps(upstream.requests[1].body)
    assert "The clock knows" not in json.dumps(upstream.requests[1].body)
    _assert_strictly_valid(upstream)
    history = await _history(server, sid)
    kinds = [m["type"] for m in history]
    assert kinds == ["turn_start", "text", "reasoning", "tool_group", "reasoning", "text", "turn_done"]


async def test_unknown_tool_is_an_error_result_not_a_crash(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(Script.tool_calls([("call_x", "launch_rockets", "{}")]), Script.text("Sorry."))
    _, reader = await _turn(server, "launch")
    result = reader.of_type("tool_exec_end")[0]["tool_result"]
    assert result["is_error"] is True
    assert "Unknown tool 'launch_rockets'" in result["content"]
    assert reader.of_type("turn_done")[0]["status"] == "completed"
    assert upstream.requests[1].body["messages"][-1]["content"] == result["content"]


@pytest.mark.parametrize(
    ("script", "code", "requests"),
    [
        (Script.error(401), "provider_auth_failed", 1),
        # Refused for the window, a call is compacted harder and made once more (docs/context.md).
        (Script.context_length_exceeded(), "context_window_exceeded", 2),
        (Script.error(400), "provider_bad_request", 1),
        (Script.error(403), "provider_bad_request", 1),  # OpenAI's body says invalid_request_error
        (Script.error(403, type="permission_error"), "provider_forbidden", 1),
        (Script.error(404), "provider_model_not_found", 1),
        (Script.error(422), "provider_bad_request", 1),
        (Script.error(500), "provider_error", 3),
        (Script.error(502), "provider_error", 3),
        (Script.error(503), "provider_unavailable", 3),
        (Script.error(504), "provider_timeout", 3),
        (Script.error(429), "provider_rate_limited", 3),
        (Script.cut("one two three", after=0), "provider_stream_interrupted", 1),
        (Script.cut("one two three", after=1), "provider_stream_interrupted", 1),
        (Script.text("one two three", error_after=1), "provider_stream_interrupted", 1),
    ],
)
async def test_provider_errors_fail_the_turn_cleanly(
    server: LiveServer, upstream: FakeUpstream, script: Script, code: str, requests: int
) -> None:
    upstream.enqueue(*([script] * requests))
    sid, reader = await _turn(server, "hi")
    assert len(upstream.requests) == requests
    error = reader.of_type("error")[0]
    assert error["code"] == code
    assert error["model"] == MODEL
    assert "Traceback" not in error["message"]
    types = [e.event for e in reader.events]
    assert types[-3:] == ["error", "agent_status", "turn_done"]
    assert reader.of_type("turn_done")[0]["status"] == "failed"
    history = await _history(server, sid)
    assert [m["type"] for m in history] == ["turn_start", "text", "error", "turn_done"]
    assert history[2]["content"] == error["message"]
    assert history[2]["code"] == code

    upstream.enqueue(Script.text("Back to normal."))
    again = await _post(server, sid, "again")
    assert again.of_type("turn_done")[0]["status"] == "completed"


async def test_retry_before_output_recovers(server: LiveServer, upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.error(503), Script.text("Recovered."))
    _, reader = await _turn(server, "hi")
    assert len(upstream.requests) == 2
    assert reader.of_type("error") == []
    assert "".join(d["text"] for d in reader.of_type("text_delta")) == "Recovered."


async def test_a_providers_retry_after_is_waited_out_before_the_retry(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    """How it proves it: the second request cannot arrive before the wait the first answer asked for (a
    lower bound the server must respect, not a timing of the server)."""
    upstream.enqueue(Script.error(429, retry_after=1.5), Script.text("Waited."))
    _, reader = await _turn(server, "hi")
    first, second = upstream.requests
    assert second.received_at - first.received_at >= 1.5
    assert reader.of_type("error") == []
    assert reader.of_type("turn_done")[0]["status"] == "completed"


@pytest.mark.parametrize("headers", [{"retry-after": "120"}, {"retry-after-ms": "120000"}])
async def test_a_retry_after_longer_than_the_server_waits_fails_at_once_and_says_it(
    server: LiveServer, upstream: FakeUpstream, headers: dict[str, str]
) -> None:
    upstream.enqueue(Script.error(429, headers=headers))
    _, reader = await _turn(server, "hi")
    assert len(upstream.requests) == 1  # not retried: PARLEY_PROVIDER_RETRY_MAX_WAIT is 10 s
    [error] = reader.of_type("error")
    assert (error["code"], error["retry_after"]) == ("provider_rate_limited", 120)
    assert reader.of_type("turn_done")[0]["status"] == "failed"


async def test_a_stop_ends_the_wait_for_a_retry_at_once(server: LiveServer, upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.error(503, retry_after=9), Script.text("Never asked for."))
    async with (
        httpx.AsyncClient(base_url=server.base_url, timeout=30) as client,
    ):
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            assert (
                await client.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"})
            ).status_code == 202
            await upstream.await_request(lambda r: r.status == 503, within=10.0)
            asked = time.monotonic()
            assert (await client.post(f"/v1/sessions/{sid}/cancel", json={})).status_code == 202
            await reader.wait_type("turn_done")
            # Far less than the 9 s asked: the stop cancelled the wait (a bound against hanging).
            assert time.monotonic() - asked < 5
    assert reader.of_type("turn_done")[0]["status"] == "cancelled"
    assert len(upstream.requests) == 1


@pytest.mark.parametrize(
    "script",
    [
        pytest.param(Script.cut("one two three four five six", after=3, chunks=6), id="cut"),
        # The body ends as a complete one would, but with neither a finish_reason nor [DONE].
        pytest.param(Script.text("one two three four five six", chunks=6, end_after=3), id="ended-early"),
    ],
)
async def test_stream_cut_midway_keeps_partial_text_and_is_not_retried(
    server: LiveServer, upstream: FakeUpstream, script: Script
) -> None:
    upstream.enqueue(script)
    sid, reader = await _turn(server, "hi")
    assert len(upstream.requests) == 1
    error = reader.of_type("error")[0]
    assert error["code"] == "provider_stream_interrupted"
    assert reader.of_type("turn_done")[0]["status"] == "failed"
    streamed = "".join(d["text"] for d in reader.of_type("text_delta"))
    assert streamed
    history = await _history(server, sid)
    assert [m["type"] for m in history] == ["turn_start", "text", "text", "error", "turn_done"]
    partial = next(m for m in history if m["type"] == "text" and m["role"] == "assistant")
    assert partial["content"] == streamed
    assert partial["interrupted"] is True
    assert history[3]["content"] == error["message"]

    upstream.enqueue(Script.text("Fine now."))
    again = await _post(server, sid, "again")
    assert again.of_type("turn_done")[0]["status"] == "completed"
    seen = upstream.requests[-1].body["messages"]
    assert seen[1] == {"role": "assistant", "content": f"{streamed}\n\n[interrupted]"}
    _assert_strictly_valid(upstream)


@pytest.mark.parametrize(
    ("script", "says"),
    [
        pytest.param(Script.raw(HTML_PAGE), "HTML (text/html)", id="html"),
        pytest.param(Script(sse_body=HTML_PAGE), "", id="html-as-event-stream"),
        pytest.param(Script.raw("", content_type="application/json"), "an empty body", id="empty"),
        pytest.param(Script(sse_body=""), "an empty body", id="empty-event-stream"),
        pytest.param(
            Script.raw('{"object": "list"}', content_type="application/json"), "application/json", id="json"
        ),
    ],
)
async def test_an_answer_that_is_no_completion_stream_is_a_provider_error(
    server: LiveServer,
    upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
    script: Script,
    says: str,
) -> None:
    """A 200 that carries no completion (a proxy's HTML page, an empty body, HTML sent as an event stream)
    fails the turn with a message saying what came back, and a log line showing it; nothing was
    streamed, so it is retried first."""
    upstream.enqueue(*([script] * 3))
    with caplog.at_level(logging.WARNING):
        sid, reader = await _turn(server, "hi")
    assert len(upstream.requests) == 3
    assert reader.of_type("text_delta") == []
    error = reader.of_type("error")[0]
    assert error["code"] == "provider_bad_response"
    assert says in error["message"]
    assert reader.of_type("turn_done")[0]["status"] == "failed"
    history = await _history(server, sid)
    assert [m["type"] for m in history] == ["turn_start", "text", "error", "turn_done"]
    assert (history[2]["code"], history[2]["content"]) == ("provider_bad_response", error["message"])
    logged = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "200" in r.getMessage()
    ]
    assert logged, [r.getMessage() for r in caplog.records]
    assert all("sk-test" not in line for line in caplog.messages)

    upstream.enqueue(Script.text("Back to normal."))
    again = await _post(server, sid, "again")
    assert again.of_type("turn_done")[0]["status"] == "completed"
    assert "".join(d["text"] for d in again.of_type("text_delta")) == "Back to normal."
    _assert_strictly_valid(upstream)


async def test_a_stream_with_a_finish_reason_but_no_done_completes(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    # The role chunk, three pieces, the finish chunk; then the body ends.
    upstream.enqueue(Script.text("one two three", chunks=3, usage=None, end_after=5))
    _, reader = await _turn(server, "hi")
    assert reader.of_type("error") == []
    assert reader.of_type("turn_done")[0]["status"] == "completed"
    assert "".join(d["text"] for d in reader.of_type("text_delta")) == "one two three"


@pytest.fixture
def impatient_server(configured: Settings) -> Iterator[LiveServer]:
    """provider_timeout 0.5 s: the longest wait for any one read from the provider."""
    with live_server(configured.model_copy(update={"provider_timeout": 0.5})) as running:
        yield running


@pytest.mark.parametrize(
    ("script", "requests"),
    [
        pytest.param(Script.hang(3), 3, id="no-headers"),  # no answer at all: retried
        # The headers and the role chunk, then nothing for longer than the timeout: nothing was streamed,
        # so retried like no answer at all.
        pytest.param(Script.text("one two three", chunks=3, delay=1.5), 3, id="stall-before-text"),
        pytest.param(Script.text("one two three", chunks=3, stall_after=1), 3, id="silent-before-text"),
    ],
)
async def test_a_read_that_waits_too_long_fails_the_turn(
    impatient_server: LiveServer, upstream: FakeUpstream, script: Script, requests: int
) -> None:
    upstream.enqueue(*([script] * requests))
    _, reader = await _turn(impatient_server, "hi")
    assert reader.of_type("error")[0]["code"] == "provider_timeout"
    assert len(upstream.requests) == requests
    # The upstream sees each hang-up when its own server notices it, just after the turn ends.
    await wait_for(lambda: all(r.disconnected for r in upstream.requests), what="every request hung up")


async def test_a_stall_mid_stream_is_a_timeout_that_keeps_the_partial_text(
    impatient_server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(Script.text("one two three four", chunks=4, stall_after=3))  # role chunk and two pieces
    sid, reader = await _turn(impatient_server, "hi")
    [request] = upstream.requests  # text reached the client: not retried
    await wait_for(lambda: request.disconnected, what="the request hung up")
    assert reader.of_type("error")[0]["code"] == "provider_timeout"
    assert reader.of_type("turn_done")[0]["status"] == "failed"
    streamed = "".join(d["text"] for d in reader.of_type("text_delta"))
    assert streamed and "one two three four".startswith(streamed)
    history = await _history(impatient_server, sid)
    partial = [m for m in history if m["type"] == "text" and m["role"] == "assistant"]
    assert [(m["content"], m["interrupted"]) for m in partial] == [(streamed, True)]

    upstream.enqueue(Script.text("Fine now."))
    again = await _post(impatient_server, sid, "again")
    assert again.of_type("turn_done")[0]["status"] == "completed"
    assert upstream.requests[-1].body["messages"][1]["content"] == f"{streamed}\n\n[interrupted]"
    _assert_strictly_valid(upstream)


async def test_the_timeout_bounds_each_read_not_the_whole_stream(
    impatient_server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(Script.text("one two three four", chunks=4, delay=0.3))  # ~1.5 s in all
    _, reader = await _turn(impatient_server, "hi")
    assert reader.of_type("error") == []
    assert "".join(d["text"] for d in reader.of_type("text_delta")) == "one two three four"


async def test_unreachable_provider(server: LiveServer) -> None:
    _, reader = await _turn(server, "hi", model="openai/down")
    assert reader.of_type("error")[0]["code"] == "provider_unreachable"
    assert reader.of_type("turn_done")[0]["status"] == "failed"


async def test_patching_the_model_switches_it_between_turns(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    sid, first = await _turn(server, "hello", model="parley/demo")
    assert {d["model"] for d in first.of_type("text_delta") if "model" in d} == {"parley/demo"}
    assert upstream.requests == []
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        patched = (await client.patch(f"/v1/sessions/{sid}", json={"model": MODEL})).json()
    assert (patched["model"], patched["context_window"]) == (MODEL, 1000)

    upstream.enqueue(Script.text("From the other model."))
    second = await _post(server, sid, "and now?")
    assert second.of_type("user_message")[0]["model"] == MODEL
    assert second.of_type("text_delta")[0]["model"] == MODEL
    assert second.of_type("token_usage")[0]["context_window"] == 1000
    [request] = upstream.requests
    assert [m["role"] for m in request.body["messages"]] == ["user", "assistant", "user"]
    history = await _history(server, sid)
    models = [m.get("model") for m in history if m["type"] == "text" and m["role"] == "assistant"]
    assert models == ["parley/demo", MODEL]


# --- the LiteLLM child process dies -------------------------------------------------------------------------


# Only LiteLLM's stream has a child process: these tests set `stream_adapter` instead of running with both.
LITELLM_ONLY = pytest.mark.parametrize("stream_adapter", ["litellm"])


async def _kill_the_reader(upstream: FakeUpstream) -> int:
    """SIGKILL to the process holding the connection to the upstream: LiteLLM's child, not this process."""
    [reader] = connection_owners(upstream.port)
    assert reader != os.getpid()
    os.kill(reader, signal.SIGKILL)
    return reader


async def _turn_killing_the_reader(
    server: LiveServer, upstream: FakeUpstream, *, when_text: bool
) -> tuple[str, EventReader, int]:
    """A turn whose LiteLLM child is killed once text streamed (`when_text`), else once the upstream has
    the request; returns the session, its events to turn_done, and the killed pid."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        created = await client.post("/v1/sessions", json={})
        assert created.status_code == 201, created.text
        sid = str(created.json()["id"])
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            posted = await client.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"})
            assert posted.status_code == 202
            if when_text:
                await reader.wait_type("text_delta", count=2)
            else:
                await upstream.await_request(lambda _: True, within=10)
            killed = await _kill_the_reader(upstream)
            await reader.wait_type("turn_done")
    return sid, reader, killed


@needs_proc
@LITELLM_ONLY
async def test_a_killed_litellm_child_fails_the_turn_and_the_next_turn_works(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(Script.text(" ".join(f"w{n}" for n in range(200)), chunks=200, delay=0.05))
    sid, reader, killed = await _turn_killing_the_reader(server, upstream, when_text=True)
    # Text had reached the client: not retried; the turn fails with the error of a child that died.
    assert len(upstream.requests) == 1
    assert reader.of_type("error")[0]["code"] == "provider_stream_interrupted"
    assert reader.of_type("turn_done")[0]["status"] == "failed"
    streamed = "".join(d["text"] for d in reader.of_type("text_delta"))
    history = await _history(server, sid)
    partial = [m for m in history if m["type"] == "text" and m["role"] == "assistant"]
    assert [(m["content"], m["interrupted"]) for m in partial] == [(streamed, True)]
    assert not running(killed)

    upstream.enqueue(Script.text("Back to normal."))
    again = await _post(server, sid, "again")  # in a new child
    assert again.of_type("turn_done")[0]["status"] == "completed"
    assert "".join(d["text"] for d in again.of_type("text_delta")) == "Back to normal."


@needs_proc
@LITELLM_ONLY
async def test_a_litellm_child_killed_before_any_text_is_retried_in_a_new_one(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(Script.hang(30), Script.text("Retried."))
    _, reader, killed = await _turn_killing_the_reader(server, upstream, when_text=False)
    assert reader.of_type("error") == []
    assert reader.of_type("turn_done")[0]["status"] == "completed"
    assert "".join(d["text"] for d in reader.of_type("text_delta")) == "Retried."
    first, second = upstream.requests
    assert first.disconnected and second.done
    assert not running(killed)
