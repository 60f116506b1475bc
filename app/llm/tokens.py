"""A token estimate without a tokenizer: for a provider that reports no usage (the figures are marked
`estimated`). About four characters of English per token, as OpenAI's and Anthropic's tokenizers average,
plus the few tokens each message's framing costs; tool calls count by their name and arguments; an image or
a document (a `file` part) counts ATTACHMENT_TOKENS whatever its size in bytes: providers count an image by
its pixels and a document by its pages, neither of which a prompt's parts say.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD = 4  # role and separators, per message (OpenAI's own accounting says 3-4)
PROMPT_OVERHEAD = 3  # the reply's priming
# An image or document part: about what OpenAI (high detail) and Anthropic count an image of 1,000 pixels
# a side, or a page of a document.
ATTACHMENT_TOKENS = 1000


def text_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN) if text else 0


def prompt_tokens(messages: Iterable[dict[str, Any]]) -> int:
    total = PROMPT_OVERHEAD
    for message in messages:
        content = message.get("content")
        total += MESSAGE_OVERHEAD + text_tokens(content_text(content))
        if isinstance(content, list):
            total += sum(part_tokens(part) for part in content if isinstance(part, dict))
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            total += text_tokens(str(function.get("name") or "")) + text_tokens(
                str(function.get("arguments") or "")
            )
    return total


def part_tokens(part: dict[str, Any]) -> int:
    """A content part's tokens beside its text: an image's or a document's."""
    return ATTACHMENT_TOKENS if part.get("type") in ("image_url", "file") else 0


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: their text
        return "".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
    return ""
