"""Anthropic-style validation of an OpenAI-format `messages` list, as a pure function.

Owns `validate_history`. OpenAI itself tolerates histories that Anthropic's Messages API rejects with a
400; a service that may be pointed at either must only produce histories both accept. The fake upstream
uses this in strict mode, and other tests can call it directly on the history they built.

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
