"""The lean OpenAI-compatible reader's own edges: SSE parsing (pieces of any size, comments, blank lines,
`[DONE]`, error events), cut streams, closing the connection at once on close or cancel, and reusing it
only after a complete response; answers that are no completion stream (HTML, empty bodies), streams that
end without finishing and streams that stall.

The adapter comes from the real model layer (LiteLLM resolves the model) and talks real HTTP to the
fake upstream (tests/fakes), which can also write a given SSE body in small TCP pieces.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from app.llm.gateway import ModelGateway
from app.llm.openai_compat import OpenAICompatAdapter, SSEReader, env_proxy
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
from app.settings import Settings
from tests.fakes.upstream import FakeUpstream, Script

pytestmark = pytest.mark.anyio

MODEL = "openai/edge-model"
DISCONNECT_BOUND = 1.0  # generous: checks that the upstream sees the close, not how fast
CALLS = [("call_a", "current_time", '{"timezone": "UTC"}'), ("call_b", "calculate", '{"expression": "6*7"}')]


def _wire(script: Script) -> bytes:
    """The SSE body the fake upstream would send for `script`, with usage."""
    events = script.stream_events(model="edge-model", include_usage=True, completion_id="chatcmpl-1")
    return b"".join(b"data: " + event + b"\n\n" for event in events)


def _decorated(wire: bytes) -> bytes:
    """The same events with what SSE allows around them: comments, other fields, CRLF, spare blank lines."""
    out = b": connected\n\n"
    for n, event in enumerate(wire.split(b"\n\n")):
        if not event:
            continue
        if n % 3 == 0:
            out += b"event: chunk\nid: %d\n%s\r\n\r\n" % (n, event)
        elif n % 3 == 1:
            out += b": keep-alive\n\n" + event.replace(b"data: ", b"data:") + b"\n\n\n"
        else:
            out += event + b"\n\n"
    return out + b'data: {"after": "[DONE] is ignored"}\n\n'


def _read(data: bytes, pieces: Iterator[bytes]) -> list[StreamPart]:
    reader = SSEReader(str)
    parts: list[StreamPart] = []
    for piece in pieces:
        parts += reader.feed(piece)
        if reader.done:
            break
    assert reader.done, data[-80:]
    return [*parts, reader.finish()]


def _split(data: bytes, size: int) -> Iterator[bytes]:
    return (data[i : i + size] for i in range(0, len(data), size))


def _summary(
    parts: list[StreamPart],
) -> tuple[str, dict[int, list[str]], str | None, tuple[int, int, int] | None]:
    text, calls, finish, usage = "", dict[int, list[str]](), None, None
    for part in parts:
        if isinstance(part, TextPart):
            text += part.text
        elif isinstance(part, ToolCallPart):
            entry = calls.setdefault(part.index, [part.id or "", part.name or "", ""])
            entry[2] += part.arguments
        elif isinstance(part, FinishPart):
            finish = part.reason
        elif isinstance(part, UsagePart):
            usage = (part.prompt_tokens, part.completion_tokens, part.total_tokens)
    return text, calls, finish, usage


# --- SSE parsing ------------------------------------------------------------------------------------------


def test_events_in_pieces_of_any_size_give_the_same_parts() -> None:
    wire = _wire(Script.tool_calls(CALLS, fragments=4, text_before="Checking the time.", usage=(42, 17)))
    whole = _read(wire, iter([wire]))
    assert _summary(whole) == (
        "Checking the time.",
        {
            0: ["call_a", "current_time", '{"timezone": "UTC"}'],
            1: ["call_b", "calculate", '{"expression": "6*7"}'],
        },
        "tool_calls",
        (42, 17, 59),
    )
    decorated = _decorated(wire)
    for size in (1, 2, 3, 7, 64, len(decorated)):
        assert _read(decorated, _split(decorated, size)) == whole, size


def test_reasoning_content_and_reasoning_deltas_are_reasoning_parts() -> None:
    wire = _wire(Script.text("It is noon.", thinking="The clock says twelve."))
    parts = _read(wire, iter([wire]))
    reasoning = [p for p in parts if isinstance(p, ReasoningPart)]
    assert "".join(p.text for p in reasoning) == "The clock says twelve."
    assert all(p.signature is None and p.redacted is None for p in reasoning)
    assert parts.index(reasoning[-1]) < next(n for n, p in enumerate(parts) if isinstance(p, TextPart))
    assert _summary(parts)[0] == "It is noon."
    # vLLM's and OpenRouter's name for it
    event = {"choices": [{"index": 0, "delta": {"reasoning": "Hmm."}, "finish_reason": "stop"}]}
    other = b"data: " + json.dumps(event).encode() + b"\n\ndata: [DONE]\n\n"
    assert ReasoningPart("Hmm.") in _read(other, iter([other]))


def test_cached_and_reasoning_tokens_are_read_from_openais_usage_details() -> None:
    wire = _wire(Script.text("Fine.", usage=(1200, 300), cache=(1024, 0), reasoning_tokens=256))
    [usage] = [p for p in _read(wire, iter([wire])) if isinstance(p, UsagePart)]
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cache_read_tokens) == (1200, 300, 1024)
    assert (usage.reasoning_tokens, usage.cache_write_tokens) == (256, 0)
    plain = _wire(Script.text("Fine.", usage=(12, 3)))
    [usage] = [p for p in _read(plain, iter([plain])) if isinstance(p, UsagePart)]
    assert (usage.cache_read_tokens, usage.reasoning_tokens) == (0, None)


def test_finish_reasons_as_litellm_reports_them() -> None:
    def finish(*events: dict[str, Any]) -> str | None:
        wire = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
        return _summary(_read(wire, iter([wire])))[2]

    text = {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
    call = {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c", "function": {}}]}}]}
    assert finish(text) == "stop"  # none sent
    assert finish(text, {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}) == "length"
    assert finish(call, {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}) == "tool_calls"


@pytest.mark.parametrize(
    "event",
    [
        b'{"error": {"message": "overloaded", "type": "server_error"}}',
        b"{not json",
        b'{"choices": "nonsense"}',
    ],
)
def test_an_error_or_garbled_event_breaks_the_stream(event: bytes) -> None:
    reader = SSEReader(str)
    assert reader.feed(b'data: {"choices": [{"delta": {"content": "partial"}}]}\n\n') == [TextPart("partial")]
    with pytest.raises(ProviderError) as caught:
        reader.feed(b"data: " + event + b"\n\n")
    assert (caught.value.code, caught.value.retryable) == ("provider_stream_interrupted", False)
    assert "overloaded" not in caught.value.message


def test_a_line_that_never_ends_breaks_the_stream() -> None:
    reader = SSEReader(str)
    for _ in range(40):
        assert reader.feed(b"x" * 100_000) == []  # 4 MB, still waiting for the line's end
    with pytest.raises(ProviderError) as caught:
        reader.feed(b"x" * 300_000)
    assert caught.value.code == "provider_stream_interrupted"


# --- over HTTP --------------------------------------------------------------------------------------------


@asynccontextmanager
async def lean_adapter(
    tmp_path: Path, base_url: str, key: str | None = "sk-edge"
) -> AsyncIterator[OpenAICompatAdapter]:
    provider: dict[str, Any] = {"api_base": base_url, "models": [MODEL]}
    if key is not None:
        provider["api_key_env"] = "PARLEY_TEST_EDGE_KEY"
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"providers": {"edge": provider}}), encoding="utf-8")
    layer = ModelGateway(
        Settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'unused.db'}", models_file=path)
    )
    layer.start()
    await layer.ready()
    try:
        adapter = await layer.adapter(await layer.resolve(MODEL))
        assert isinstance(adapter, OpenAICompatAdapter)
        yield adapter
    finally:
        await layer.stop()


def _request(timeout: float = 10.0) -> ModelRequest:
    return ModelRequest(ResolvedModel(MODEL, None), [{"role": "user", "content": "hi"}], [], timeout)


@pytest.fixture
def upstream(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeUpstream]:
    monkeypatch.setenv("PARLEY_TEST_EDGE_KEY", "sk-edge")
    with FakeUpstream(api_key="sk-edge") as running:
        yield running


async def test_a_stream_written_in_small_tcp_pieces(tmp_path: Path, upstream: FakeUpstream) -> None:
    wire = _wire(Script.tool_calls(CALLS, fragments=3, text_before="Checking.", usage=(12, 9)))
    # Every 9 bytes an HTTP chunk, each chunk in two TCP writes a millisecond apart.
    trickled = Script(sse_body=_decorated(wire).decode(), trickle=9, delay=0.001)
    upstream.enqueue(trickled, trickled)
    async with lean_adapter(tmp_path, upstream.base_url) as adapter:
        parts = [part async for part in adapter.stream(_request())]
        again = [part async for part in adapter.stream(_request())]
    assert parts == again
    assert _summary(parts) == _summary(_read(wire, iter([wire])))
    first, second = upstream.requests
    assert first.body["stream"] is True
    assert first.body["stream_options"] == {"include_usage": True}
    assert first.body["model"] == "edge-model"
    assert first.connection == second.connection  # a complete response leaves the connection reusable


async def test_a_closed_stream_is_not_reused(tmp_path: Path, upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.text(" ".join(f"w{n}" for n in range(50)), chunks=50, delay=0.005))
    async with lean_adapter(tmp_path, upstream.base_url) as adapter:
        stream = adapter.stream(_request())
        assert isinstance(await anext(stream), TextPart)
        await stream.aclose()
        assert _summary([part async for part in adapter.stream(_request())])[2] == "stop"
    first, second = upstream.requests
    assert first.disconnected
    assert first.connection != second.connection


async def test_closing_the_stream_disconnects_the_upstream(tmp_path: Path, upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.text(" ".join(f"w{n}" for n in range(200)), chunks=200, delay=0.02))
    async with lean_adapter(tmp_path, upstream.base_url) as adapter:
        stream = adapter.stream(_request())
        received = [await anext(stream) for _ in range(3)]
        closed_at = time.monotonic()
        await stream.aclose()
        request = await upstream.await_disconnect(within=5.0)
    assert len(received) == 3
    assert request.disconnected_at is not None
    assert request.disconnected_at - closed_at < DISCONNECT_BOUND
    assert request.chunks_sent < 50


async def test_cancelling_the_reader_disconnects_the_upstream(tmp_path: Path, upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.text(" ".join(f"w{n}" for n in range(200)), chunks=200, delay=0.02))
    async with lean_adapter(tmp_path, upstream.base_url) as adapter:
        started = asyncio.Event()

        async def consume() -> None:
            async for _ in adapter.stream(_request()):
                started.set()

        task = asyncio.create_task(consume())
        await started.wait()
        cancelled_at = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        request = await upstream.await_disconnect(within=5.0)
    assert request.disconnected_at is not None
    assert request.disconnected_at - cancelled_at < DISCONNECT_BOUND


async def _read_into(stream: AsyncIterator[StreamPart], received: list[StreamPart]) -> None:
    async for part in stream:
        received.append(part)


async def test_a_cut_stream_keeps_what_came_then_fails(tmp_path: Path, upstream: FakeUpstream) -> None:
    upstream.enqueue(Script.cut("one two three four", after=3, chunks=4))
    async with lean_adapter(tmp_path, upstream.base_url) as adapter:
        received: list[StreamPart] = []
        with pytest.raises(ProviderError) as caught:
            await _read_into(adapter.stream(_request()), received)
    assert (caught.value.code, caught.value.retryable) == ("provider_stream_interrupted", False)
    streamed = "".join(p.text for p in received if isinstance(p, TextPart))
    assert streamed
    assert "one two three four".startswith(streamed)
    assert not any(isinstance(p, FinishPart) for p in received)


async def test_an_error_answer_never_shows_the_upstreams_words(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    upstream.enqueue(Script.error(400, "secret detail from upstream"))
    async with lean_adapter(tmp_path, upstream.base_url) as adapter:
        with pytest.raises(ProviderError) as caught:
            await anext(adapter.stream(_request()))
    assert (caught.value.code, caught.value.status, caught.value.retryable) == (
        "provider_bad_request",
        400,
        False,
    )
    assert "secret" not in caught.value.message


# --- answers that are no completion stream -----------------------------------------------------------------

HTML_PAGE = "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n<body>nginx</body></html>\n"


@pytest.mark.parametrize(
    ("script", "message", "logged"),
    [
        pytest.param(
            Script.raw(HTML_PAGE),
            "The model provider answered with HTML (text/html), not a completion stream.",
            ["text/html", "502 Bad Gateway"],
            id="html",
        ),
        pytest.param(
            Script(sse_body=HTML_PAGE),
            "The model provider answered with HTML (text/event-stream), not a completion stream.",
            ["text/event-stream", "502 Bad Gateway"],
            id="html-as-event-stream",
        ),
        pytest.param(
            Script.raw("<html>" + "x" * 10_000 + "</html>"),  # one long line: judged on its opening
            "The model provider answered with HTML (text/html), not a completion stream.",
            ["text/html", "<html>xxx"],
            id="html-one-long-line",
        ),
        pytest.param(
            Script.raw("", content_type="application/json"),
            "The model provider answered with an empty body, not a completion stream.",
            ["application/json", "b''"],
            id="empty",
        ),
        pytest.param(
            Script(sse_body=""),
            "The model provider answered with an empty body, not a completion stream.",
            ["text/event-stream"],
            id="empty-event-stream",
        ),
        pytest.param(
            Script(sse_body=": keep-alive\n\n: keep-alive\n\n"),
            "The model provider's event stream held no completion events.",
            ["keep-alive"],
            id="comments-only",
        ),
        pytest.param(
            Script.raw('{"id": "chatcmpl-1", "object": "chat.completion"}', content_type="application/json"),
            "The model provider answered with application/json, not a completion stream.",
            ["application/json", "chat.completion"],
            id="json",
        ),
        pytest.param(
            Script.raw("nonsense", content_type="text/<script>alert(1)</script>"),
            "The model provider answered with an unusual content type, not a completion stream.",
            ["nonsense"],
            id="odd-content-type",
        ),
    ],
)
async def test_an_answer_that_is_no_stream_is_a_bad_response(
    tmp_path: Path,
    upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
    script: Script,
    message: str,
    logged: list[str],
) -> None:
    upstream.enqueue(script)
    async with lean_adapter(tmp_path, upstream.base_url) as adapter:
        received: list[StreamPart] = []
        with caplog.at_level(logging.WARNING, logger="app.llm"), pytest.raises(ProviderError) as caught:
            await _read_into(adapter.stream(_request()), received)
    assert received == []
    error = caught.value
    assert (error.code, error.message, error.status, error.retryable) == (
        "provider_bad_response",
        message,
        200,
        True,
    )
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "200" in line
    for shown in logged:
        assert shown in line
    assert "sk-edge" not in line
    assert len(line) < 1000  # the opening, cut short


async def test_a_stream_labelled_with_another_content_type_is_still_read(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    wire = _wire(Script.text("one two three", chunks=3, usage=(3, 3)))
    upstream.enqueue(Script.raw(wire.decode(), content_type="text/plain"))
    async with lean_adapter(tmp_path, upstream.base_url) as adapter:
        parts = [part async for part in adapter.stream(_request())]
    assert _summary(parts) == ("one two three", {}, "stop", (3, 3, 6))


@pytest.mark.parametrize("after", [1, 3], ids=["role-chunk-only", "after-text"])
async def test_a_stream_that_ends_without_finishing_keeps_what_came_then_fails(
    tmp_path: Path, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture, after: int
) -> None:
    upstream.enqueue(Script.text("one two three four", chunks=4, end_after=after))
    async with lean_adapter(tmp_path, upstream.base_url) as adapter:
        received: list[StreamPart] = []
        with caplog.at_level(logging.WARNING, logger="app.llm"), pytest.raises(ProviderError) as caught:
            await _read_into(adapter.stream(_request()), received)
    error = caught.value
    assert (error.code, error.retryable) == ("provider_stream_interrupted", False)
    assert error.message == "The model provider's stream ended before the provider finished the response."
    streamed = "".join(p.text for p in received if isinstance(p, TextPart))
    assert "one two three four".startswith(streamed)
    assert bool(streamed) is (after > 1)
    assert not any(isinstance(p, FinishPart) for p in received)
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "neither a finish_reason nor [DONE]" in line


async def test_a_finish_reason_without_done_is_a_complete_stream(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    upstream.enqueue(Script.text("one two", chunks=2, usage=None, end_after=4))  # role, two pieces, finish
    async with lean_adapter(tmp_path, upstream.base_url) as adapter:
        parts = [part async for part in adapter.stream(_request())]
    assert _summary(parts) == ("one two", {}, "stop", None)


@pytest.mark.parametrize("after", [1, 3], ids=["before-text", "after-text"])
async def test_a_stall_mid_stream_is_a_timeout(
    tmp_path: Path, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture, after: int
) -> None:
    upstream.enqueue(Script.text("one two three four", chunks=4, stall_after=after))
    async with lean_adapter(tmp_path, upstream.base_url) as adapter:
        received: list[StreamPart] = []
        with caplog.at_level(logging.WARNING, logger="app.llm"), pytest.raises(ProviderError) as caught:
            await _read_into(adapter.stream(_request(timeout=0.3)), received)
        request = await upstream.await_disconnect(within=5.0)
    assert (caught.value.code, caught.value.retryable) == ("provider_timeout", True)
    assert bool([p for p in received if isinstance(p, TextPart)]) is (after > 1)
    assert request.disconnected
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "0.3" in line


# --- proxies from the environment ------------------------------------------------------------------------


class ForwardProxy:
    """A plain HTTP forward proxy on a real socket: takes the absolute-form request line a client sends
    a proxy, passes the request on to the host it names in origin form, then relays both ways."""

    def __init__(self) -> None:
        self.request_lines: list[str] = []
        self.authorizations: list[str | None] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> ForwardProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        line, rest = head.split("\r\n", 1)
        self.request_lines.append(line)
        found = [h.split(":", 1)[1].strip() for h in rest.split("\r\n") if h.lower().startswith("proxy-auth")]
        self.authorizations.append(found[0] if found else None)
        method, target, version = line.split(" ")
        hostport, path = target.removeprefix("http://").split("/", 1)
        host, port = hostport.split(":")
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        up_writer.write(f"{method} /{path} {version}\r\n{rest}".encode("latin-1"))

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)


@pytest.fixture
def proxy_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[pytest.MonkeyPatch]:
    """No proxy settings but the test's own (the lookup is cached per URL: cleared around the test)."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    empty = tmp_path / "empty-netrc"
    empty.write_text("", encoding="utf-8")
    monkeypatch.setenv("NETRC", str(empty))
    env_proxy.cache_clear()
    yield monkeypatch
    env_proxy.cache_clear()


