"""Events on their way to clients: a Draft is published (serialized once, not yet numbered), and becomes a
Frame (numbered, committed to the log, ready for every subscriber) in the transaction that logs it.

A frame that starts or ends a turn (turn_start, turn_done) carries that turn's id as `turn`, set here
when the event is made and kept beside the JSON wherever the frame travels (the broker's ring, the Redis
relay's entries, the log's reads): whoever waits for a turn's end reads `frame.type` and `frame.turn`,
never the JSON (docs/development.md, "How a turn's end is known").

The number is the only part of an event's JSON not known when it is published: every event's JSON starts
with `{"type":"<type>","seq":<seq>` (the field order of protocol.events._Event), so a Draft keeps the rest
and numbering it is one string concatenation.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sse_starlette import ServerSentEvent

from app.protocol.events import TurnDone, TurnStart, _Event

# Every SSE line ends in LF (sse-starlette's default is CRLF, which the spec allows too): a shell script that
# greps `^id:` then gets the id without a trailing CR, and can send it back as Last-Event-ID.
SSE_LINE_END = "\n"

# json.dumps(s, ensure_ascii=False) for a str, without the encoder object's Python layer.
json_string: Callable[[str], str] = json.encoder.encode_basestring


# The frame types that carry `turn`: a turn's edges, in the order they come.
TURN_EDGES = ("turn_start", "turn_done")


@dataclass(slots=True)
class Frame:
    """A committed event: its number (the SSE id), its type (the SSE event) and its JSON (the SSE data);
    `turn`: the turn it starts or ends (TURN_EDGES), None for every other type."""

    seq: int
    type: str
    data: str
    turn: str | None = None
    _sse: bytes | None = field(default=None, compare=False, repr=False)

    def sse(self) -> bytes:
        """The frame as SSE bytes (sse-starlette's encoding), built once however many clients get it."""
        encoded = self._sse
        if encoded is None:
            encoded = self._sse = ServerSentEvent(
                data=self.data, event=self.type, id=str(self.seq), sep=SSE_LINE_END
            ).encode()
        return encoded


class Draft(NamedTuple):
    """A published event waiting for its number: its JSON after `"seq":<n>`. A tuple of strings: the
    collector stops tracking it, and a busy process holds thousands between two commits. `turn`: as the
    Frame's, left at its default by every text delta."""

    session_id: str
    type: str
    rest: str
    turn: str | None = None

    def number(self, seq: int) -> Frame:
        return Frame(seq, self.type, f'{{"type":"{self.type}","seq":{seq}{self.rest}', self.turn)


def draft(session_id: str, cls: type[_Event], **fields: Any) -> Draft:
    """The event `cls(**fields)` of the session, serialized once by its model."""
    event = cls(seq=0, session_id=session_id, **fields)
    data = event.model_dump_json()
    head = f'{{"type":"{event.type}","seq":0'
    if not data.startswith(head):  # a model whose fields do not start with type and seq
        raise ValueError(f"{cls.__name__} does not serialize type and seq first")
    turn = event.turn_id if isinstance(event, TurnStart | TurnDone) else None
    return Draft(session_id, event.type, data[len(head) :], turn)


class Publisher:
    """One session's events, handed to the event log's outbox (`add`) to be numbered when committed."""

    __slots__ = ("_add", "_delta_message", "_delta_middle", "session_id")

    def __init__(self, session_id: str, add: Callable[[Draft], None]) -> None:
        self.session_id = session_id
        self._add = add
        # The part of a text_delta's JSON that repeats for every delta of one message.
        self._delta_message: str | None = None
        self._delta_middle = ""

    def emit(self, cls: type[_Event], **fields: Any) -> None:
        self._add(draft(self.session_id, cls, **fields))

    def text_delta(
        self, message_id: str, text: str, *, timestamp: str | None = None, model: str | None = None
    ) -> None:
        """`emit(TextDelta, id=message_id, text=text, ...)` without building a model: the hot path (every
        delta, a message's first with its `timestamp` and `model`). tests/streaming/test_frames.py holds
        it byte-equal to the model's JSON; `text` must be valid Unicode (protocol.events.clean_text)."""
        if self._delta_message != message_id:
            self._delta_middle = (
                f',"session_id":{json_string(self.session_id)},"id":{json_string(message_id)},"text":'
            )
            self._delta_message = message_id
        rest = f"{self._delta_middle}{json_string(text)}"
        if timestamp is not None:  # TextDelta leaves both out without a timestamp
            rest = f'{rest},"timestamp":{json_string(timestamp)},"model":{_json_or_null(model)}'
        self._add(Draft(self.session_id, "text_delta", f"{rest}}}"))


def _json_or_null(value: str | None) -> str:
    return "null" if value is None else json_string(value)
