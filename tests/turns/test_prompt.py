"""app.turns.prompt.rebuild: chat_messages rows → the OpenAI-format history for LiteLLM (docs/protocol.md)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from app.storage.tables import ChatMessageRow
from app.turns.prompt import TOOL_INTERRUPTED, rebuild
from tests.fakes.strict import validate_history

Message = dict[str, Any]

_ids = itertools.count(1)


def _row(type_: str, *, turn: str = "t_1", **fields: Any) -> ChatMessageRow:
    n = next(_ids)
    return ChatMessageRow(
        position=n,
        id=f"m_{n:010x}",
        session_id="s_1",
        turn_id=turn,
        type=type_,
        timestamp="2026-02-28T06:30:00.000+00:00",
        **fields,
    )


def user(text: str, *, turn: str = "t_1") -> ChatMessageRow:
    return _row("text", turn=turn, role="user", content=text, sender="alice")


def said(text: str, response: str, *, turn: str = "t_1", interrupted: bool | None = None) -> ChatMessageRow:
    return _row(
        "text",
        turn=turn,
        role="assistant",
        content=text,
        model="parley/demo",
        response_id=response,
        interrupted=interrupted,
    )


def tool(
    call_id: str,
    name: str,
    arguments: Any,
    result: str | None,
    response: str,
    *,
    turn: str = "t_1",
) -> ChatMessageRow:
    return _row(
        "tool_group",
        turn=turn,
        role="assistant",
        model="parley/demo",
        response_id=response,
        tool_call_id=call_id,
        tool_name=name,
        arguments=arguments,
        result=result,
        is_error=False if result is not None else None,
    )


def turn_start(turn: str = "t_1") -> ChatMessageRow:
    return _row("turn_start", turn=turn)


def turn_done(turn: str = "t_1") -> ChatMessageRow:
    return _row("turn_done", turn=turn, duration_seconds=1.5)


def error(code: str = "provider_error", turn: str = "t_1") -> ChatMessageRow:
    return _row("error", turn=turn, content="The model provider failed.", code=code)


def call(call_id: str, name: str, arguments: str) -> Message:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def result(call_id: str, content: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def assert_valid(messages: list[Message]) -> None:
    assert validate_history(messages) == []


# --- the system prompt -----------------------------------------------------------------------------------


def test_system_prompt_comes_first() -> None:
    messages = rebuild([user("hello")], "Be brief.")
    assert messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
    assert_valid(messages)


@pytest.mark.parametrize("prompt", [None, ""])
def test_no_system_message_without_a_prompt(prompt: str | None) -> None:
    messages = rebuild([user("hello")], prompt)
    assert messages == [{"role": "user", "content": "hello"}]
    assert_valid(messages)


def test_empty_history_with_a_prompt_is_just_the_prompt() -> None:
    assert rebuild([], "Be brief.") == [{"role": "system", "content": "Be brief."}]
    assert rebuild([], None) == []


# --- texts -----------------------------------------------------------------------------------------------


def test_user_and_assistant_texts() -> None:
    messages = rebuild([user("hi"), said("Hello there.", "r1")], None)
    assert messages == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello there."}]
    assert "tool_calls" not in messages[1]
    assert_valid(messages)


def test_texts_of_different_responses_stay_separate() -> None:
    rows = [user("one"), said("first", "r1"), user("two"), said("second", "r2")]
    messages = rebuild(rows, None)
    assert messages == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "first"},
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": "second"},
    ]
    assert_valid(messages)


# --- tool calls ------------------------------------------------------------------------------------------


def test_text_and_two_tool_groups_of_one_response_make_one_assistant_message() -> None:
    rows = [
        user("What time is it, and what is 6*7?"),
        said("Let me check.", "r1"),
        tool("call_a", "current_time", {"timezone": "UTC"}, '{"iso": "2026-02-28T06:30:00Z"}', "r1"),
        tool("call_b", "calculate", {"expression": "6*7"}, "42", "r1"),
    ]
    messages = rebuild(rows, None)
    assert messages == [
        {"role": "user", "content": "What time is it, and what is 6*7?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                call("call_a", "current_time", '{"timezone": "UTC"}'),
                call("call_b", "calculate", '{"expression": "6*7"}'),
            ],
        },
        result("call_a", '{"iso": "2026-02-28T06:30:00Z"}'),
        result("call_b", "42"),
    ]
    assert_valid(messages)


def test_arguments_are_serialized_as_json_text() -> None:
    arguments = {"query": "café ☕", "limit": 3, "nested": {"flags": [True, None]}}
    messages = rebuild([user("go"), tool("call_a", "search", arguments, "ok", "r1")], None)
    text = messages[1]["tool_calls"][0]["function"]["arguments"]
    assert isinstance(text, str)
    assert json.loads(text) == arguments
    assert "café ☕" in text  # not \u-escaped
    assert_valid(messages)


@pytest.mark.parametrize("raw", ['{"expression": "6*', "not json at all", ""])
def test_raw_string_arguments_are_kept_verbatim(raw: str) -> None:
    messages = rebuild([user("go"), tool("call_a", "calculate", raw, "error: invalid", "r1")], None)
    assert messages[1]["tool_calls"] == [call("call_a", "calculate", raw)]
    assert_valid(messages)


def test_tool_groups_without_text_have_null_content() -> None:
    rows = [
        user("time?"),
        tool("call_a", "current_time", {}, "06:30", "r1"),
        tool("call_b", "current_time", {"timezone": "Asia/Tokyo"}, "15:30", "r1"),
    ]
    messages = rebuild(rows, None)
    assert messages == [
        {"role": "user", "content": "time?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                call("call_a", "current_time", "{}"),
                call("call_b", "current_time", '{"timezone": "Asia/Tokyo"}'),
            ],
        },
        result("call_a", "06:30"),
        result("call_b", "15:30"),
    ]
    assert_valid(messages)


def test_consecutive_responses_with_tool_calls_stay_separate() -> None:
    rows = [
        user("time, then double it"),
        said("Checking.", "r1"),
        tool("call_a", "current_time", {}, "06:30", "r1"),
        tool("call_b", "calculate", {"expression": "630*2"}, "1260", "r2"),
        said("It is 06:30; doubled, 1260.", "r3"),
    ]
    messages = rebuild(rows, None)
    assert messages == [
        {"role": "user", "content": "time, then double it"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [call("call_a", "current_time", "{}")]},
        result("call_a", "06:30"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("call_b", "calculate", '{"expression": "630*2"}')],
        },
        result("call_b", "1260"),
        {"role": "assistant", "content": "It is 06:30; doubled, 1260."},
    ]
    assert_valid(messages)


def test_every_call_gets_exactly_one_result_even_without_a_stored_one() -> None:
    rows = [
        user("two tools"),
        said("Running both.", "r1"),
        tool("call_a", "current_time", {}, "06:30", "r1"),
        tool("call_b", "slow_tool", {"n": 1}, None, "r1"),
    ]
    messages = rebuild(rows, None)
    assert messages[2:] == [result("call_a", "06:30"), result("call_b", TOOL_INTERRUPTED)]
    assert TOOL_INTERRUPTED.strip()
    call_ids = [c["id"] for c in messages[1]["tool_calls"]]
    result_ids = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert result_ids == call_ids == ["call_a", "call_b"]
    assert_valid(messages)


def test_an_empty_string_result_is_kept_not_replaced() -> None:
    messages = rebuild([user("go"), tool("call_a", "noop", {}, "", "r1")], None)
    assert messages[-1] == result("call_a", "")


# --- skipped rows ----------------------------------------------------------------------------------------


def test_turn_markers_and_errors_are_skipped() -> None:
    rows = [
        turn_start("t_1"),
        user("hi", turn="t_1"),
        error(turn="t_1"),
        said("Hello.", "r1", turn="t_1"),
        turn_done("t_1"),
        turn_start("t_2"),
        user("again", turn="t_2"),
        said("Hello again.", "r2", turn="t_2"),
        error("internal_error", turn="t_2"),
        turn_done("t_2"),
    ]
    messages = rebuild(rows, None)
    assert messages == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "Hello again."},
    ]
    assert_valid(messages)


def test_an_error_between_text_and_tools_does_not_split_the_response() -> None:
    rows = [
        user("go"),
        said("Calling.", "r1"),
        error(),
        tool("call_a", "noop", {}, "done", "r1"),
        turn_done(),
    ]
    messages = rebuild(rows, None)
    assert messages == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Calling.", "tool_calls": [call("call_a", "noop", "{}")]},
        result("call_a", "done"),
    ]
    assert_valid(messages)


# --- interruptions ---------------------------------------------------------------------------------------


def test_interrupted_text_is_marked() -> None:
    rows = [user("explain"), said("First, the loop", "r1", interrupted=True)]
    messages = rebuild(rows, None)
    assert messages[-1] == {"role": "assistant", "content": "First, the loop\n\n[interrupted]"}
    assert_valid(messages)


@pytest.mark.parametrize("content", ["", None])
def test_empty_interrupted_text_is_just_the_mark(content: str | None) -> None:
    row = said("", "r1", interrupted=True)
    row.content = content
    messages = rebuild([user("explain"), row], None)
    assert messages[-1] == {"role": "assistant", "content": "[interrupted]"}
    assert_valid(messages)


def test_not_interrupted_text_is_left_alone() -> None:
    messages = rebuild([user("x"), said("done", "r1", interrupted=False)], None)
    assert messages[-1] == {"role": "assistant", "content": "done"}


def test_interrupted_text_with_an_interrupted_tool() -> None:
    rows = [
        user("look"),
        said("Searching", "r1", interrupted=True),
        tool("call_a", "grep_code", {"q": "TODO"}, "Found 15 TODOs", "r1"),
        tool("call_b", "read_file", {"path": "a.py"}, None, "r1"),
        turn_done(),
        user("stop, do something else", turn="t_2"),
    ]
    messages = rebuild(rows, None)
    assert messages == [
        {"role": "user", "content": "look"},
        {
            "role": "assistant",
            "content": "Searching\n\n[interrupted]",
            "tool_calls": [
                call("call_a", "grep_code", '{"q": "TODO"}'),
                call("call_b", "read_file", '{"path": "a.py"}'),
            ],
        },
        result("call_a", "Found 15 TODOs"),
        result("call_b", TOOL_INTERRUPTED),
        {"role": "user", "content": "stop, do something else"},
    ]
    assert_valid(messages)


# --- a whole conversation --------------------------------------------------------------------------------


def test_multi_turn_history_round_trips_exactly() -> None:
    rows = [
        turn_start("t_1"),
        user("What time is it in Tokyo?", turn="t_1"),
        said("Let me check the clock.", "r1", turn="t_1"),
        tool(
            "call_1",
            "current_time",
            {"timezone": "Asia/Tokyo"},
            "2026-02-28T15:30:00+09:00",
            "r1",
            turn="t_1",
        ),
        said("It is 15:30 in Tokyo.", "r2", turn="t_1"),
        turn_done("t_1"),
        turn_start("t_2"),
        user("And 17 * 23?", turn="t_2"),
        tool("call_2", "calculate", {"expression": "17 * 23"}, "391", "r3", turn="t_2"),
        tool("call_3", "calculate", '{"expression": "17*', "invalid arguments", "r3", turn="t_2"),
        said("17 × 23 = 391.", "r4", turn="t_2"),
        turn_done("t_2"),
        turn_start("t_3"),
        user("Tell me a long story [long]", turn="t_3"),
        said("Once upon a", "r5", turn="t_3", interrupted=True),
        turn_done("t_3"),
        turn_start("t_4"),
        user("thanks", turn="t_4"),
        error("provider_error", turn="t_4"),
        turn_done("t_4"),
        turn_start("t_5"),
        user("still there?", turn="t_5"),
        said("Yes.", "r6", turn="t_5"),
        turn_done("t_5"),
    ]
    expected: list[Message] = [
        {"role": "system", "content": "You are Parley."},
        {"role": "user", "content": "What time is it in Tokyo?"},
        {
            "role": "assistant",
            "content": "Let me check the clock.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "current_time", "arguments": '{"timezone": "Asia/Tokyo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "2026-02-28T15:30:00+09:00"},
        {"role": "assistant", "content": "It is 15:30 in Tokyo."},
        {"role": "user", "content": "And 17 * 23?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "calculate", "arguments": '{"expression": "17 * 23"}'},
                },
                {
                    "id": "call_3",
                    "type": "function",
                    "function": {"name": "calculate", "arguments": '{"expression": "17*'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_2", "content": "391"},
        {"role": "tool", "tool_call_id": "call_3", "content": "invalid arguments"},
        {"role": "assistant", "content": "17 × 23 = 391."},
        {"role": "user", "content": "Tell me a long story [long]"},
        {"role": "assistant", "content": "Once upon a\n\n[interrupted]"},
        {"role": "user", "content": "thanks\n\nstill there?"},
        {"role": "assistant", "content": "Yes."},
    ]
    messages = rebuild(rows, "You are Parley.")
    assert messages == expected
    # A failed turn left two user rows in a row ("thanks", "still there?"): they reach the model as one.
    assert validate_history(messages) == []


def test_rebuild_takes_any_iterable_and_does_not_touch_the_rows() -> None:
    rows = [user("hi"), said("First", "r1", interrupted=True), tool("call_a", "noop", {"a": 1}, None, "r1")]
    before = [row.model_dump() for row in rows]
    first = rebuild(iter(rows), None)
    assert [row.model_dump() for row in rows] == before
    assert rebuild(rows, None) == first


def thought(text: str, response: str, blocks: list[Message] | None, **fields: Any) -> ChatMessageRow:
    arguments = {"thinking_blocks": blocks} if blocks else None
    return _row(
        "reasoning", role="assistant", content=text, response_id=response, arguments=arguments, **fields
    )


SIGNED = {"type": "thinking", "thinking": "The clock knows.", "signature": "sig"}


def test_signed_reasoning_goes_back_with_its_response_and_unsigned_reasoning_does_not() -> None:
    rows = [
        user("What time is it?"),
        thought("The clock knows.", "r1", [SIGNED, {"type": "redacted_thinking", "data": "enc"}]),
        tool("call_a", "current_time", {}, "noon", "r1"),
        thought("Noon.", "r2", None),  # an OpenAI-compatible provider's: shown, never sent back
        said("It is noon.", "r2"),
    ]
    messages = rebuild(rows, None)
    assert messages == [
        {"role": "user", "content": "What time is it?"},
        {
            "role": "assistant",
            "content": None,
            "thinking_blocks": [SIGNED, {"type": "redacted_thinking", "data": "enc"}],
            "tool_calls": [call("call_a", "current_time", "{}")],
        },
        result("call_a", "noon"),
        {"role": "assistant", "content": "It is noon."},
    ]
    assert_valid(messages)


def test_reasoning_a_stop_cut_short_is_not_sent_back() -> None:
    rows = [user("Hi"), thought("Hmm", "r1", [SIGNED], interrupted=True), said("Hel", "r1", interrupted=True)]
    assert "thinking_blocks" not in rebuild(rows, None)[1]


def test_a_reasoning_whose_response_has_no_text_or_call_adds_no_message() -> None:
    rows = [user("Hi"), thought("Hmm", "r1", [SIGNED]), user("Still there?")]
    messages = rebuild(rows, None)
    assert messages == [{"role": "user", "content": "Hi\n\nStill there?"}]
    assert_valid(messages)
