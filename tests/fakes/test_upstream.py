"""Proves the fake upstream against the real clients: LiteLLM's `openai/` path, raw httpx, and the CLI.

If these pass, tests built on `FakeUpstream` exercise the same parsing, error mapping and cancellation
code that production traffic does. Also unit-tests the Anthropic-style `validate_history`.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.fakes import FakeUpstream, RecordedRequest, Script, ToolCall, validate_history
from tests.fakes.directive import bench_content
from tests.fakes.script import WORDS

# Must precede `import litellm`: otherwise import fetches the cost map over the network (as
# measured here) and token counting may try the HF hub.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import litellm

litellm.suppress_debug_info = True

# litellm 1.102.4 with this pydantic warns on the real code path, which filterwarnings=error turns into
# failures inside litellm: a `ReadOnly` TypedDict item when its `Message` schema is first built, and
# `model_fields`/`model_computed_fields` read on instances for every streamed chunk. Not about the fake.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Item 'summary' on TypedDict class:UserWarning"),
    pytest.mark.filterwarnings(
        "ignore:Accessing the 'model_.*' attribute on the instance is deprecated:DeprecationWarning"
    ),
]

USER = [{"role": "user", "content": "What time is it?"}]


@pytest.fixture(scope="module")
def server() -> Iterator[FakeUpstream]:
    with FakeUpstream() as upstream:
        yield upstream


@pytest.fixture
def upstream(server: FakeUpstream) -> FakeUpstream:
    server.reset()
    return server


@dataclass
class Turn:
    text: str = ""
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish: str | None = None
    usage: Any = None
    chunks: int = 0


async def stream_turn(upstream: FakeUpstream, messages: list[dict[str, Any]] = USER, **kw: Any) -> Turn:
    """Consume one streamed completion the way the service will: accumulate tool calls by index."""
    s = await litellm.acompletion(
        model="openai/fake",
        api_base=upstream.base_url,
        api_key="k",
        stream=True,
        stream_options={"include_usage": True},
        max_retries=0,
        messages=messages,
        **kw,
    )
    turn = Turn()
    try:
        async for ch in s:
            turn.chunks += 1
            if ch.choices:
                delta = ch.choices[0].delta
                turn.text += delta.content or ""
                for tc in delta.tool_calls or []:
                    acc = turn.calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                    acc["id"] = acc["id"] or tc.id
                    acc["name"] = acc["name"] or tc.function.name
                    acc["arguments"] += tc.function.arguments or ""
                turn.finish = ch.choices[0].finish_reason or turn.finish
            turn.usage = getattr(ch, "usage", None) or turn.usage
    finally:
        await s.aclose()
    return turn


# ----- LiteLLM, happy paths ---------------------------------------------------------------------------


def test_litellm_streams_default_text_with_usage(upstream: FakeUpstream) -> None:
    turn = asyncio.run(stream_turn(upstream))
    assert turn.text == "Hello from fake upstream."
    assert turn.finish == "stop"
    assert (turn.usage.prompt_tokens, turn.usage.completion_tokens, turn.usage.total_tokens) == (10, 5, 15)
    [rec] = upstream.requests
    assert rec.headers["authorization"] == "Bearer k"
    assert rec.body["stream_options"] == {"include_usage": True}
    assert rec.body["messages"] == USER
    assert (rec.status, rec.done, rec.disconnected, rec.cut) == (200, True, False, False)


def test_litellm_reassembles_fragmented_parallel_tool_calls(upstream: FakeUpstream) -> None:
    upstream.enqueue(
        Script.tool_calls(
            [
                ("call_1", "current_time", '{"timezone": "UTC"}'),
                ("call_2", "get_weather", '{"city": "Paris", "unit": "C"}'),
            ],
            fragments=4,
            text_before="Let me check.",
            usage=(42, 17),
        )
    )
    turn = asyncio.run(stream_turn(upstream))
    assert turn.text == "Let me check."
    assert turn.calls == {
        0: {"id": "call_1", "name": "current_time", "arguments": '{"timezone": "UTC"}'},
        1: {"id": "call_2", "name": "get_weather", "arguments": '{"city": "Paris", "unit": "C"}'},
    }
    assert turn.finish == "tool_calls"
    assert (turn.usage.prompt_tokens, turn.usage.completion_tokens) == (42, 17)


def test_litellm_non_streaming_completion(upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.tool_calls([("call_9", "current_time", "{}")], text_before="One moment."))
    resp = asyncio.run(
        litellm.acompletion(
            model="openai/fake", api_base=upstream.base_url, api_key="k", max_retries=0, messages=USER
        )
    )
    msg = resp.choices[0].message
    assert msg.content == "One moment."
    assert [(c.id, c.function.name, c.function.arguments) for c in msg.tool_calls] == [
        ("call_9", "current_time", "{}")
    ]
    assert resp.choices[0].finish_reason == "tool_calls"
    assert resp.usage.total_tokens == 15


# ----- LiteLLM, errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "exc_type", "status"),
    [
        (Script.error(401), litellm.AuthenticationError, 401),
        (Script.error(429), litellm.RateLimitError, 429),
        (Script.error(500), litellm.InternalServerError, 500),
        (Script.error(503), litellm.ServiceUnavailableError, 503),
        (Script.error(400, "bad tools"), litellm.BadRequestError, 400),
        (Script.context_length_exceeded(), litellm.ContextWindowExceededError, 400),
    ],
    ids=["401", "429", "500", "503", "400", "context-length"],
)
def test_litellm_maps_error_statuses(
    upstream: FakeUpstream, script: Script, exc_type: type[Exception], status: int
) -> None:
    upstream.enqueue(script)
    with pytest.raises(exc_type) as info:
        asyncio.run(stream_turn(upstream))
    assert getattr(info.value, "status_code", None) == status
    assert len(upstream.requests) == 1  # max_retries=0: no hidden SDK retry
    if status == 429:
        assert upstream.requests[0].status == 429


def test_server_api_key_rejects_wrong_bearer_token() -> None:
    with FakeUpstream(api_key="secret") as guarded:
        with pytest.raises(litellm.AuthenticationError):
            asyncio.run(stream_turn(guarded))  # sends "Bearer k"
        assert [r.status for r in guarded.requests] == [401]


def test_litellm_cut_stream_raises_midstream_fallback(upstream: FakeUpstream) -> None:
    # 3 events = role chunk + 2 text pieces, then TCP close without the terminating zero-length chunk.
    upstream.enqueue(Script(text_pieces=["partial ", "answer", " never", " finished"], cut_after=3))
    with pytest.raises(litellm.exceptions.MidStreamFallbackError) as info:
        asyncio.run(stream_turn(upstream))
    assert isinstance(info.value.original_exception, litellm.APIConnectionError)
    assert info.value.generated_content == "partial answer"
    [rec] = upstream.requests
    assert (rec.cut, rec.chunks_sent, rec.disconnected) == (True, 3, False)


def test_cancel_mid_stream_is_seen_as_disconnect_quickly(upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.text("tick " * 40, chunks=40, delay=0.05))

    async def scenario() -> float:
        s = await litellm.acompletion(
            model="openai/fake",
            api_base=upstream.base_url,
            api_key="k",
            stream=True,
            stream_options={"include_usage": True},
            max_retries=0,
            messages=USER,
        )
        three = asyncio.Event()

        async def consume() -> None:
            n = 0
            try:
                async for _ in s:
                    n += 1
                    if n == 3:
                        three.set()
            finally:
                await s.aclose()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(three.wait(), 5)
        cancelled_at = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        rec = await upstream.await_disconnect(within=2)
        assert rec.disconnected_at is not None
        return rec.disconnected_at - cancelled_at

    assert asyncio.run(scenario()) < 0.5
    [rec] = upstream.requests
    assert (rec.disconnected, rec.cut) == (True, False)
    assert 3 <= rec.chunks_sent < 40


def test_timeout_while_upstream_hangs_before_headers_is_a_disconnect(upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.hang(5))

    async def scenario() -> None:
        async with asyncio.timeout(0.3):
            await stream_turn(upstream)

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        asyncio.run(scenario())
    rec = upstream.wait_for_disconnect(within=2)
    assert rec.status is None  # nothing was sent
    assert rec.disconnected_at is not None
    assert rec.disconnected_at - started < 1.0


# ----- the wire itself (raw httpx) --------------------------------------------------------------------


def _events(body: str, *, done: bool = True) -> list[Any]:
    """The stream's JSON events; it ends with `[DONE]` if `done`, else has none at all."""
    datas = [line[len("data: ") :] for line in body.split("\n\n") if line.startswith("data: ")]
    if done:
        assert datas[-1] == "[DONE]"
        datas = datas[:-1]
    assert "[DONE]" not in datas
    return [json.loads(d) for d in datas]


