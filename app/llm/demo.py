"""Offline demo model "parley/demo": deterministic replies that need no API key and no network.

`DemoAdapter` streams the reply's parts in-process, paced on an absolute schedule (`PARLEY_DEMO_TOKEN_DELAY`
per token). Replies are deterministic functions of the messages and the offered tools:

- after tool results: a short answer that uses them (a call a person rejected: that it was not run, and
  the person's reason);
- a time/date question with `current_time` offered, or arithmetic with `calculate` offered: a short text,
  then (parallel) tool calls with fragmented JSON arguments;
- a request for a tool that is not offered: a plain "no such tool" answer;
- anything else: "You said: ..." plus a fixed sentence, streamed word by word;
- a last user message with attached files (docs/files.md): first a sentence naming each file it received,
  its type, its size counted from the bytes that arrived, and an image's dimensions.

Triggers in the last user message: "[slow]" (10x slower tokens), "[long]" (~400 tokens),
"[think]" (a short reasoning streamed before the reply, as a reasoning model's) and
"[call:NAME {json}]" (call NAME with that JSON, even if it is not offered).

"parley/demo-small" is the same model with a window of DEMO_SMALL_CONTEXT_WINDOW tokens: a prompt over it
is refused as a provider refuses one (`context_window_exceeded`), so that context compaction
(docs/context.md) shows offline within a few turns. Asked for a summary (the "[summary request]" mark the
compactor sends), the demo answers with the user's last points, one line each.

It always runs in the service's process, whatever PARLEY_STREAM_ADAPTER says.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import math
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from app.llm.provider_errors import provider_error
from app.llm.types import (
    FinishPart,
    ModelRequest,
    ReasoningPart,
    StreamPart,
    TextPart,
    ToolCallPart,
    UsagePart,
)

PROVIDER = "parley"
DEMO_MODEL = f"{PROVIDER}/demo"
DEMO_CONTEXT_WINDOW = 32768
DEMO_SMALL_MODEL = f"{PROVIDER}/demo-small"
DEMO_SMALL_CONTEXT_WINDOW = 2048
# Each demo model and its window.
DEMO_MODELS = {DEMO_MODEL: DEMO_CONTEXT_WINDOW, DEMO_SMALL_MODEL: DEMO_SMALL_CONTEXT_WINDOW}
SUMMARY_MARK = "[summary request]"
_SUMMARY_POINTS = 8
DEMO_MAX_OUTPUT_TOKENS = 4096
DEFAULT_TOKEN_DELAY = 0.02

_SLOW_FACTOR = 10
_LONG_TOKENS = 400
_ARG_FRAGMENT_CHARS = 8
_ECHO_MAX_WORDS = 25
_EXPLANATION = (
    "This is Parley's offline demo model: it streams tokens, tool calls and usage just like a real "
    "provider, but its answers are fixed and need no API key or network."
)
_LONG_FILLER = "The long demo reply keeps streaming so that pacing, flushing and cancellation can be watched."

_TIME_RE = re.compile(r"\b(?:time|date|clock|what day)\b", re.IGNORECASE)
_ZONE_RE = re.compile(
    r"\b(?:UTC|(?:Africa|America|Antarctica|Asia|Atlantic|Australia|Europe|Indian|Pacific|Etc)"
    r"(?:/[A-Za-z0-9_+-]+)+)\b"
)
_DATE_RE = re.compile(r"\b\d{4}-\d{2}-\d{2}(?:T[\d:.+-]+)?\b")  # "2026-11-22" is a date, not a subtraction
_NUMBER = r"\(*\s*-?\d+(?:\.\d+)?\s*\)*"
_EXPR_RE = re.compile(rf"{_NUMBER}(?:\s*(?:\*\*|[-+*/%^])\s*{_NUMBER})+")
# "calculate X": X runs to the end of the clause (" and ", punctuation, or a sentence-ending period).
_CALC_RE = re.compile(r"\b(?:calculate|compute)\s+(.+?)(?:\s+and\s|[?!;,\n]|\.(?:\s|$)|$)", re.IGNORECASE)
_CALL_RE = re.compile(r"\[call:([A-Za-z0-9_.-]+)")
_TOKEN_RE = re.compile(r"\S+\s*")
# The line before an attached file (app/turns/attachments.py).
_FILE_LABEL = "[Attached file: "
_FILE_RE = re.compile(
    r"^\[Attached file: (?P<name>.+) \((?P<type>[^,]+), \d+ bytes(?:, (?P<w>\d+)x(?P<h>\d+) pixels)?\)\]"
)
# Tool results the agent produces for failures; the demo model just echoes them back.
_ERROR_PREFIXES = (
    "unknown tool",
    "tool '",
    "error",
    "invalid",
    "failed",
    "timeout",
    "timed out",
    "approval timed out",
)
# What a person's reject gives the model (app/turns/pending_calls.py), optionally followed by ": reason".
_REJECTED = "the user rejected this tool call"


@dataclass(frozen=True)
class _Call:
    id: str
    name: str
    arguments: str  # JSON text, exactly as streamed


@dataclass
class _Plan:
    tokens: list[str] = field(default_factory=list)
    calls: list[_Call] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)  # streamed first ("[think]")

    @property
    def finish_reason(self) -> Literal["stop", "tool_calls"]:
        return "tool_calls" if self.calls else "stop"


def _text(content: object) -> str:
    """Message content as text: a string, or the text parts of a content-part list (attached files left
    out)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = (str(p.get("text", "")) for p in content if isinstance(p, dict))
        return " ".join(t for t in texts if not t.startswith(_FILE_LABEL))
    return ""


