"""Tools the service does not hold as Python functions: MCP servers' tools and HTTP tools.

This module owns what the registry needs to know about them, whatever runs them:

* `ExternalTool`: a model-visible name, a description, a JSON schema, who runs it (`source`), the MCP
  server it belongs to (`group`), its time limit, whether it needs a person's approval, and `call`;
* `ToolProvider`: what the MCP manager and the HTTP tools hand the registry. Its tool list may change
  while the service runs (an MCP server connects, reconnects or announces `list_changed`), so the
  registry asks for it at every turn rather than copying it once;
* the cleaning of a name into what providers accept (`^[a-zA-Z0-9_-]{1,64}$`) and the cap on a result
  with a marker the model can read.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from app.tools.context import ToolContext, ToolOutcome

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator

__all__ = [
    "ExternalTool",
    "ToolProvider",
    "ToolSource",
    "cap_result",
    "clean_name",
    "run_external",
    "validate_arguments",
]

logger = logging.getLogger(__name__)

ToolSource = Literal["builtin", "mcp", "http", "client"]
ToolCall = Callable[[dict[str, Any], ToolContext], Awaitable[ToolOutcome]]

_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]+")
_MAX_NAME = 64


def clean_name(name: str) -> str:
    """`name` as providers accept it: unsafe characters become `_`; a long one keeps a hash of itself."""
    cleaned = _UNSAFE.sub("_", name).strip("_") or "tool"
    if len(cleaned) > _MAX_NAME:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        cleaned = cleaned[: _MAX_NAME - 9] + "_" + digest
    return cleaned


def cap_result(text: str, limit: int) -> tuple[str, bool]:
    """At most `limit` characters, the cut said in words the model reads; and whether it was cut."""
    if len(text) <= limit:
        return text, False
    marker = f"\n[truncated: the result had {len(text)} characters; only the first {limit} are shown]"
    return text[:limit] + marker, True


@dataclass(frozen=True)
class ExternalTool:
    name: str  # what the model sees
    description: str
    parameters: dict[str, Any]
    source: ToolSource
    call: ToolCall = field(repr=False, compare=False)
    timeout: float = 60.0
    requires_approval: bool = False
    group: str | None = None  # the MCP server's name
    remote_name: str = ""  # the server's own name for the tool
    _validator: Draft202012Validator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        from jsonschema import Draft202012Validator  # only once a tools file declares a tool

        object.__setattr__(self, "_validator", Draft202012Validator(self.parameters))

    def schema(self) -> dict[str, Any]:
        """The tool in OpenAI "tools" format."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def check(self, arguments: dict[str, Any]) -> str | None:
        """What is wrong with the arguments, worded for the model; None when they match the schema."""
        return validate_arguments(self._validator, self.name, arguments)


def validate_arguments(validator: Draft202012Validator, name: str, arguments: dict[str, Any]) -> str | None:
    errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))[:10]
    if not errors:
        return None
    lines = [f"- {'.'.join(map(str, err.absolute_path)) or '(arguments)'}: {err.message}" for err in errors]
    return f"Invalid arguments for tool '{name}':\n" + "\n".join(lines)


async def run_external(tool: ExternalTool, arguments: str, ctx: ToolContext) -> ToolOutcome:
    """One call: the arguments checked against the tool's schema, then run within its time limit.

    Every failure is an is_error outcome for the model; cancellation propagates into the call.
    """
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except (ValueError, RecursionError) as exc:
        return ToolOutcome(f"Arguments for tool '{tool.name}' are not valid JSON: {exc}", is_error=True)
    if not isinstance(parsed, dict):
        return ToolOutcome(f"Arguments for tool '{tool.name}' must be a JSON object", is_error=True)
    problem = tool.check(parsed)
    if problem is not None:
        return ToolOutcome(problem, is_error=True)
    deadline = asyncio.timeout(tool.timeout)
    try:
        async with deadline:
            return await tool.call(parsed, ctx)
    except TimeoutError as exc:
        if not deadline.expired():  # the tool's own timeout (its HTTP client's): a failure, not ours
            logger.warning("Tool %r failed (call %s)", tool.name, ctx.tool_call_id, exc_info=exc)
            return ToolOutcome(f"Tool '{tool.name}' failed: it timed out", is_error=True)
        logger.warning("Tool %r timed out after %s s (call %s)", tool.name, tool.timeout, ctx.tool_call_id)
        return ToolOutcome(f"Tool '{tool.name}' timed out after {float(tool.timeout)} s", is_error=True)
    except Exception as exc:
        logger.warning("Tool %r failed (call %s)", tool.name, ctx.tool_call_id, exc_info=exc)
        return ToolOutcome(f"Tool '{tool.name}' failed: {type(exc).__name__}", is_error=True)


class ToolProvider(Protocol):
    """A source of external tools: the MCP manager, the HTTP tools."""

    def tools(self) -> Sequence[ExternalTool]:
        """The tools available now (an MCP server that is down has none)."""
        ...

    def groups(self) -> Collection[str]:
        """Names a session may use for all of a group's tools (MCP servers' names)."""
        ...
