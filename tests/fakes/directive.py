"""The `[bench ...]` directive: a request that names its own answer and carries a tag.

A client with a server between it and the fake (the benchmark's load, through the server under test)
cannot queue scripts per request; it writes `[bench tag=T chunks=N delay_ms=D]` in its message instead,
which the server forwards in the last user message. With no script queued the fake answers N words D ms
apart (`Script.words`) and records the request under tag T, which joins the client's view of a turn with
the fake's.
"""

from __future__ import annotations

import re
from typing import Any

_DIRECTIVE = re.compile(r"\[bench((?:\s+[a-z_]+=[^\s\]]+)*)\s*\]")


def bench_content(tag: str, chunks: int, delay_ms: float) -> str:
    """A user message whose directive tells the fake how to answer and names the request."""
    return f"[bench tag={tag} chunks={chunks} delay_ms={delay_ms:g}] Tell me a story."


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def directive(messages: Any) -> dict[str, str]:
    """The `[bench k=v ...]` settings of the last user message; empty when it has none."""
    if not isinstance(messages, list):
        return {}
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            found = _DIRECTIVE.findall(_text_of(message.get("content")))
            if not found:
                return {}
            pairs = (item.split("=", 1) for item in found[-1].split())
            return {key: value for key, value in pairs}
    return {}
