"""The fake OpenAI-compatible upstream, the one the tests and the benchmark (`bench/`) both use.

`upstream.py` the server, its control routes and command line; `script.py` what it answers;
`directive.py` requests that name their own answer (the benchmark's); `answer.py` an answer as bytes and
a schedule; `connection.py` writes it; `http11.py` HTTP/1.1 framing; `record.py` what it remembers of a
request; `strict.py` Anthropic-style history validation.

Names are re-exported lazily: importing `tests.fakes.upstream` here eagerly would make
`python -m tests.fakes.upstream` warn that the module was imported before being run as `__main__`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.fakes.record import RecordedRequest
    from tests.fakes.script import HttpError, Script, ToolCall, error_body
    from tests.fakes.strict import validate_history
    from tests.fakes.upstream import FakeUpstream

__all__ = [
    "FakeUpstream",
    "HttpError",
    "RecordedRequest",
    "Script",
    "ToolCall",
    "error_body",
    "validate_history",
]

_HOMES = {
    "FakeUpstream": "upstream",
    "RecordedRequest": "record",
    "HttpError": "script",
    "Script": "script",
    "ToolCall": "script",
    "error_body": "script",
    "validate_history": "strict",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