def test_wire_format_matches_openai(upstream: FakeUpstream) -> None:
    upstream.enqueue(
        Script.tool_calls(
            [ToolCall("call_a", "f", '{"x": 1}'), ToolCall("call_b", "g", "{}")], fragments=2, delay=0.02
        )
    )
    with httpx.Client(base_url=upstream.base_url) as client:
        resp = client.post(
            "/chat/completions",
            json={"model": "m", "messages": USER, "stream": True, "stream_options": {"include_usage": True}},
        )
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["transfer-encoding"] == "chunked"
        events = _events(resp.text)
        assert client.get("/models").json()["data"][0]["id"] == "fake"  # same keep-alive connection
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    frags = [e["choices"][0]["delta"]["tool_calls"][0] for e in events[1:-2]]
    assert frags[0] == {
        "index": 0,
        "id": "call_a",
        "type": "function",
        "function": {"name": "f", "arguments": ""},
    }
    assert frags[1]["id"] == "call_b"
    assert frags[2] == {"index": 0, "function": {"arguments": '{"x"'}}  # later fragments: arguments only
    assert events[-2]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "tool_calls",
    }
    assert events[-1]["choices"] == []
    assert events[-1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    rec = upstream.requests[0]
    assert rec.finished_at is not None
    # Paced: one content chunk (here a fragment) per tick; finish, usage and [DONE] with the last one.
    assert rec.finished_at - rec.received_at >= 0.02 * len(frags)
    assert (rec.chunks_sent, rec.content_sent) == (len(events) + 1, len(frags))


def test_wire_cut_is_an_incomplete_chunked_body(upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.cut(after=99))  # everything including [DONE], minus the zero-length chunk
    body = {"model": "m", "messages": USER, "stream": True}
    with (
        httpx.Client(base_url=upstream.base_url) as client,
        client.stream("POST", "/chat/completions", json=body) as resp,
        pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"),
    ):
        resp.read()


def test_wire_error_event_mid_stream(upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.text("one two three", chunks=3, error_after=2))
    body = {"model": "m", "messages": USER, "stream": True}
    with httpx.Client(base_url=upstream.base_url) as client:
        resp = client.post("/chat/completions", json=body)
    events = _events(resp.text, done=False)  # the body ends cleanly, but the stream never finished
    assert [e["choices"][0]["delta"].get("content") for e in events[:2]] == ["", "one t"]
    assert events[2]["error"]["type"] == "server_error"
    assert len(events) == 3


def test_wire_end_after_ends_the_body_cleanly_without_finishing(upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.text("one two three", chunks=3, end_after=2))
    body = {"model": "m", "messages": USER, "stream": True}
    with httpx.Client(base_url=upstream.base_url) as client:
        resp = client.post("/chat/completions", json=body)  # a complete chunked body
    events = _events(resp.text, done=False)
    assert [e["choices"][0]["delta"].get("content") for e in events] == ["", "one t"]
    assert all(e["choices"][0]["finish_reason"] is None for e in events)
    [rec] = upstream.requests
    assert (rec.cut, rec.disconnected, rec.chunks_sent) == (False, False, 2)


def test_wire_stall_after_holds_the_connection_silent_until_the_client_leaves(upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.text("one two three", chunks=3, stall_after=2))
    body = {"model": "m", "messages": USER, "stream": True}
    received: list[bytes] = []
    with (
        httpx.Client(base_url=upstream.base_url, timeout=httpx.Timeout(5, read=0.3)) as client,
        client.stream("POST", "/chat/completions", json=body) as resp,
        pytest.raises(httpx.ReadTimeout),
    ):
        received.extend(resp.iter_bytes())  # until nothing comes for 0.3 s
    contents = [
        e["choices"][0]["delta"].get("content") for e in _events(b"".join(received).decode(), done=False)
    ]
    assert contents == ["", "one t"]
    rec = upstream.wait_for_disconnect()
    assert (rec.cut, rec.chunks_sent) == (False, 2)


@pytest.mark.parametrize(
    ("body", "content_type"),
    [("<html>Bad Gateway</html>", "text/html; charset=utf-8"), ("", "application/json")],
)
def test_raw_answers_this_body_whatever_was_asked(
    upstream: FakeUpstream, body: str, content_type: str
) -> None:
    upstream.enqueue(Script.raw(body, content_type=content_type))
    request = {"model": "m", "messages": USER, "stream": True}
    with httpx.Client(base_url=upstream.base_url) as client:
        resp = client.post("/chat/completions", json=request)
    assert (resp.status_code, resp.text, resp.headers["content-type"]) == (200, body, content_type)
    assert resp.headers["content-length"] == str(len(body))


def test_a_directive_names_the_answer_and_tags_the_request(upstream: FakeUpstream) -> None:
    def ask(tag: str) -> list[Any]:
        messages = [*USER, {"role": "assistant", "content": "Sure."}]
        messages.append({"role": "user", "content": bench_content(tag, 6, 10)})
        body = {"model": "m", "messages": messages, "stream": True}
        return _events(client.post("/chat/completions", json=body).text)

    with httpx.Client(base_url=upstream.base_url) as client:
        paced = ask("t1")
        upstream.enqueue(Script.text("queued", chunks=1))  # a queued script comes first
        queued = ask("t2")
        with httpx.Client(base_url=upstream.base_url) as other:
            other.get("/models")
    assert [e["choices"][0]["delta"].get("content") for e in paced[1:-1]] == list(WORDS[:6])
    assert [e["choices"][0]["delta"].get("content") for e in queued[1:-1]] == ["queued"]
    first, second, third = upstream.requests
    assert (first.tag, second.tag, third.tag) == ("t1", "t2", None)
    assert (first.content_sent, first.chunks_sent) == (6, len(paced) + 1)
    assert first.finished_at is not None and first.first_content_at is not None
    assert first.first_content_at - first.received_at >= 0.01  # content chunk n at n x 10 ms
    assert first.finished_at - first.received_at >= 0.06
    assert first.connection == second.connection != third.connection  # keep-alive, then a new client


def test_trickle_writes_the_given_body_in_small_chunks(upstream: FakeUpstream) -> None:
    sse = ": comment\r\n\r\nevent: x\ndata: {}\n\ndata: [DONE]\n\n"
    upstream.enqueue(Script(sse_body=sse, trickle=5, delay=0.001))
    request = json.dumps({"model": "m", "messages": USER, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", upstream.port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s"
            % (len(request), request)
        )
        data = b""
        while not data.endswith(b"\r\n0\r\n\r\n"):
            data += sock.recv(65536)
    chunked = data.partition(b"\r\n\r\n")[2]
    pieces = []
    while (size := int(chunked[: chunked.index(b"\r\n")], 16)) > 0:
        start = chunked.index(b"\r\n") + 2
        pieces.append(chunked[start : start + size])
        chunked = chunked[start + size + 2 :]
    assert b"".join(pieces) == sse.encode()
    assert max(len(piece) for piece in pieces) == 5


# ----- strict mode -------------------------------------------------------------------------------------

ASK = {"role": "user", "content": "What time is it in Paris and Tokyo?"}
CALLS = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "t", "arguments": "{}"}},
    ],
}
R1 = {"role": "tool", "tool_call_id": "c1", "content": "10:00"}
R2 = {"role": "tool", "tool_call_id": "c2", "content": "17:00"}
ANSWER = {"role": "assistant", "content": "10:00 and 17:00."}
SYSTEM = {"role": "system", "content": "Be brief."}
THANKS = {"role": "user", "content": "Thanks"}


