"""A token estimate without a tokenizer: for a provider that reports no usage (the figures are marked
`estimated`). About four characters of English per token, as OpenAI's and Anthropic's tokenizers average,
plus the few tokens each message's framing costs; tool calls count by their name and arguments.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD = 4  # role and separators, per message (OpenAI's own accounting says 3-4)
PROMPT_OVERHEAD = 3  # the reply's priming


def text_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN) if text else 0


def prompt_tokens(messages: Iterable[dict[str, Any]]) -> int:
    total = PROMPT_OVERHEAD
    for message in messages:
        total += MESSAGE_OVERHEAD + text_tokens(content_text(message.get("content")))
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            total += text_tokens(str(function.get("name") or "")) + text_tokens(
                str(function.get("arguments") or "")
            )
    return total


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: their text
        return "".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
    return ""
