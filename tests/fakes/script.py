"""What the fake upstream answers: the `Script` dataclass and the OpenAI wire shapes built from it.

Owns the scripting model (text pieces, fragmented tool calls, pacing, usage, HTTP errors, cuts, early
ends, stalls, hangs, raw bodies, byte-level framing), its JSON form (used by the `/_control/scripts`
endpoint), and the exact chunk / completion / error bodies OpenAI's chat-completions API sends. Nothing
here does I/O: `answer.py` turns a script into the bytes to write and when, `connection.py` writes them.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_REPLY = "Hello from fake upstream."
DONE_EVENT = b"[DONE]"
# Sixteen words, one a chunk in `Script.words`: a realistic token size (a few bytes of text per event).
_SENTENCE = "The quick brown fox jumps over the lazy dog, and then it naps in the sun."
WORDS = tuple(word + " " for word in _SENTENCE.split())
_COMPACT = json.JSONEncoder(separators=(",", ":"))  # json.dumps builds a new encoder per call for these
_MARK = "\x00"  # a delta key no real delta has: where a chunk's template is cut in two

# Per-status defaults modelled on OpenAI's real error bodies, so LiteLLM's exception mapping sees the
# same `type`/`code` it would in production.
_ERROR_DEFAULTS: dict[int, tuple[str, str, str | None]] = {
    400: ("Invalid request.", "invalid_request_error", None),
    401: (
        "Incorrect API key provided. You can find your API key at https://example.invalid.",
        "invalid_request_error",
        "invalid_api_key",
    ),
    403: ("You are not allowed to use this model.", "invalid_request_error", "permission_denied"),
    404: (
        "The model does not exist or you do not have access to it.",
        "invalid_request_error",
        "model_not_found",
    ),
    429: ("Rate limit reached for requests. Please try again in 1s.", "requests", "rate_limit_exceeded"),
    500: ("The server had an error while processing your request. Sorry about that!", "server_error", None),
    503: ("The engine is currently overloaded, please try again later.", "server_error", None),
}

CONTEXT_LENGTH_MESSAGE = (
    "This model's maximum context length is 128000 tokens. However, your messages resulted in "
    "130000 tokens. Please reduce the length of the messages."
)


def error_body(
    status: int,
    message: str | None = None,
    *,
    type: str | None = None,
    code: str | None = None,
    param: str | None = None,
) -> dict[str, Any]:
    """OpenAI-style `{"error": {message, type, param, code}}`, defaults filled in from the status."""
    d_message, d_type, d_code = _ERROR_DEFAULTS.get(status, ("Upstream error.", "api_error", None))
    return {
        "error": {
            "message": message if message is not None else d_message,
            "type": type if type is not None else d_type,
            "param": param,
            "code": code if code is not None else d_code,
        }
    }


def split_evenly(text: str, pieces: int) -> list[str]:
    """Split `text` into at most `pieces` non-empty parts of near-equal length (joined, they give `text`)."""
    if not text:
        return []
    pieces = max(1, min(pieces, len(text)))
    size, extra = divmod(len(text), pieces)
    out, pos = [], 0
    for i in range(pieces):
        step = size + (1 if i < extra else 0)
        out.append(text[pos : pos + step])
        pos += step
    return out


@dataclass
class ToolCall:
    """One complete tool call the fake will stream as fragments."""

    id: str
    name: str
    arguments: str


@dataclass
class HttpError:
    """Answer with this status instead of a completion. `body=None` means the OpenAI default for it."""

    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)

    def payload(self) -> bytes:
        body = self.body if self.body is not None else error_body(self.status)
        return body.encode() if isinstance(body, str) else json.dumps(body).encode()


@dataclass
class Script:
    """One scripted answer; each request to /v1/chat/completions consumes the next queued one.

    Streamed chunk order: role chunk, one chunk per `text_pieces` item, tool-call fragments, finish chunk,
    optional usage chunk (only if the request asked for `stream_options.include_usage`), `[DONE]`.
    `cut_after` counts SSE events sent before the TCP connection is closed without the terminating
    zero-length chunk, the role chunk included (0 = headers only; len(events) = after `[DONE]`).
    `delay` paces the content: the role chunk goes with the headers, content chunk i (text or tool-call
    fragment) `i * delay` after them on a fixed schedule (a late tick does not push the others), and what
    follows the last one (finish, usage, `[DONE]`) right after it, as OpenAI sends them.
    `hang_before_headers` is waited before anything is sent.
    `error_after` replaces everything after that many events with one OpenAI-style `{"error": ...}` event
    (what OpenAI sends when generation fails mid-stream); the body then ends normally, without `[DONE]`.
    `end_after` ends the body cleanly (its terminating zero-length chunk) after that many events, the role
    chunk included: a stream that stops with neither a finish_reason nor `[DONE]`.
    `stall_after` sends that many events, then nothing: the response neither ends nor closes until the
    client leaves (a provider that stalls mid-stream).
    `sse_body` replaces the events with this exact SSE text (comments, other fields, CRLF: what a reader
    must also accept). `trickle` writes the body in HTTP chunks of that many bytes, each chunk in two TCP
    writes, `delay` apart: a reader must join events across chunks and chunks across reads.
    `strict`/`forbid_tool_then_user` override the server's history validation for this request.
    Read on the Anthropic route only (anthropic.py): `thinking` streams a thinking block of this text with
    its signature before the text, `redacted_thinking` a redacted one; `cache` is the usage's
    (cache_read_input_tokens, cache_creation_input_tokens) there, and its first figure the
    `prompt_tokens_details.cached_tokens` of the OpenAI route's usage; `reasoning_tokens` that route's
    `completion_tokens_details.reasoning_tokens`.
    """

    text_pieces: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    fragments: int = 3
    interleave: bool = True
    delay: float = 0.0
    finish_reason: str | None = None
    usage: tuple[int, int] | None = (10, 5)
    http_error: HttpError | None = None
    cut_after: int | None = None
    error_after: int | None = None
    hang_before_headers: float = 0.0
    end_after: int | None = None
    stall_after: int | None = None
    sse_body: str | None = None
    trickle: int | None = None
    strict: bool | None = None
    forbid_tool_then_user: bool | None = None
    thinking: str | None = None
    redacted_thinking: bool = False
    cache: tuple[int, int] | None = None
    reasoning_tokens: int | None = None

    # ----- convenient constructors -------------------------------------------------------------------

    @classmethod
    def text(
        cls,
        text: str = DEFAULT_REPLY,
        *,
        chunks: int = 5,
        delay: float = 0.0,
        usage: tuple[int, int] | None = (10, 5),
        **extra: Any,
    ) -> Script:
        return cls(text_pieces=split_evenly(text, chunks), delay=delay, usage=usage, **extra)

    @classmethod
    def words(cls, chunks: int, *, delay: float = 0.0, **extra: Any) -> Script:
        """`chunks` chunks of one word each (the same sixteen words over and over): the benchmark's answer."""
        return cls(text_pieces=[WORDS[n % len(WORDS)] for n in range(chunks)], delay=delay, **extra)

    @classmethod
    def tool_calls(
        cls,
        calls: Sequence[tuple[str, str, str] | ToolCall],
        *,
        fragments: int = 3,
        text_before: str | None = None,
        text_chunks: int = 3,
        delay: float = 0.0,
        usage: tuple[int, int] | None = (10, 5),
        **extra: Any,
    ) -> Script:
        specs = [c if isinstance(c, ToolCall) else ToolCall(*c) for c in calls]
        return cls(
            text_pieces=split_evenly(text_before or "", text_chunks),
            calls=specs,
            fragments=fragments,
            delay=delay,
            usage=usage,
            **extra,
        )

    @classmethod
    def error(
        cls,
        status: int,
        message: str | None = None,
        *,
        type: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        retry_after: float | None = None,
        body: Any = None,
        **extra: Any,
    ) -> Script:
        hdrs = dict(headers or {})
        if status == 429 and retry_after is None and "retry-after" not in {k.lower() for k in hdrs}:
            retry_after = 1
        if retry_after is not None:
            hdrs["retry-after"] = f"{retry_after:g}"
        if body is None:
            body = error_body(status, message, type=type, code=code)
        return cls(http_error=HttpError(status, body, hdrs), **extra)

    @classmethod
    def context_length_exceeded(cls, message: str = CONTEXT_LENGTH_MESSAGE, **extra: Any) -> Script:
        return cls.error(
            400,
            message,
            type="invalid_request_error",
            code="context_length_exceeded",
            body=error_body(400, message, code="context_length_exceeded", param="messages"),
            **extra,
        )

    @classmethod
    def cut(
        cls, text: str = DEFAULT_REPLY, *, after: int = 2, chunks: int = 5, delay: float = 0.0, **extra: Any
    ) -> Script:
        return cls(text_pieces=split_evenly(text, chunks), cut_after=after, delay=delay, **extra)

    @classmethod
    def raw(
        cls, body: str, *, status: int = 200, content_type: str = "text/html; charset=utf-8", **extra: Any
    ) -> Script:
        """A whole answer of this exact body and content-type (with a Content-Length), whatever was asked:
        what a proxy's error page, a captive portal or a misconfigured base URL sends."""
        return cls(http_error=HttpError(status, body, {"content-type": content_type}), **extra)

    @classmethod
    def hang(cls, seconds: float, **extra: Any) -> Script:
        return cls(text_pieces=split_evenly(DEFAULT_REPLY, 5), hang_before_headers=seconds, **extra)

    # ----- JSON form (for /_control/scripts and other processes) -------------------------------------

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Script:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown Script fields: {sorted(unknown)}")
        kw = dict(data)
        kw["calls"] = [ToolCall(**c) if isinstance(c, dict) else ToolCall(*c) for c in kw.get("calls", [])]
        if kw.get("http_error") is not None:
            kw["http_error"] = HttpError(**kw["http_error"])
        for pair in ("usage", "cache"):
            if kw.get(pair) is not None:
                first, second = kw[pair]
                kw[pair] = (int(first), int(second))
        return cls(**kw)

    # ----- wire shapes -------------------------------------------------------------------------------

    @property
    def effective_finish_reason(self) -> str:
        return self.finish_reason or ("tool_calls" if self.calls else "stop")

    def usage_json(self) -> dict[str, Any] | None:
        """OpenAI's usage object; `cache` gives its prompt_tokens_details.cached_tokens (the read part) and
        `reasoning_tokens` its completion_tokens_details, as OpenAI's reasoning models report them."""
        if self.usage is None:
            return None
        prompt, completion = self.usage
        found: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        if self.cache is not None:
            found["prompt_tokens_details"] = {"cached_tokens": self.cache[0], "audio_tokens": 0}
        if self.reasoning_tokens is not None:
            found["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        return found

    def tool_call_fragments(self) -> list[dict[str, Any]]:
        """OpenAI delta fragments: first one per call carries id/type/name and arguments ''."""
        per_call: list[list[dict[str, Any]]] = []
        for index, call in enumerate(self.calls):
            frags: list[dict[str, Any]] = [
                {
                    "index": index,
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": ""},
                }
            ]
            frags += [
                {"index": index, "function": {"arguments": piece}}
                for piece in split_evenly(call.arguments, self.fragments)
            ]
            per_call.append(frags)
        if not self.interleave:
            return [f for frags in per_call for f in frags]
        # Round-robin across calls: the harshest ordering for a client that keys on anything but `index`.
        rounds = itertools.zip_longest(*per_call)
        return [f for round_ in rounds for f in round_ if f is not None]

    def stream_events(self, *, model: str, include_usage: bool, completion_id: str) -> list[bytes]:
        """The SSE `data:` payloads, in order, ending with `[DONE]`.

        The chunks that carry a delta are one template around it, so a text chunk costs one string to
        encode: the benchmark measures a server against this fake, which must stay cheap per chunk.
        """
        base: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": "fp_fake",
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            out = {
                **base,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            }
            if include_usage:
                out["usage"] = None  # OpenAI sends an explicit null on every chunk but the last
            return out

        before, after = _COMPACT.encode(chunk({_MARK: 0})).split(_COMPACT.encode({_MARK: 0}))

        def event(delta: str) -> bytes:
            return (before + delta + after).encode()

        events = [event(_COMPACT.encode({"role": "assistant", "content": "", "refusal": None}))]
        if self.thinking is not None:  # reasoning as DeepSeek and Qwen stream it, before the answer
            events += [
                event('{"reasoning_content":' + json.dumps(p) + ',"content":null}')
                for p in split_evenly(self.thinking, 3)
            ]
        texts: dict[str, bytes] = {}  # a piece said again is the same bytes object (see answer.stream)
        for piece in self.text_pieces:
            text = texts.get(piece)
            if text is None:
                text = texts[piece] = event('{"content":' + json.dumps(piece) + "}")
            events.append(text)
        events += [event('{"tool_calls":[' + _COMPACT.encode(f) + "]}") for f in self.tool_call_fragments()]
        events.append(_COMPACT.encode(chunk({}, self.effective_finish_reason)).encode())
        usage = self.usage_json()
        if include_usage and usage is not None:
            events.append(_COMPACT.encode({**base, "choices": [], "usage": usage}).encode())
        events.append(DONE_EVENT)
        if self.error_after is not None:
            failure = error_body(500, "The server had an error while processing your request.")
            return [*events[: self.error_after], _COMPACT.encode(failure).encode()]
        return events

    @property
    def content_events(self) -> int:
        """How many streamed events carry content (text pieces, tool-call fragments): the paced ones."""
        return len(self.text_pieces) + len(self.tool_call_fragments())

    def completion_body(self, *, model: str, completion_id: str) -> dict[str, Any]:
        """A complete non-streaming `chat.completion` object."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.text_pieces) or None,
            "refusal": None,
        }
        if self.calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.calls
            ]
        body: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": "fp_fake",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self.effective_finish_reason,
                }
            ],
        }
        usage = self.usage_json()
        if usage is not None:
            body["usage"] = usage
        return body


def scripts_from_json(data: Any) -> list[Script]:
    """Accept one Script dict, a list of them, or `{"scripts": [...]}`."""
    if isinstance(data, dict) and "scripts" in data:
        data = data["scripts"]
    items: Iterable[Any] = data if isinstance(data, list) else [data]
    return [Script.from_json(item) for item in items]