@pytest.mark.parametrize(
    "history",
    [
        [ASK],
        [SYSTEM, ASK, ANSWER, THANKS],
        [SYSTEM, ASK, CALLS, R2, R1, ANSWER],
        [ASK, CALLS, R1, R2, CALLS | {"content": None}, R2, R1],
        [ASK, CALLS, R1, R2, THANKS],  # tool -> user is allowed unless forbid_tool_then_user
        [ASK, {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}],
    ],
)
def test_validate_history_accepts_valid(history: list[dict[str, Any]]) -> None:
    assert validate_history(history) == []


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        ([], "empty"),
        ([ASK, SYSTEM], "messages[1]: system message must be the first"),
        ([ASK, CALLS, R1, ANSWER], "without a tool result before messages[3]: c2"),
        ([ASK, CALLS, R1], "without a tool result at the end of the list: c2"),
        (
            [ASK, CALLS, R1, THANKS, R2],
            "messages[4]: tool message with tool_call_id 'c2' has no matching call",
        ),
        ([ASK, CALLS, R1, R1, R2], "messages[3]: duplicate tool result"),
        ([ASK, R1], "messages[1]: tool message with tool_call_id 'c1' has no matching call"),
        ([ASK, THANKS], "two consecutive 'user' messages (messages[0] and messages[1])"),
        ([ASK, ANSWER, ANSWER], "two consecutive 'assistant' messages"),
        ([SYSTEM, ANSWER, ASK], "messages[1]: the first non-system message must be 'user'"),
        (
            [ASK, {"role": "assistant", "content": ""}],
            "messages[1]: assistant message has empty text content",
        ),
        ([ASK, {"role": "assistant", "content": [{"type": "text", "text": " "}]}], "empty text content"),
        ([ASK, {"role": "assistant"}], "empty text content and no tool_calls"),
        ([{"role": "user", "content": ""}], "user message has empty content"),
    ],
)
def test_validate_history_reports_problem(history: list[dict[str, Any]], expected: str) -> None:
    problems = validate_history(history)
    assert any(expected in p for p in problems), problems