async def test_a_proxy_from_the_environment_carries_the_stream(
    tmp_path: Path, upstream: FakeUpstream, proxy_env: pytest.MonkeyPatch
) -> None:
    upstream.enqueue(Script.text("Through the proxy."), Script.text("Straight."))
    async with ForwardProxy() as proxy:
        proxy_env.setenv("HTTP_PROXY", proxy.url.replace("http://", "http://user:secret@"))
        async with lean_adapter(tmp_path, upstream.base_url) as adapter:
            parts = [part async for part in adapter.stream(_request())]
        assert _summary(parts)[0] == "Through the proxy."
        (line,) = proxy.request_lines
        assert line == f"POST {upstream.base_url}/chat/completions HTTP/1.1"
        assert proxy.authorizations == ["Basic dXNlcjpzZWNyZXQ="]  # user:secret, for the proxy only
        # NO_PROXY names the upstream's host: the next stream goes straight to it.
        proxy_env.setenv("NO_PROXY", "127.0.0.1")
        env_proxy.cache_clear()
        async with lean_adapter(tmp_path, upstream.base_url) as adapter:
            parts = [part async for part in adapter.stream(_request())]
        assert _summary(parts)[0] == "Straight."
        assert len(proxy.request_lines) == 1
    assert [r.headers.get("authorization") for r in upstream.requests] == ["Bearer sk-edge"] * 2


async def test_credentials_in_netrc_for_the_providers_host_do_not_break_its_requests(
    tmp_path: Path, upstream: FakeUpstream, proxy_env: pytest.MonkeyPatch
) -> None:
    """aiohttp's trust_env sent ~/.netrc's login for the host as well as the key's Authorization header,
    and refused the request (ValueError) before it left."""
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password elsewhere\n", encoding="utf-8")
    netrc.chmod(0o600)
    proxy_env.setenv("NETRC", str(netrc))
    upstream.enqueue(Script.text("Answered."))
    async with lean_adapter(tmp_path, upstream.base_url) as adapter:
        parts = [part async for part in adapter.stream(_request())]
    assert _summary(parts)[0] == "Answered."
    assert upstream.requests[0].headers.get("authorization") == "Bearer sk-edge"