def _received(content: object) -> list[str]:
    """What arrived of each attached file: the name and dimensions its label gives, the type and size of
    the bytes that came (an image or PDF part's data URL; a text file's text)."""
    found: list[str] = []
    label: re.Match[str] | None = None
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        text = str(part.get("text") or "")
        if part.get("type") == "text" and (match := _FILE_RE.match(text)):
            rest = text[match.end() + 1 :]
            if rest or "\n" in text:  # a text file: its text follows its label
                found.append(_described(match, match["type"], len(rest.encode())))
            else:
                label = match
        elif part.get("type") in ("image_url", "file") and label is not None:
            holder = part.get("image_url") or part.get("file") or {}
            url = str(holder.get("url") or holder.get("file_data") or "") if isinstance(holder, dict) else ""
            media_type, _, data = url.removeprefix("data:").partition(";base64,")
            try:
                size = len(base64.b64decode(data, validate=True))
            except binascii.Error:
                size = 0
            found.append(_described(label, media_type, size))
            label = None
    return found


def _described(label: re.Match[str], media_type: str, size: int) -> str:
    pixels = f", {label['w']}x{label['h']} pixels" if label["w"] else ""
    return f"{label['name']} ({media_type}, {size} bytes{pixels})"


def _sentence(text: str) -> str:
    return text if text.endswith((".", "?", "!", "...")) else text + "."


def _tokens(text: str) -> list[str]:
    return _TOKEN_RE.findall(text)


def _tool_names(tools: object) -> set[str]:
    names: set[str] = set()
    for tool in tools if isinstance(tools, list) else []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.add(function["name"])
    return names


def _call_id(seed: str, index: int) -> str:
    # Reproducible ids: the same conversation always yields the same ids, which keeps replays and
    # snapshots stable; the message count in the seed makes ids differ between turns.
    return "call_" + hashlib.sha1(f"{seed}\x00{index}".encode()).hexdigest()[:24]