def test_validate_history_tool_then_user_flag() -> None:
    history = [ASK, CALLS, R1, R2, THANKS]
    assert validate_history(history) == []
    [problem] = validate_history(history, forbid_tool_then_user=True)
    assert problem.startswith("messages[4]: 'user' message right after tool results")


def test_strict_mode_answers_400_naming_the_problem(upstream: FakeUpstream) -> None:
    upstream.enqueue(Script(strict=True), Script.text("fine", strict=True))
    with pytest.raises(litellm.BadRequestError, match="two consecutive 'user' messages"):
        asyncio.run(stream_turn(upstream, [ASK, THANKS]))
    assert asyncio.run(stream_turn(upstream, [SYSTEM, ASK, CALLS, R1, R2])).text == "fine"
    bad, good = upstream.requests
    assert (bad.status, good.status, good.problems) == (400, 200, [])
    assert "two consecutive 'user' messages" in bad.problems[0]


# ----- scripts over HTTP and the CLI -------------------------------------------------------------------


def test_script_json_round_trip() -> None:
    for script in (
        Script.tool_calls([("c", "n", '{"a": 1}')], text_before="hi"),
        Script.error(429),
        Script.cut("abc", after=1),
        Script.context_length_exceeded(),
        Script.raw("<html></html>"),
        Script.text("abc", end_after=2, stall_after=3),
    ):
        assert Script.from_json(json.loads(json.dumps(script.to_json()))) == script


