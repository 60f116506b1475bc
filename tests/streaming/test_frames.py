"""Drafts and frames (app.streaming.frames): the text_delta fast path is byte-equal to the event model's
JSON, a frame's SSE bytes are sse-starlette's encoding, built once, and a turn's edges carry their turn
as a field set when the event is made."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sse_starlette import ServerSentEvent

from app.protocol.events import AgentStatus, TextDelta, TurnDone, TurnStart
from app.streaming.frames import Draft, Frame, Publisher

SID = "s_1"


def publisher() -> tuple[Publisher, list[Draft]]:
    """A publisher of session SID, and the drafts it publishes."""
    pending: list[Draft] = []
    return Publisher(SID, pending.append), pending


AT = "2026-11-24T13:40:00.123Z"


@pytest.mark.parametrize(
    "text",
    [
        " hello",
        "",
        'quote " backslash \\ slash /',
        "\n\r\t\b\f\x00\x01\x1f\x7f",
        "é 日本 😀 \u2028\u2029 \ufeff",
        "data: not a frame\n\nid: 9\n",
    ],
)
@pytest.mark.parametrize(
    "first",
    [
        {},
        {"timestamp": AT, "model": "demo"},
        {"timestamp": AT, "model": 'm"odel é'},
        {"timestamp": AT, "model": None},
    ],
    ids=["later-delta", "first", "first-escaped-model", "first-null-model"],
)
def test_the_text_delta_fast_path_is_byte_equal_to_the_event_model(text: str, first: dict[str, Any]) -> None:
    """The hot path builds text_delta JSON by hand, a message's first delta (with its timestamp and
    model) as every later one: it must be exactly what TextDelta serializes to."""
    events, pending = publisher()
    events.text_delta("msg_1", text, **first)
    events.emit(TextDelta, id="msg_1", text=text, **first)
    fast, slow = (draft.number(n) for n, draft in enumerate(pending, start=1))
    assert (fast.seq, slow.seq) == (1, 2)
    assert fast.data == slow.data.replace('"seq":2', '"seq":1')
    assert json.loads(fast.data) == {
        "type": "text_delta",
        "seq": 1,
        "session_id": SID,
        "id": "msg_1",
        "text": text,
        **first,
    }


def test_the_fast_path_keeps_each_messages_own_id_when_messages_alternate() -> None:
    events, pending = publisher()
    for i, mid in enumerate(["m_a", "m_a", "m_b", "m_a"]):
        events.text_delta(mid, f"t{i}")
    frames = [draft.number(n) for n, draft in enumerate(pending, start=1)]
    assert [json.loads(f.data)["id"] for f in frames] == ["m_a", "m_a", "m_b", "m_a"]
    assert [json.loads(f.data)["seq"] for f in frames] == [1, 2, 3, 4]
    assert [json.loads(f.data)["text"] for f in frames] == ["t0", "t1", "t2", "t3"]


def test_a_frames_sse_bytes_are_sse_starlettes_encoding_built_once() -> None:
    frame = Frame(7, "text_delta", '{"text":"a\\nb"}')
    expected = ServerSentEvent(data=frame.data, event=frame.type, id="7", sep="\n").encode()
    assert frame.sse() == expected
    assert b"\r" not in frame.sse()
    assert frame.sse() is frame.sse()


def test_a_turns_edges_carry_their_turn_and_no_other_frame_does() -> None:
    """turn_start and turn_done name their turn in `turn`, from the event itself; an agent_status that
    names the turn is no edge, and a text delta whose text reads like a turn_done is a text delta: nobody
    has to read the JSON to learn where a turn starts or ends."""
    events, drafts = publisher()
    events.emit(TurnStart, id="m_1", turn_id="t_1", timestamp=AT)
    events.emit(AgentStatus, status="thinking", turn_id="t_1")
    events.text_delta("m_2", '{"type":"turn_done","turn_id":"t_1"}', timestamp=AT, model="m")
    events.text_delta("m_2", '{"type":"turn_done","seq":3,"turn_id":"t_1"}')
    events.emit(TurnDone, id="m_3", turn_id="t_1", timestamp=AT, duration_seconds=1.0, status="completed")
    frames = [d.number(seq) for seq, d in enumerate(drafts, start=1)]
    assert [(f.type, f.turn) for f in frames] == [
        ("turn_start", "t_1"),
        ("agent_status", None),
        ("text_delta", None),
        ("text_delta", None),
        ("turn_done", "t_1"),
    ]
    assert [json.loads(f.data).get("turn_id") for f in frames] == ["t_1", "t_1", None, None, "t_1"]