def _explicit_calls(user: str) -> list[tuple[str, str]]:
    """(name, arguments) for each "[call:NAME {json}]" trigger; arguments are passed through verbatim."""
    calls: list[tuple[str, str]] = []
    decoder = json.JSONDecoder()
    for match in _CALL_RE.finditer(user):
        rest = user[match.end() :]
        start = len(rest) - len(rest.lstrip())
        try:
            _, end = decoder.raw_decode(rest, start)
            arguments = rest[start:end]
        except json.JSONDecodeError:
            # Not valid JSON: stream the raw text anyway, as a sloppy real model might.
            arguments = rest[start:].split("]", 1)[0].strip() or "{}"
        calls.append((match.group(1), arguments))
    return calls


def _plan_for_user(user: str, offered: set[str], seed: str) -> _Plan:
    wanted: list[tuple[str, str]] = _explicit_calls(user)
    preface: list[str] = [f"Calling {name}." for name, _ in wanted]
    missing: list[str] = []
    if _TIME_RE.search(user):
        zone = _ZONE_RE.search(user)
        if "current_time" in offered:
            wanted.append(("current_time", json.dumps({"timezone": zone.group(0) if zone else "UTC"})))
            preface.append("Let me check the clock.")
        else:
            missing.append("current_time")
    expr = _EXPR_RE.search(_DATE_RE.sub(" ", user))
    calc = _CALC_RE.search(user)
    if expr or calc:
        expression = calc.group(1).strip() if calc else expr.group(0).strip() if expr else ""
        if "calculate" in offered:
            wanted.append(("calculate", json.dumps({"expression": expression})))
            preface.append("Let me work that out.")
        else:
            missing.append("calculate")
    if wanted:
        calls = [_Call(_call_id(seed, i), name, args) for i, (name, args) in enumerate(wanted)]
        return _Plan(_tokens(" ".join(preface)), calls)
    if missing:
        text = f"This session has no {' or '.join(missing)} tool, so I cannot do that here."
        return _Plan(_tokens(text))
    words = user.split()
    echo = " ".join(words[:_ECHO_MAX_WORDS]) + (" ..." if len(words) > _ECHO_MAX_WORDS else "")
    text = f"You said: {_sentence(echo or 'nothing')} {_EXPLANATION}"
    if "[long]" not in user:
        return _Plan(_tokens(text))
    text += f" {_LONG_FILLER}" * (_LONG_TOKENS // len(_LONG_FILLER.split()) + 1)
    return _Plan(_tokens(text)[:_LONG_TOKENS])


def _describe_result(name: str, content: str) -> str:
    """One sentence about one tool result; structured (JSON) results are unwrapped when they are simple."""
    stripped = content.strip()
    try:
        data: object = json.loads(stripped)
    except ValueError:
        data = stripped
    if isinstance(data, str) and data.lower().startswith(_REJECTED):
        reason = data[len(_REJECTED) :].lstrip(":. ").strip()
        because = f" (your reason: {_sentence(reason)[:-1]})" if reason else ""
        return f"You rejected the {name} call{because}, so I did not run it."
    if isinstance(data, dict) and "error" in data:
        return _sentence(f"The tool reported an error: {data['error']}")
    if isinstance(data, str) and data.lower().startswith(_ERROR_PREFIXES):
        return _sentence(f"The tool reported an error: {data}")
    if isinstance(data, dict):
        keys = ("iso", "datetime", "time", "now", "result", "value")
        value = next((data[k] for k in keys if k in data), None)
        day = data.get("weekday") or data.get("day")
        if value is not None:
            data = f"{value} ({day})" if day else value
    if name == "current_time":
        return f"The current time is {data}."
    if name == "calculate":
        return f"The result is {data}."
    return f"The {name} tool returned: {data if isinstance(data, str) else json.dumps(data)}."


def _plan_for_tool_results(messages: Sequence[Mapping[str, object]]) -> _Plan:
    # Tool messages carry only tool_call_id; the function name is in the assistant turn that made the call.
    names: dict[object, str] = {}
    for message in messages:
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict) and isinstance(call.get("function"), dict):
                names[call.get("id")] = str(call["function"].get("name"))
    trailing: list[Mapping[str, object]] = []
    for message in reversed(messages):
        if message.get("role") != "tool":
            break
        trailing.insert(0, message)
    sentences = []
    for result in trailing:
        name = str(result.get("name") or names.get(result.get("tool_call_id"), "tool"))
        sentences.append(_describe_result(name, _text(result.get("content"))))
    return _Plan(_tokens(" ".join(sentences)))


