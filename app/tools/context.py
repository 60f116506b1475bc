"""What every tool call shares, whoever runs the tool: who calls (`ToolContext`) and what comes back."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ToolContext", "ToolOutcome", "ToolRefused"]


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Who is calling: injected into tools that declare a parameter annotated `ToolContext`."""

    session_id: str
    turn_id: str
    tool_call_id: str


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """Result of one tool call, as the model will read it.

    `truncated`: the result was longer than its cap and was cut, with a marker the model reads.
    """

    content: str
    is_error: bool
    truncated: bool = False


class ToolRefused(ValueError):
    """A tool's refusal of its arguments (an expression it will not evaluate, an unknown time zone): the
    model reads the message; the log gets one line, since nothing went wrong in the service."""
