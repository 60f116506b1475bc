"""Offline demo model "parley/demo": a LiteLLM custom provider that needs no API key and no network.

It goes through the same `litellm.acompletion` path as real providers (chunk wrapping, tool-call deltas,
finish and usage chunks), so `make run` and the tests exercise the real streaming code. Replies are
deterministic functions of the messages and the offered tools:

- after tool results: a short answer that uses them;
- a time/date question with `current_time` offered, or arithmetic with `calculate` offered: a short text,
  then (parallel) tool calls with fragmented JSON arguments;
- a request for a tool that is not offered: a plain "no such tool" answer;
- anything else: "You said: ..." plus a fixed sentence, streamed word by word.

Triggers in the last user message: "[slow]" (10x slower tokens), "[long]" (~400 tokens) and
"[call:NAME {json}]" (call NAME with that JSON, even if it is not offered).

Import this module only after LITELLM_LOCAL_MODEL_COST_MAP=True is set: importing litellm otherwise
fetches the cost map over the network.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypedDict

import litellm

PROVIDER = "parley"
DEMO_MODEL = f"{PROVIDER}/demo"
DEMO_CONTEXT_WINDOW = 32768
DEMO_MAX_OUTPUT_TOKENS = 4096
DEFAULT_TOKEN_DELAY = 0.02

_SLOW_FACTOR = 10
_LONG_TOKENS = 400
_ARG_FRAGMENT_CHARS = 8
_ECHO_MAX_WORDS = 25
_EXPLANATION = (
    "This is Parley's offline demo model: it streams through the same LiteLLM code path as a real "
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
# Tool results the agent produces for failures; the demo model just echoes them back.
_ERROR_PREFIXES = ("unknown tool", "tool '", "error", "invalid", "failed", "timeout", "timed out")


class DemoChunk(TypedDict):
    """The keys of litellm's `GenericStreamingChunk` (mypy sees litellm as Any, hence this mirror)."""

    text: str
    tool_use: dict[str, object] | None
    is_finished: bool
    finish_reason: str
    usage: dict[str, int] | None
    index: int


@dataclass(frozen=True)
class _Call:
    id: str
    name: str
    arguments: str  # JSON text, exactly as streamed


@dataclass
class _Plan:
    tokens: list[str] = field(default_factory=list)
    calls: list[_Call] = field(default_factory=list)

    @property
    def finish_reason(self) -> Literal["stop", "tool_calls"]:
        return "tool_calls" if self.calls else "stop"


def _text(content: object) -> str:
    """Message content as text: a string, or the text parts of a content-part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


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
    if messages and messages[-1].get("role") == "tool":
        plan = _plan_for_tool_results(messages)
    else:
        plan = _plan_for_user(user, _tool_names(tools), f"{len(messages)}\x00{user}")
    return plan, "[slow]" in user


def _prompt_tokens(messages: Sequence[Mapping[str, object]], tools: object) -> int:
    """A cheap deterministic estimate (4 characters per token); no tokenizer, so no download risk."""
    chars = sum(len(_text(m.get("content"))) + len(json.dumps(m.get("tool_calls") or "")) for m in messages)
    return max(1, (chars + len(json.dumps(tools or []))) // 4)


def _fragments(call: _Call) -> list[dict[str, object]]:
    """OpenAI-style tool-call deltas: id and name with empty arguments first, then argument pieces."""
    size = _ARG_FRAGMENT_CHARS
    pieces = [call.arguments[i : i + size] for i in range(0, len(call.arguments), size)]
    fragments: list[dict[str, object]] = [{"id": call.id, "function": {"name": call.name, "arguments": ""}}]
    fragments += [{"id": None, "function": {"name": None, "arguments": p}} for p in pieces]
    return fragments


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _chunk(text: str = "", tool_use: dict[str, object] | None = None) -> DemoChunk:
    return {
        "text": text,
        "tool_use": tool_use,
        "is_finished": False,
        "finish_reason": "",
        "usage": None,
        "index": 0,
    }


class DemoLLM(litellm.CustomLLM):  # type: ignore[misc]  # litellm is untyped (Any) for mypy
    """The handler behind "parley/...". litellm strips the provider prefix: `model` arrives as "demo"."""

    def __init__(self, token_delay: float = DEFAULT_TOKEN_DELAY) -> None:
        super().__init__()
        self.token_delay = token_delay

    # litellm calls handlers with keyword arguments only (main.py `_complete_custom_providers`), so the
    # dozen unused ones (api_base, api_key, logging_obj, timeout, ...) are absorbed by **_unused.
    async def astreaming(
        self,
        *,
        messages: Sequence[Mapping[str, object]],
        optional_params: Mapping[str, object],
        **_unused: object,
    ) -> AsyncIterator[DemoChunk]:
        tools = optional_params.get("tools")
        plan, slow = _plan(messages, tools)
        delay = self.token_delay * (_SLOW_FACTOR if slow else 1)
        emitted = 0
        # No try/except here: CancelledError from sleep must reach the consumer unchanged.
        for token in plan.tokens:
            if delay > 0:
                await asyncio.sleep(delay)
            emitted += 1
            yield _chunk(text=token)
        for index, call in enumerate(plan.calls):
            for fragment in _fragments(call):
                if delay > 0:
                    await asyncio.sleep(delay)
                emitted += 1
                yield _chunk(tool_use={**fragment, "type": "function", "index": index})
        usage = _usage(_prompt_tokens(messages, tools), emitted)
        yield {**_chunk(), "is_finished": True, "finish_reason": plan.finish_reason, "usage": usage}

    async def acompletion(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, object]],
        optional_params: Mapping[str, object],
        **_unused: object,
    ) -> litellm.ModelResponse:
        tools = optional_params.get("tools")
        plan, _ = _plan(messages, tools)
        message: dict[str, object] = {"role": "assistant", "content": "".join(plan.tokens) or None}
        if plan.calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in plan.calls
            ]
        completion = len(plan.tokens) + sum(len(_fragments(c)) for c in plan.calls)
        return litellm.ModelResponse(
            model=model,
            choices=[{"index": 0, "finish_reason": plan.finish_reason, "message": message}],
            usage=_usage(_prompt_tokens(messages, tools), completion),
        )


def register_demo(token_delay: float = DEFAULT_TOKEN_DELAY) -> None:
    """Make "parley/demo" callable through litellm and known to `get_model_info`. Idempotent.

    Mutates litellm's process-global state: call once at startup, never per request.
    """
    others = [item for item in litellm.custom_provider_map if item.get("provider") != PROVIDER]
    litellm.custom_provider_map = [*others, {"provider": PROVIDER, "custom_handler": DemoLLM(token_delay)}]
    # acompletion re-reads the map on every call (utils.function_setup -> custom_llm_setup), but until
    # then "parley" is not in litellm.provider_list, so get_llm_provider("parley/demo") would fail.
    litellm.utils.custom_llm_setup()
    litellm.register_model(
        {
            DEMO_MODEL: {
                "max_input_tokens": DEMO_CONTEXT_WINDOW,
                "max_output_tokens": DEMO_MAX_OUTPUT_TOKENS,
                "max_tokens": DEMO_MAX_OUTPUT_TOKENS,
                "litellm_provider": PROVIDER,
                "mode": "chat",
                "supports_function_calling": True,
                "supports_parallel_function_calling": True,
                "input_cost_per_token": 0.0,
                "output_cost_per_token": 0.0,
                # Without the cache prices, register_model logs a WARNING for a model with custom pricing.
                "cache_creation_input_token_cost": 0.0,
                "cache_read_input_token_cost": 0.0,
            }
        }
    )
