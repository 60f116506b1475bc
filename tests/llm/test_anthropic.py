"""The native Anthropic reader (app/llm/anthropic.py) against the fake Messages API over real HTTP.

The fake validates every request as Anthropic does (tests/fakes/strict.py, `validate_messages_request`):
`max_tokens`, alternating roles from a user message, tool results answering the previous message's
tool_use blocks, no empty text blocks, no system role among the messages. Covered: the request mapping
and its cache breakpoints, text, tool calls with streamed JSON input (several in one response), thinking
blocks that change nothing, a stop mid-text and mid-tool-input (the fake sees the disconnect), errors
mid-stream, HTTP errors, a stream cut short, HTML with status 200, malformed events, cache usage.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest

from app.llm.anthropic import (
    AnthropicAdapter,
    AnthropicEndpoint,
    EventReader,
    convert_messages,
    messages_url,
    request_body,
)
from app.llm.openai_compat import new_http_client
from app.llm.types import (
    FinishPart,
    ModelRequest,
    ProviderError,
    ReasoningPart,
    ResolvedModel,
    StreamPart,
    TextPart,
    ToolCallPart,
    UsagePart,
)
from tests.fakes import anthropic as fake_anthropic
from tests.fakes.strict import validate_messages_request
from tests.fakes.upstream import FakeUpstream, Script

pytestmark = pytest.mark.anyio

KEY = "sk-ant-test"
DISCONNECT_BOUND = 1.0  # generous: checks that the upstream sees the close, not how fast
CALLS = [
    ("toolu_a", "current_time", '{"timezone": "UTC"}'),
    ("toolu_b", "calculate", '{"expression": "6*7"}'),
]
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "current_time",
            "description": "The time.",
            "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Arithmetic.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    },
]
# A tool round and a new user turn, as the agent keeps the history (OpenAI's format).
HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "time and 6*7?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in CALLS
        ],
    },
    {"role": "tool", "tool_call_id": "toolu_a", "content": "12:00"},
    {"role": "tool", "tool_call_id": "toolu_b", "content": "42"},
    {"role": "assistant", "content": "It is 12:00; 6*7 is 42."},
    {"role": "user", "content": "thanks"},
    {"role": "user", "content": "and now?"},
]


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(api_key=KEY) as running:
        yield running


@asynccontextmanager
async def reader(upstream: FakeUpstream, *, prompt_cache: bool = True) -> AsyncIterator[AnthropicAdapter]:
    client = new_http_client()
    try:
        endpoint = AnthropicEndpoint(
            messages_url(upstream.root_url), "claude-test", KEY, max_tokens=1000, prompt_cache=prompt_cache
        )
        yield AnthropicAdapter(client, endpoint)
    finally:
        await client.close()


def _request(
    messages: Sequence[dict[str, Any]] | None = None,
    tools: Sequence[dict[str, Any]] = (),
    timeout: float = 10.0,
) -> ModelRequest:
    return ModelRequest(
        ResolvedModel("anthropic/claude-test", None),
        messages if messages is not None else [{"role": "user", "content": "hi"}],
        list(tools),
        timeout,
    )


async def _parts(upstream: FakeUpstream, request: ModelRequest | None = None) -> list[StreamPart]:
    async with reader(upstream) as adapter:
        return [part async for part in adapter.stream(request or _request())]


def _calls(parts: list[StreamPart]) -> dict[int, tuple[str | None, str | None, str]]:
    calls: dict[int, tuple[str | None, str | None, str]] = {}
    for part in parts:
        if isinstance(part, ToolCallPart):
            call_id, name, arguments = calls.get(part.index, (None, None, ""))
            calls[part.index] = (call_id or part.id, name or part.name, arguments + part.arguments)
    return calls


def _text(parts: list[StreamPart]) -> str:
    return "".join(p.text for p in parts if isinstance(p, TextPart))


async def _failure(upstream: FakeUpstream, script: Script) -> ProviderError:
    upstream.enqueue(script)
    with pytest.raises(ProviderError) as raised:
        await _parts(upstream)
    return raised.value


# --- the request --------------------------------------------------------------------------------------


def test_the_history_becomes_alternating_messages_of_blocks() -> None:
    system, messages = convert_messages(HISTORY)
    assert system == ["Be brief."]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[1]["content"] == [  # the empty text left out, the arguments as objects
        {"type": "tool_use", "id": "toolu_a", "name": "current_time", "input": {"timezone": "UTC"}},
        {"type": "tool_use", "id": "toolu_b", "name": "calculate", "input": {"expression": "6*7"}},
    ]
    assert messages[2]["content"] == [  # both results in one user message
        {"type": "tool_result", "tool_use_id": "toolu_a", "content": "12:00"},
        {"type": "tool_result", "tool_use_id": "toolu_b", "content": "42"},
    ]
    assert messages[4]["content"] == [
        {"type": "text", "text": "thanks"},
        {"type": "text", "text": "and now?"},
    ]


def test_cache_breakpoints_on_the_system_prompt_the_last_tool_and_the_message_before_the_new_turn() -> None:
    endpoint = AnthropicEndpoint("http://x/v1/messages", "claude-test", KEY, max_tokens=1000)
    body = request_body(endpoint, _request(HISTORY, TOOLS))
    assert body["max_tokens"] == 1000
    assert body["system"] == [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    assert [t.get("cache_control") for t in body["tools"]] == [None, {"type": "ephemeral"}]
    assert body["tools"][0]["input_schema"] == TOOLS[0]["function"]["parameters"]
    marked = [
        (n, k)
        for n, message in enumerate(body["messages"])
        for k, block in enumerate(message["content"])
        if "cache_control" in block
    ]
    assert marked == [(3, 0)]  # the assistant's answer, before the user's new turn
    assert validate_messages_request(body) == []

    off = AnthropicEndpoint("http://x/v1/messages", "claude-test", KEY, max_tokens=1000, prompt_cache=False)
    assert "cache_control" not in json.dumps(request_body(off, _request(HISTORY, TOOLS)))


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "system"),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
            },
            "alternate",
        ),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "assistant", "content": "a"}]}, "first"),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "text", "text": " "}]}],
            },
            "non-whitespace",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x"}]}
                ],
            },
            "unexpected tool_use_id",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [
                    {"role": "user", "content": "a"},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t1", "name": "n", "input": {}}],
                    },
                    {"role": "user", "content": "b"},
                ],
            },
            "without tool_result",
        ),
    ],
)
def test_the_fake_refuses_what_anthropic_refuses(body: dict[str, Any], problem: str) -> None:
    problems = validate_messages_request(body)
    assert any(problem in p for p in problems), problems


# --- the stream ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 7, 64, 100_000])
def test_events_in_pieces_of_any_size_give_the_same_parts(size: int) -> None:
    script = Script.tool_calls(CALLS, text_before="Checking.", thinking="Hmm.", redacted_thinking=True)
    wire = b"".join(frame for frame, _ in fake_anthropic.events(script, model="m", message_id="msg_1"))
    wire = wire.replace(b"\n", b"\r\n")  # CRLF line ends read the same
    events = EventReader()
    parts: list[StreamPart] = []
    for start in range(0, len(wire), size):
        parts += events.feed(wire[start : start + size])
        events.check()
    assert events.done
    assert _text(parts) == "Checking."
    assert _calls(parts) == {0: CALLS[0], 1: CALLS[1]}
    assert (events.usage().prompt_tokens, events.finish()) == (10, FinishPart("tool_calls"))


async def test_text_with_usage_and_the_headers(upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.text("Hello from Claude.", chunks=4, usage=(30, 6), cache=(100, 20)))
    parts = await _parts(upstream, _request(HISTORY, TOOLS))
    assert _text(parts) == "Hello from Claude."
    assert parts[-2:] == [
        UsagePart(
            prompt_tokens=150,
            completion_tokens=6,
            total_tokens=156,
            cache_read_tokens=100,
            cache_write_tokens=20,
        ),
        FinishPart("stop"),
    ]
    [request] = upstream.requests
    assert request.path == "/v1/messages"
    assert request.problems == []
    assert request.headers["x-api-key"] == KEY
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in request.headers
    assert request.body["stream"] is True
    assert request.body["model"] == "claude-test"


async def test_several_tool_calls_with_streamed_json_input(upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.tool_calls(CALLS, fragments=4, text_before="Checking."))
    parts = await _parts(upstream)
    assert _text(parts) == "Checking."
    assert _calls(parts) == {0: CALLS[0], 1: CALLS[1]}
    assert sum(1 for p in parts if isinstance(p, ToolCallPart) and p.arguments) == 8  # the JSON as it came
    assert parts[-1] == FinishPart("tool_calls")


async def test_a_call_without_arguments_gets_an_empty_object(upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.tool_calls([("toolu_n", "current_time", "")]))
    assert _calls(await _parts(upstream)) == {0: ("toolu_n", "current_time", "{}")}


async def test_thinking_and_redacted_thinking_are_reasoning_parts(upstream: FakeUpstream) -> None:
    upstream.enqueue(
        Script.tool_calls(
            CALLS[:1], text_before="Let me look.", thinking="The user wants the time.", redacted_thinking=True
        )
    )
    parts = await _parts(upstream)
    assert _text(parts) == "Let me look."
    assert _calls(parts) == {0: CALLS[0]}
    assert parts[-1] == FinishPart("tool_calls")
    reasoning = [p for p in parts if isinstance(p, ReasoningPart)]
    assert "".join(p.text for p in reasoning) == "The user wants the time."
    assert [p.signature for p in reasoning if p.signature] == [fake_anthropic.SIGNATURE]
    assert [p.redacted for p in reasoning if p.redacted] == [fake_anthropic.REDACTED]
    # all of it before the text
    first_text = next(n for n, p in enumerate(parts) if isinstance(p, TextPart))
    assert max(parts.index(p) for p in reasoning) < first_text


def test_thinking_goes_back_signed_first_in_the_tool_round_and_max_tokens_exceeds_the_budget() -> None:
    endpoint = AnthropicEndpoint(
        url="http://x/v1/messages", model="claude", api_key="k", max_tokens=2048, thinking_budget=2048
    )
    blocks: list[dict[str, Any]] = [
        {"type": "thinking", "thinking": "Look it up.", "signature": "sig"},
        {"type": "thinking", "thinking": "unsigned: cannot go back"},
        {"type": "redacted_thinking", "data": "enc"},
    ]
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "Time?"},
        {
            "role": "assistant",
            "content": None,
            "thinking_blocks": blocks,
            "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "now", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "noon"},
    ]
    body = request_body(endpoint, _request(history, []))
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert body["max_tokens"] > 2048
    kinds = [b["type"] for b in body["messages"][1]["content"]]
    assert kinds == ["thinking", "redacted_thinking", "tool_use"]
    assert body["messages"][1]["content"][0]["signature"] == "sig"
    assert validate_messages_request(body) == []
    # without the thinking block the fake refuses the tool round, as Anthropic does
    del history[1]["thinking_blocks"]
    problems = validate_messages_request(request_body(endpoint, _request(history, [])))
    assert any("must start with a thinking block" in problem for problem in problems)


async def test_a_tool_round_then_an_answer_is_a_valid_history(upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.text("Noted."))
    parts = await _parts(upstream, _request(HISTORY[:5], TOOLS))
    assert _text(parts) == "Noted."
    assert upstream.requests[0].problems == []


@pytest.mark.parametrize("where", ["text", "tool input"])
async def test_a_stop_mid_stream_disconnects_the_upstream(upstream: FakeUpstream, where: str) -> None:
    if where == "text":
        upstream.enqueue(Script.text("one two three four five six", chunks=6, delay=0.05))
    else:
        upstream.enqueue(Script.tool_calls(CALLS[:1], fragments=6, delay=0.05))
    async with reader(upstream) as adapter:
        stream = adapter.stream(_request())
        async for part in stream:
            if isinstance(part, TextPart) or (isinstance(part, ToolCallPart) and part.arguments):
                break
        closed_at = time.monotonic()
        await stream.aclose()
        request = await upstream.await_disconnect(within=5.0)
    assert request.disconnected_at is not None
    assert request.disconnected_at - closed_at < DISCONNECT_BOUND
    assert request.content_sent < 6


async def test_an_overloaded_error_mid_stream(upstream: FakeUpstream) -> None:
    error = await _failure(upstream, Script.text("Hello there.", chunks=4, error_after=4))
    assert (error.code, error.retryable) == ("provider_stream_interrupted", True)


@pytest.mark.parametrize(
    ("status", "message", "code", "retryable"),
    [
        (
            429,
            "Number of request tokens has exceeded your per-minute rate limit",
            "provider_rate_limited",
            True,
        ),
        (529, "Overloaded", "provider_unavailable", True),
        (401, "invalid x-api-key", "provider_auth_failed", False),
        (400, "prompt is too long: 210000 tokens > 200000 maximum", "context_window_exceeded", False),
        (
            400,
            "messages: text content blocks must contain non-whitespace text",
            "provider_bad_request",
            False,
        ),
        (500, "Internal server error", "provider_error", True),
    ],
)
async def test_http_errors(
    upstream: FakeUpstream, status: int, message: str, code: str, retryable: bool
) -> None:
    headers = {"retry-after": "3"} if status == 429 else {}
    body = fake_anthropic.error_body(status, message)
    error = await _failure(upstream, Script.error(status, body=body, headers=headers))
    assert (error.code, error.status, error.retryable) == (code, status, retryable)


async def test_a_stream_cut_short(upstream: FakeUpstream) -> None:
    error = await _failure(upstream, Script.text("Hello there.", chunks=4, cut_after=4))
    assert error.code == "provider_stream_interrupted"


async def test_a_stream_that_ends_before_message_stop(upstream: FakeUpstream) -> None:
    error = await _failure(upstream, Script.text("Hello there.", chunks=4, end_after=5))
    assert (error.code, error.retryable) == ("provider_stream_interrupted", False)


async def test_html_with_status_200(upstream: FakeUpstream) -> None:
    page = "<!DOCTYPE html>\n<html><body>502 Bad Gateway</body></html>\n"
    error = await _failure(upstream, Script.raw(page))
    assert (error.code, error.retryable) == ("provider_bad_response", True)
    assert "HTML" in error.message


async def test_a_malformed_event(upstream: FakeUpstream) -> None:
    body = (
        'event: message_start\ndata: {"type": "message_start", "message": {"usage": {}}}\n\ndata: {nope\n\n'
    )
    error = await _failure(upstream, Script.raw(body, content_type="text/event-stream"))
    assert error.code == "provider_stream_interrupted"


async def test_no_key_fails_before_any_request(upstream: FakeUpstream) -> None:
    client = new_http_client()
    try:
        adapter = AnthropicAdapter(
            client, AnthropicEndpoint(messages_url(upstream.root_url), "claude-test", None)
        )
        with pytest.raises(ProviderError) as raised:
            [part async for part in adapter.stream(_request())]
    finally:
        await client.close()
    assert raised.value.code == "provider_auth_missing"
    assert upstream.requests == []


async def test_the_connection_is_reused_after_a_complete_stream(upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.text("one"), Script.text("two"))
    async with reader(upstream) as adapter:
        first = [p async for p in adapter.stream(_request())]
        second = [p async for p in adapter.stream(_request())]
    assert (_text(first), _text(second)) == ("one", "two")
    assert upstream.requests[0].connection == upstream.requests[1].connection
