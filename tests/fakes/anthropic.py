"""The fake upstream's Anthropic Messages API (`POST /v1/messages`): a `Script` as Anthropic's event stream,
and Anthropic's error bodies. The request is validated as Anthropic does (`strict.validate_messages_request`)
by `upstream.py`, which routes it here; nothing here does I/O.

A script's answer is `message_start`, `ping`, then one content block after the other: thinking (its
`thinking_delta`s and `signature_delta`), redacted thinking, text (`text_delta`s), each tool call
(`input_json_delta` fragments); `message_delta` (stop reason and output usage) and `message_stop`. The
content deltas are paced `delay` apart; a block's start goes with its first delta, its stop with the next.
`cut_after`, `end_after`, `stall_after` and `error_after` count these events as the OpenAI stream's do
(message_start is the first); `error_after`'s event is Anthropic's `overloaded_error`.
"""

from __future__ import annotations

import json
from typing import Any

from tests.fakes import http11
from tests.fakes.answer import Answer
from tests.fakes.script import Script, split_evenly

SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"
REDACTED = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"
_STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


def error_body(status: int, message: str | None = None, *, type: str | None = None) -> dict[str, Any]:
    """Anthropic's `{"type": "error", "error": {type, message}}`, its type by the status by default."""
    default = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        529: "overloaded_error",
    }.get(status, "api_error")
    return {"type": "error", "error": {"type": type or default, "message": message or default}}


def _event(data: dict[str, Any]) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (data["type"].encode(), json.dumps(data).encode())


def _block(index: int, block: dict[str, Any], deltas: list[dict[str, Any]]) -> list[tuple[bytes, bool]]:
    """One content block's events: (frame, whether it is a content delta)."""
    events = [(_event({"type": "content_block_start", "index": index, "content_block": block}), False)]
    events += [(_event({"type": "content_block_delta", "index": index, "delta": d}), True) for d in deltas]
    events.append((_event({"type": "content_block_stop", "index": index}), False))
    return events


def events(script: Script, *, model: str, message_id: str) -> list[tuple[bytes, bool]]:
    prompt, completion = script.usage or (0, 0)
    cache_read, cache_write = script.cache or (0, 0)
    usage = {
        "input_tokens": prompt,
        "output_tokens": 1,
        "cache_read_input_tokens": cache_read,
        "cache_creation_input_tokens": cache_write,
    }
    message: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    out = [(_event({"type": "message_start", "message": message}), False), (_event({"type": "ping"}), False)]
    index = 0
    if script.thinking is not None:
        deltas = [{"type": "thinking_delta", "thinking": p} for p in split_evenly(script.thinking, 3)]
        deltas.append({"type": "signature_delta", "signature": SIGNATURE})
        out += _block(index, {"type": "thinking", "thinking": "", "signature": ""}, deltas)
        index += 1
    if script.redacted_thinking:
        out += _block(index, {"type": "redacted_thinking", "data": REDACTED}, [])
        index += 1
    if script.text_pieces:
        text = [{"type": "text_delta", "text": piece} for piece in script.text_pieces]
        out += _block(index, {"type": "text", "text": ""}, text)
        index += 1
    for call in script.calls:
        pieces = split_evenly(call.arguments, script.fragments)
        json_deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in pieces]
        out += _block(index, {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}, json_deltas)
        index += 1
    stop = script.finish_reason or ("tool_calls" if script.calls else "stop")
    delta = {"stop_reason": _STOP_REASONS.get(stop, stop), "stop_sequence": None}
    out.append(
        (_event({"type": "message_delta", "delta": delta, "usage": {"output_tokens": completion}}), False)
    )
    out.append((_event({"type": "message_stop"}), False))
    if script.error_after is not None:
        failure = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        return [*out[: script.error_after], (_event(failure), False)]
    return out


def stream(script: Script, *, model: str, message_id: str) -> Answer:
    """The streamed answer: message_start with the headers, then each content delta on its tick (with the
    structural events before it), what follows the last one right after it."""
    listed = events(script, model=model, message_id=message_id)
    complete = script.cut_after is None
    for limit in (script.cut_after, script.end_after, script.stall_after):
        if limit is not None:
            listed = listed[:limit]
    held = script.stall_after is not None
    answer = Answer(
        200,
        http11.STREAM_HEAD,
        delay=script.delay,
        wait=script.hang_before_headers,
        keep_alive=complete and not held,
        cut=not complete,
        hold=held,
    )
    if listed:
        answer.first += http11.chunk(listed[0][0])
        answer.first_events = 1
    pending = b""
    for frame, content in listed[1:]:
        pending += frame
        if content:
            answer.paced.append(http11.chunk(pending))
            pending = b""
    answer.paced_events = 1
    answer.content = len(answer.paced)
    answer.last = http11.chunk(pending) if pending else b""
    answer.last_events = 1 if pending else 0
    if complete and not held:
        answer.last += http11.LAST_CHUNK
    return answer