def test_cli_process_is_scriptable_over_control_endpoints() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.upstream", "--port", "0", "--strict"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.getcwd(),
    )
    try:
        assert proc.stdout is not None
        base = proc.stdout.readline().split()[-1]
        root = base.removesuffix("/v1")
        with httpx.Client(timeout=5) as client:
            scripts = [Script.error(503).to_json(), Script.text("ok").to_json()]
            assert client.post(f"{root}/_control/scripts", json=scripts).json()["queued"] == 2
            body = {"model": "m", "messages": USER}
            assert client.post(f"{base}/chat/completions", json=body).status_code == 503
            assert (
                client.post(f"{base}/chat/completions", json=body).json()["choices"][0]["message"]["content"]
                == "ok"
            )
            # --strict applies to the default script
            bad = client.post(f"{base}/chat/completions", json={"model": "m", "messages": [ASK, THANKS]})
            assert bad.status_code == 400
            assert "consecutive" in bad.json()["error"]["message"]
            listed = client.get(f"{root}/_control/requests").json()["requests"]
            recorded = [RecordedRequest(**r) for r in listed]
            assert [r.status for r in recorded] == [503, 200, 400]
            client.post(f"{root}/_control/reset")
            assert client.get(f"{root}/_control/requests").json()["requests"] == []
    finally:
        proc.terminate()
        assert proc.wait(5) == 0
        if proc.stdout is not None:
            proc.stdout.close()
