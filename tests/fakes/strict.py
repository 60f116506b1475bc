"""Anthropic-style validation of an OpenAI-format `messages` list, as a pure function.

Owns `validate_history`. OpenAI itself tolerates histories that Anthropic's Messages API rejects with a
400; a service that may be pointed at either must only produce histories both accept. The fake upstream
uses this in strict mode, and other tests can call it directly on the history they built.

`validate_messages_request` checks a request in Anthropic's own format instead (the fake's Anthropic
route, tests/fakes/anthropic.py), as the Messages API does.

Rules (each violation yields one human-readable problem naming the message index):
- the list is non-empty; a `system` (or `developer`) message may only be the first message;
- the first non-system message is a `user` message;
- no two consecutive `user` or `assistant` messages (system messages are skipped when comparing);
  `tool` followed by `user` is also consecutive for Anthropic (a tool result is a user turn) but LiteLLM
  merges those, so that rule is opt-in through `forbid_tool_then_user`;
- an assistant message with `tool_calls` is followed immediately by exactly one `tool` message per
  `tool_call_id`, in any order, before any other message; no orphan or duplicated tool results;
- an assistant message needs non-blank text or tool_calls (LiteLLM drops an empty text next to
  tool_calls, so `content: ""` with tool_calls is fine); a user message needs non-blank content.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_SYSTEM_ROLES = {"system", "developer"}
_KNOWN_ROLES = _SYSTEM_ROLES | {"user", "assistant", "tool"}


def _has_text(content: Any) -> bool:
    """True when content carries something Anthropic accepts as non-empty."""
    if content is None:
        return False
    if isinstance(content, str):
        return bool(content.strip())
    if isinstance(content, list):
        for part in content:
            if not isinstance(part, Mapping):
                continue
            if part.get("type") != "text":
                return True  # images, documents...: not text, but not empty either
            if str(part.get("text") or "").strip():
                return True
        return False
    return True


def _call_ids(message: Mapping[str, Any], index: int, problems: list[str]) -> list[str]:
    ids: list[str] = []
    for n, call in enumerate(message.get("tool_calls") or []):
        call_id = call.get("id") if isinstance(call, Mapping) else None
        if not call_id:
            problems.append(f"messages[{index}]: tool_calls[{n}] has no id")
            continue
        if call_id in ids:
            problems.append(f"messages[{index}]: tool_calls[{n}] repeats id {call_id!r}")
            continue
        ids.append(str(call_id))
    return ids


class _Checker:
    """One left-to-right pass; state is the previous turn role and the tool calls awaiting results."""

    def __init__(self, forbid_tool_then_user: bool) -> None:
        self.forbid_tool_then_user = forbid_tool_then_user
        self.problems: list[str] = []
        self.prev_role: str | None = None  # previous non-system role
        self.prev_index = -1
        self.pending: dict[str, bool] = {}  # call id -> answered, for the last assistant tool_calls turn
        self.pending_at = -1  # index of that assistant message, -1 when no tool results are expected

    def close_pending(self, index: int) -> None:
        """A non-tool message (or the end) arrived: every pending call must have been answered."""
        if self.pending_at >= 0:
            missing = [cid for cid, answered in self.pending.items() if not answered]
            if missing:
                where = f"before messages[{index}]" if index >= 0 else "at the end of the list"
                self.problems.append(
                    f"messages[{self.pending_at}]: assistant tool_calls without a tool result {where}: "
                    + ", ".join(missing)
                )
        self.pending, self.pending_at = {}, -1

    def check(self, index: int, message: Any) -> None:
        if not isinstance(message, Mapping):
            self.problems.append(f"messages[{index}]: not an object")
            return
        role = message.get("role")
        if role not in _KNOWN_ROLES:
            self.problems.append(f"messages[{index}]: unknown role {role!r}")
            return
        if role != "tool":
            self.close_pending(index)
        if role in _SYSTEM_ROLES:
            if index != 0:
                self.problems.append(f"messages[{index}]: {role} message must be the first message only")
            return
        if self.prev_role is None and role != "user":
            self.problems.append(
                f"messages[{index}]: the first non-system message must be 'user', not {role!r}"
            )
        self.check_order(index, role)
        if role == "tool":
            self.check_tool(index, message)
        elif role == "assistant":
            self.check_assistant(index, message)
        elif not _has_text(message.get("content")):
            self.problems.append(f"messages[{index}]: user message has empty content")
        self.prev_role, self.prev_index = role, index

    def check_order(self, index: int, role: str) -> None:
        prev = self.prev_role
        if prev == role and role in ("user", "assistant"):
            self.problems.append(
                f"messages[{index}]: two consecutive {role!r} messages "
                f"(messages[{self.prev_index}] and messages[{index}])"
            )
        elif prev == "tool" and role == "user" and self.forbid_tool_then_user:
            self.problems.append(
                f"messages[{index}]: 'user' message right after tool results "
                "(Anthropic counts tool results as a user turn)"
            )

    def check_assistant(self, index: int, message: Mapping[str, Any]) -> None:
        ids = _call_ids(message, index, self.problems)
        if not message.get("tool_calls") and not _has_text(message.get("content")):
            self.problems.append(
                f"messages[{index}]: assistant message has empty text content and no tool_calls"
            )
        if ids:
            self.pending, self.pending_at = dict.fromkeys(ids, False), index

    def check_tool(self, index: int, message: Mapping[str, Any]) -> None:
        call_id = message.get("tool_call_id")
        if self.pending_at < 0 or call_id not in self.pending:
            self.problems.append(
                f"messages[{index}]: tool message with tool_call_id {call_id!r} has no "
                "matching call in the immediately preceding assistant message"
            )
        elif self.pending[call_id]:
            self.problems.append(f"messages[{index}]: duplicate tool result for tool_call_id {call_id!r}")
        else:
            self.pending[call_id] = True


def validate_history(messages: Sequence[Any], *, forbid_tool_then_user: bool = False) -> list[str]:
    """Return the problems Anthropic would reject `messages` for; an empty list means it is valid."""
    if not messages:
        return ["messages: the list is empty"]
    checker = _Checker(forbid_tool_then_user)
    for index, message in enumerate(messages):
        checker.check(index, message)
    checker.close_pending(-1)
    return checker.problems


# ----- Anthropic's own request format (the fake's POST /v1/messages) -------------------------------------

_MAX_BREAKPOINTS = 4


def _blank(text: Any) -> bool:
    return not isinstance(text, str) or not text.strip()


def _check_blocks(where: str, role: str, blocks: list[Any], problems: list[str]) -> None:
    allowed = {
        "user": {"text", "image", "document", "tool_result"},
        "assistant": {"text", "tool_use", "thinking", "redacted_thinking"},
    }[role]
    seen_other = False
    for n, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, Mapping) else None
        at = f"{where}.content[{n}]"
        if kind not in allowed:
            problems.append(f"{at}: a {role} message cannot hold a {kind!r} block")
        elif kind == "text" and _blank(block.get("text")):
            problems.append(f"{at}: text content blocks must contain non-whitespace text")
        elif kind == "tool_use" and not (
            block.get("id") and block.get("name") and isinstance(block.get("input"), Mapping)
        ):
            problems.append(f"{at}: tool_use needs an id, a name and an input object")
        elif kind == "thinking" and _blank(block.get("signature")):
            problems.append(f"{at}: thinking blocks need their signature")
        elif kind == "tool_result":
            if seen_other:
                problems.append(f"{at}: tool_result blocks must come first in the user message")
            content = block.get("content")
            if isinstance(content, str) and not content:
                problems.append(f"{at}: tool_result content must not be an empty string")
        if kind != "tool_result":
            seen_other = True


def _ids(blocks: list[Any], kind: str, key: str) -> list[str]:
    return [str(b.get(key)) for b in blocks if isinstance(b, Mapping) and b.get("type") == kind]


def _check_tool_pairs(messages: list[Any], problems: list[str]) -> None:
    """Every tool_use is answered by a tool_result in the next message, and only those are answered."""
    for i, message in enumerate(messages):
        blocks = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(blocks, list):
            blocks = []
        results = _ids(blocks, "tool_result", "tool_use_id")
        previous = messages[i - 1].get("content") if i > 0 and isinstance(messages[i - 1], Mapping) else []
        uses = _ids(previous if isinstance(previous, list) else [], "tool_use", "id")
        for result in results:
            if result not in uses:
                problems.append(
                    f"messages.{i}: unexpected tool_use_id found in tool_result blocks: {result}. Each "
                    "tool_result block must have a corresponding tool_use block in the previous message."
                )
        if i > 0 and uses:
            missing = [u for u in uses if u not in results]
            if missing:
                problems.append(
                    f"messages.{i}: tool_use ids were found without tool_result blocks immediately "
                    f"after: {', '.join(missing)}"
                )


def _check_messages(messages: Any, problems: list[str]) -> None:
    if not isinstance(messages, list) or not messages:
        problems.append("messages: at least one message is required")
        return
    previous: str | None = None
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, Mapping) else None
        if role not in ("user", "assistant"):
            problems.append(
                f"messages.{i}.role: Unexpected role {role!r}. The Messages API accepts a top-level "
                '`system` parameter, not "system" as an input message role.'
            )
            continue
        if previous is None and role != "user":
            problems.append(f'messages.{i}: the first message must use the "user" role')
        if role == previous:
            problems.append(f'messages.{i}: roles must alternate between "user" and "assistant"')
        previous = role
        content = message.get("content")
        if isinstance(content, str):
            if _blank(content):
                problems.append(f"messages.{i}: text content blocks must contain non-whitespace text")
        elif isinstance(content, list) and content:
            _check_blocks(f"messages.{i}", role, content, problems)
        else:
            problems.append(f"messages.{i}: all messages must have non-empty content")
    _check_tool_pairs(messages, problems)


def _breakpoints(body: Mapping[str, Any]) -> int:
    blocks: list[Any] = []
    for key in ("system", "tools"):
        if isinstance(body.get(key), list):
            blocks += body[key]
    for message in body.get("messages") or []:
        if isinstance(message, Mapping) and isinstance(message.get("content"), list):
            blocks += message["content"]
    return sum(1 for b in blocks if isinstance(b, Mapping) and b.get("cache_control") is not None)


def _check_thinking(body: Mapping[str, Any], problems: list[str]) -> None:
    """With thinking enabled: a budget of at least 1024 tokens under max_tokens, and a tool round's
    assistant message (the one whose tool_use the last user message answers) starting with its thinking
    block, signed (checked by _check_blocks), or a redacted_thinking block, as Anthropic requires."""
    thinking = body.get("thinking")
    if not isinstance(thinking, Mapping) or thinking.get("type") != "enabled":
        return
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or budget < 1024:
        problems.append("thinking.enabled.budget_tokens: Input should be greater than or equal to 1024")
    elif isinstance(body.get("max_tokens"), int) and body["max_tokens"] <= budget:
        problems.append("`max_tokens` must be greater than `thinking.budget_tokens`")
    messages = body.get("messages")
    if not isinstance(messages, list) or len(messages) < 2:
        return
    last, answered = messages[-1], messages[-2]
    if not (isinstance(last, Mapping) and isinstance(answered, Mapping)):
        return
    if not isinstance(last.get("content"), list) or not _ids(last["content"], "tool_result", "tool_use_id"):
        return
    blocks = answered.get("content")
    head = blocks[0] if isinstance(blocks, list) and blocks else None
    first = head.get("type") if isinstance(head, Mapping) else None
    if first not in ("thinking", "redacted_thinking"):
        problems.append(
            f"messages.{len(messages) - 2}.content.0.type: Expected `thinking` or `redacted_thinking`, but "
            f"found {first!r}. When `thinking` is enabled, a final `assistant` message must start with a "
            "thinking block (preceding the lastmost set of `tool_use` and `tool_result` blocks)."
        )


def validate_messages_request(body: Any) -> list[str]:
    """The problems Anthropic's Messages API would answer a 400 for: `max_tokens` required, no system
    role among the messages, roles alternating from a user message, non-blank text blocks, every
    tool_result answering a tool_use of the message before (and each tool_use answered in the next
    message), tools with an `input_schema`, at most four cache_control breakpoints, and with thinking on
    a tool round's signed thinking block first (_check_thinking)."""
    if not isinstance(body, Mapping):
        return ["the body is not a JSON object"]
    problems: list[str] = []
    if not isinstance(body.get("model"), str) or not body["model"]:
        problems.append("model: Field required")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        problems.append("max_tokens: Field required")
    system = body.get("system")
    if system is not None:
        texts = [system] if isinstance(system, str) else system if isinstance(system, list) else [None]
        for n, text in enumerate(texts):
            value = text if isinstance(text, str) else text.get("text") if isinstance(text, Mapping) else None
            if _blank(value):
                problems.append(f"system.{n}: text content blocks must contain non-whitespace text")
    for n, tool in enumerate(body.get("tools") or []):
        if (
            not isinstance(tool, Mapping)
            or not tool.get("name")
            or not isinstance(tool.get("input_schema"), Mapping)
        ):
            problems.append(f"tools.{n}: a tool needs a name and an input_schema")
    _check_messages(body.get("messages"), problems)
    _check_thinking(body, problems)
    if _breakpoints(body) > _MAX_BREAKPOINTS:
        problems.append(f"A maximum of {_MAX_BREAKPOINTS} blocks with cache_control may be provided.")
    return problems
