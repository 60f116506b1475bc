"""One response of the fake upstream as the bytes to write and when: an `Answer` built from a `Script`.

Owns the shape of a response on the wire and its schedule, and the builders for a streamed completion,
a whole one, a non-streaming cut and any whole JSON answer. Nothing here does I/O: `connection.py`
writes an Answer from loop timers. Built once per request, with no object per chunk: the benchmark's
load runs thousands of chunks a second through this fake, on the core its load client uses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from tests.fakes import http11
from tests.fakes.script import Script


@dataclass
class Answer:
    """`first` `wait` s after the request; paced piece n at `wait + (n + 1) * delay`, on a fixed schedule
    (a late tick does not push the others back); `last` right after the last of them.

    For the record: `first` ends `first_events` SSE events, each paced piece `paced_events`, `last`
    `last_events`; the first `content` paced pieces are content chunks (text, tool-call fragments).
    """

    status: int
    first: bytes
    paced: list[bytes] = field(default_factory=list)
    last: bytes = b""
    delay: float = 0.0
    wait: float = 0.0
    keep_alive: bool = True  # False: the connection closes after `last`
    hold: bool = False  # after `last` the answer neither ends nor closes: silence until the client leaves
    cut: bool = False  # ...and that close is the script's own cut, mid-body
    first_events: int = 0
    paced_events: int = 0
    last_events: int = 0
    content: int = 0


def whole(status: int, body: bytes, headers: dict[str, str] | None = None, *, wait: float = 0.0) -> Answer:
    return Answer(status, http11.whole(status, body, headers), wait=wait)


def completion(script: Script, *, model: str, completion_id: str) -> Answer:
    """A non-streaming answer; cut: the full length announced, half the body sent, the connection closed."""
    payload = json.dumps(script.completion_body(model=model, completion_id=completion_id)).encode()
    if script.cut_after is None:
        return whole(200, payload, wait=script.hang_before_headers)
    head = http11.head(200, {"content-type": "application/json", "content-length": str(len(payload))})
    first = head + payload[: len(payload) // 2]
    return Answer(200, first, wait=script.hang_before_headers, keep_alive=False, cut=True)


def stream(script: Script, *, model: str, include_usage: bool, completion_id: str) -> Answer:
    """A streamed answer, one HTTP chunk per SSE event as OpenAI's servers send them: the role chunk with
    the headers, each content chunk on its tick, what follows them with the last one."""
    events = script.stream_events(model=model, include_usage=include_usage, completion_id=completion_id)
    complete = script.cut_after is None
    if not complete:
        events = events[: script.cut_after]
    if script.end_after is not None:
        events = events[: script.end_after]
    held = script.stall_after is not None
    if script.stall_after is not None:
        events = events[: script.stall_after]
    answer = Answer(
        200,
        http11.STREAM_HEAD,
        delay=script.delay,
        wait=script.hang_before_headers,
        keep_alive=complete and not held,
        cut=not complete,
        hold=held,
    )
    if script.sse_body is not None or script.trickle:
        _trickle(answer, script, events)
        return answer
    # Repeated pieces (the benchmark's words) share one bytes object: one frame each, hash cached.
    framed: dict[bytes, bytes] = {}
    frames = [framed.get(e) or framed.setdefault(e, http11.chunk(b"data: " + e + b"\n\n")) for e in events]
    if frames:
        paced = min(script.content_events, len(frames) - 1)
        answer.first, answer.first_events = answer.first + frames[0], 1
        answer.paced, answer.paced_events = frames[1 : paced + 1], 1
        answer.last, answer.last_events = b"".join(frames[paced + 1 :]), len(frames) - paced - 1
        # An `error_after` event may stand where a content chunk was due: paced, but not content.
        errored = script.error_after is not None and script.error_after <= paced
        answer.content = paced - errored
    if complete and not held:
        answer.last += http11.LAST_CHUNK
    return answer


def _trickle(answer: Answer, script: Script, events: list[bytes]) -> None:
    """The body (`sse_body`, else the events) in HTTP chunks of `trickle` bytes, each in two writes."""
    if script.sse_body is not None:
        body = script.sse_body.encode()
    else:
        body = b"".join(b"data: " + event + b"\n\n" for event in events)
    size = script.trickle or len(body) or 1
    for start in range(0, len(body), size):
        frame = http11.chunk(body[start : start + size])
        if script.trickle:
            half = len(frame) // 2  # one HTTP chunk across two TCP writes
            answer.paced += [frame[:half], frame[half:]]
        else:
            answer.paced.append(frame)
    if answer.keep_alive:
        answer.last = http11.LAST_CHUNK