def _plan(messages: Sequence[Mapping[str, object]], tools: object) -> tuple[_Plan, bool]:
    """The whole reply, decided up front, and whether the "[slow]" trigger is on."""
    user = next((_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
    if SUMMARY_MARK in user:
        return _Plan(_tokens(_summary(user))), False
    if messages and messages[-1].get("role") == "tool":
        plan = _plan_for_tool_results(messages)
    else:
        plan = _plan_for_user(user, _tool_names(tools), f"{len(messages)}\x00{user}")
        received = _received(messages[-1].get("content")) if messages else []
        if received:
            count = f"{len(received)} file{'s' if len(received) > 1 else ''}"
            plan.tokens = _tokens(f"I received {count}: {'; '.join(received)}. ") + plan.tokens
        if "[think]" in user:
            plan.reasoning = _tokens(_thought(plan))
    return plan, "[slow]" in user


def _summary(request: str) -> str:
    """The summary so far's points and one for each new user line, the last _SUMMARY_POINTS of them."""
    points = [line for line in request.splitlines() if line.startswith("- ")]
    for line in request.splitlines():
        if line.startswith("user: "):
            words = line.removeprefix("user: ").split()
            points.append("- The user said: " + " ".join(words[:12]) + (" ..." if len(words) > 12 else ""))
    return "\n".join(points[-_SUMMARY_POINTS:]) or "- Nothing to keep."


def _thought(plan: _Plan) -> str:
    if plan.calls:
        names = " and ".join(sorted({call.name for call in plan.calls}))
        return f"The user asks for something {names} can tell me. I will call it, then answer."
    return "The user wants a reply. Nothing here needs a tool, so I will answer directly."


def _prompt_tokens(messages: Sequence[Mapping[str, object]], tools: object) -> int:
    """A cheap deterministic estimate (4 characters per token); no tokenizer, so no download risk."""
    chars = sum(len(_text(m.get("content"))) + len(json.dumps(m.get("tool_calls") or "")) for m in messages)
    return max(1, (chars + len(json.dumps(tools or []))) // 4)


def _fragments(call: _Call, index: int) -> list[ToolCallPart]:
    """OpenAI-style tool-call deltas: id and name with empty arguments first, then argument pieces."""
    size = _ARG_FRAGMENT_CHARS
    pieces = [call.arguments[i : i + size] for i in range(0, len(call.arguments), size)]
    return [
        ToolCallPart(index, call.id, call.name, ""),
        *(ToolCallPart(index, None, None, piece) for piece in pieces),
    ]


def _usage(prompt: int, completion: int) -> UsagePart:
    return UsagePart(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


WaitUntil = Callable[[float], Awaitable[None]]


async def sleep_until(due: float) -> None:
    """Waits until the loop's clock reads `due` (at once, but still yielding to the loop, when it is past)."""
    await asyncio.sleep(max(0.0, due - asyncio.get_running_loop().time()))


class Pacer:
    """Wakes every paced stream due within the same `quantum` with one timer.

    With `asyncio.sleep` each demo token costs its own timer (created, armed, fired, freed); at 200
    streams of 50 tokens a second that was the demo's largest single cost. Here a part due at t waits
    for the slot that ends at the first multiple of `quantum` at or after t: at most a quantum late
    (the loop's timers may fire up to a millisecond early), and streams due in the same slot share one
    timer. Each waiter has its own future, so a cancelled stream cancels only its own wait. Ten
    milliseconds: on this kind of machine every wake-up of the loop costs ~170 µs of CPU (measured with a
    bare ticker), so fewer, fuller slots are what makes a paced token cheap.
    """

    def __init__(self, quantum: float = 0.01) -> None:
        self.quantum = quantum
        self._slots: dict[int, list[asyncio.Future[None]]] = {}

    async def until(self, due: float) -> None:
        loop = asyncio.get_running_loop()
        if due - loop.time() <= 0.001:
            await asyncio.sleep(0)  # due already: still let the loop run between parts
            return
        slot = math.ceil(due / self.quantum)
        waiters = self._slots.get(slot)
        if waiters is None:
            waiters = self._slots[slot] = []
            loop.call_at(slot * self.quantum, self._fire, slot)
        waiter = loop.create_future()
        waiters.append(waiter)
        await waiter

    def _fire(self, slot: int) -> None:
        for waiter in self._slots.pop(slot, ()):
            if not waiter.done():
                waiter.set_result(None)


async def demo_parts(
    messages: Sequence[Mapping[str, object]],
    tools: object,
    token_delay: float,
    wait_until: WaitUntil = sleep_until,
) -> AsyncGenerator[StreamPart, None]:
    """The reply as stream parts: text tokens, tool-call fragments, then the finish reason and usage.

    Part n is due at start + n x delay (not delay after the previous one), so a loop that runs late
    catches up instead of drifting. No try/except: a CancelledError from a wait reaches the consumer as
    is.
    """
    plan, slow = _plan(messages, tools)
    # Tokens stay plain strings until their turn: 400 part objects per stream made up front were, at 200
    # streams, 80,000 objects the collector walked in every full collection (pauses of 200 ms and more).
    fragments = [fragment for index, call in enumerate(plan.calls) for fragment in _fragments(call, index)]
    count = len(plan.reasoning) + len(plan.tokens) + len(fragments)
    delay = token_delay * (_SLOW_FACTOR if slow else 1)
    start = asyncio.get_running_loop().time()
    n = 0
    for token in plan.reasoning:
        n += 1
        if delay > 0:
            await wait_until(start + n * delay)
        yield ReasoningPart(token)
    for token in plan.tokens:
        n += 1
        if delay > 0:
            await wait_until(start + n * delay)
        yield TextPart(token)
    for fragment in fragments:
        n += 1
        if delay > 0:
            await wait_until(start + n * delay)
        yield fragment
    yield FinishPart(plan.finish_reason)
    yield _usage(_prompt_tokens(messages, tools), count)


def demo_completion(
    messages: Sequence[Mapping[str, object]], tools: object
) -> tuple[dict[str, Any], str, UsagePart]:
    """The whole reply at once (for a non-streaming call): the assistant message, finish reason, usage."""
    plan, _ = _plan(messages, tools)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(plan.tokens) or None}
    if plan.calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in plan.calls
        ]
    completion = len(plan.tokens) + sum(len(_fragments(c, i)) for i, c in enumerate(plan.calls))
    return message, plan.finish_reason, _usage(_prompt_tokens(messages, tools), completion)


class DemoAdapter:
    """The demo model as a stream adapter: parts straight from the plan, no LiteLLM in the way, paced by
    one shared `Pacer` (or `wait_until`)."""

    def __init__(self, token_delay: float = DEFAULT_TOKEN_DELAY, wait_until: WaitUntil | None = None) -> None:
        self.token_delay = token_delay
        self._wait_until = wait_until or Pacer().until

    def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
        window = DEMO_MODELS.get(request.model.name, DEMO_CONTEXT_WINDOW)
        if _prompt_tokens(request.messages, request.tools) > window:
            return _refused()
        return demo_parts(request.messages, request.tools, self.token_delay, self._wait_until)


async def _refused() -> AsyncGenerator[StreamPart, None]:
    """A prompt over the demo model's window: refused before any output, as a provider refuses it."""
    raise provider_error("context_window_exceeded", status=400)
    yield  # a generator, like every stream
