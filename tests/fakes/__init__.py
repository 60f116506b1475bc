"""Test doubles that speak real wire protocols; see `upstream.py` (fake OpenAI-compatible upstream).

Names are re-exported lazily: importing `tests.fakes.upstream` here eagerly would make
`python -m tests.fakes.upstream` warn that the module was imported before being run as `__main__`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.fakes.script import HttpError, Script, ToolCall, error_body
    from tests.fakes.strict import validate_history
    from tests.fakes.upstream import FakeUpstream, RecordedRequest

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
    "RecordedRequest": "upstream",
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
