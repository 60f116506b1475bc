"""Tool registry: turns `async def` functions into LLM-callable tools and runs them safely.

This module owns the tool contract shared by the agent loop and the API layer:

* how a Python function becomes a tool (`Tool.from_function`): its argument schema comes from its type
  hints and defaults, its description from its docstring;
* the OpenAI "tools" schema sent to the model (`Tool.schema`, `ToolRegistry.schemas`);
* executing a model-issued tool call (`ToolRegistry.execute`), where every failure the model caused or
  can react to (unknown tool, bad arguments, a raising or slow tool) becomes an error `ToolOutcome` the
  model reads, instead of an exception that would abort the turn;
* the default registry (`build_default_registry`): the built-in tools of builtins.py, plain functions
  that know nothing of the registry.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import logging
import re
import typing
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from app.tools.builtins import BUILTINS

__all__ = ["Tool", "ToolContext", "ToolOutcome", "ToolRegistry", "UnknownToolError", "build_default_registry"]

logger = logging.getLogger(__name__)

ToolFunc = Callable[..., Awaitable[Any]]
F = TypeVar("F", bound=ToolFunc)

# OpenAI (and most providers behind LiteLLM) reject function names outside this pattern.
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Exception text is fed back to the model; a huge message would only waste its context.
_MAX_ERROR_CHARS = 500
# The model thinks in JSON terms: "got array", not "got list".
_JSON_TYPE_NAMES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Who is calling: injected into tools that declare a parameter annotated `ToolContext`."""

    session_id: str
    turn_id: str
    tool_call_id: str


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """Result of one tool call, as the model will read it."""

    content: str
    is_error: bool


class UnknownToolError(LookupError):
    """Raised when tool names are requested that the registry does not hold."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names: tuple[str, ...] = tuple(names)
        super().__init__("Unknown tool(s): " + ", ".join(repr(n) for n in self.names))


@dataclass(frozen=True)
class Tool:
    """A registered tool. Build it with `Tool.from_function` rather than by hand."""

    name: str
    description: str
    func: ToolFunc
    params_model: type[BaseModel]
    timeout: float | None = None
    # Name of the parameter that receives the `ToolContext`, if the function asks for one.
    context_param: str | None = None
    _schema: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Computed eagerly so a type pydantic cannot express in JSON schema fails at registration,
        # not in the middle of a user's turn.
        parameters = self.params_model.model_json_schema()
        parameters.pop("title", None)
        for prop in parameters.get("properties", {}).values():
            if isinstance(prop, dict):
                prop.pop("title", None)  # "Timezone" for `timezone`: noise in the model's prompt.
        schema = {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": parameters},
        }
        object.__setattr__(self, "_schema", schema)

    def schema(self) -> dict[str, Any]:
        """The tool in OpenAI "tools" format. Returns a copy: callers may mutate it freely."""
        return copy.deepcopy(self._schema)

    @classmethod
    def from_function(
        cls,
        func: ToolFunc,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
    ) -> Tool:
        """Build a tool from an `async def`; raises ValueError if the function cannot be one.

        Parameters become the argument schema (annotate with `Annotated[T, Field(description=...)]` to
        document one). A parameter annotated `ToolContext` is injected and hidden from the model.
        """
        if not inspect.iscoroutinefunction(func):
            raise ValueError(f"Tool function {func!r} must be an 'async def'")
        tool_name = name if name is not None else func.__name__
        if not _NAME_RE.fullmatch(tool_name):
            raise ValueError(f"Invalid tool name {tool_name!r}: use 1-64 letters, digits, '_' or '-'")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"Tool {tool_name!r}: timeout must be positive, got {timeout!r}")
        params_model, context_param = _build_params_model(tool_name, func)
        if description is None:
            description = _first_paragraph(inspect.getdoc(func))
        return cls(tool_name, description, func, params_model, timeout, context_param)


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    paragraph = doc.strip().split("\n\n", 1)[0]
    return " ".join(line.strip() for line in paragraph.splitlines())


def _build_params_model(tool_name: str, func: ToolFunc) -> tuple[type[BaseModel], str | None]:
    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except Exception as exc:  # NameError for unresolvable string annotations, TypeError for odd ones.
        raise ValueError(f"Tool {tool_name!r}: cannot resolve type hints: {exc}") from exc
    fields: dict[str, Any] = {}
    context_param: str | None = None
    for param in inspect.signature(func).parameters.values():
        where = f"Tool {tool_name!r}, parameter {param.name!r}"
        # Arguments are always passed by keyword, from a JSON object.
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise ValueError(f"{where}: *args, **kwargs and positional-only parameters are not supported")
        if param.name not in hints:
            raise ValueError(f"{where}: needs a type annotation")
        hint = hints[param.name]
        if hint is ToolContext:
            if context_param is not None:
                raise ValueError(f"{where}: only one parameter may be annotated ToolContext")
            context_param = param.name
            continue
        # pydantic refuses or warns about these names; failing here gives a clear message instead.
        if param.name.startswith("_") or param.name.startswith("model_") or hasattr(BaseModel, param.name):
            raise ValueError(f"{where}: name clashes with pydantic BaseModel internals, rename it")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (hint, default)
    model = create_model(f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    return model, context_param


def _error(message: str) -> ToolOutcome:
    return ToolOutcome(content=message, is_error=True)


def _truncate(text: str) -> str:
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 3] + "..."


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return str(value)


def _parse_arguments(tool: Tool, arguments: str) -> BaseModel | ToolOutcome:
    """Validate the model's raw argument string; an error outcome explains what to fix."""
    if not arguments.strip():
        raw: Any = {}  # Some models send "" for tools without parameters.
    else:
        try:
            raw = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError) as exc:
            return _error(f"Arguments for tool '{tool.name}' are not valid JSON: {exc}")
    if not isinstance(raw, dict):
        kind = "null" if raw is None else _JSON_TYPE_NAMES.get(type(raw), type(raw).__name__)
        return _error(f"Arguments for tool '{tool.name}' must be a JSON object, got {kind} instead")
    try:
        return tool.params_model.model_validate(raw)
    except ValidationError as exc:
        lines = [
            f"- {'.'.join(str(part) for part in err['loc']) or '(arguments)'}: {err['msg']}"
            for err in exc.errors()
        ]
        return _error(f"Invalid arguments for tool '{tool.name}':\n" + "\n".join(lines))


class ToolRegistry:
    """A set of tools, by name. Each app builds its own (see `build_default_registry`)."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    @overload
    def register(
        self,
        func: F,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
    ) -> F: ...

    @overload
    def register(
        self,
        func: None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
    ) -> Callable[[F], F]: ...

    def register(
        self,
        func: F | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
    ) -> F | Callable[[F], F]:
        """Register an `async def` as a tool: `@registry.register` or `@registry.register(name=...)`.

        Returns the function unchanged, so it stays directly callable. Raises ValueError for a
        non-async function, a duplicate or invalid name, or parameters that cannot form a schema.
        """

        def decorator(f: F) -> F:
            tool = Tool.from_function(f, name=name, description=description, timeout=timeout)
            if tool.name in self._tools:
                raise ValueError(f"A tool named {tool.name!r} is already registered")
            self._tools[tool.name] = tool
            return f

        return decorator if func is None else decorator(func)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def requires_approval(self, name: str) -> bool:
        """Whether the tool's own configuration makes every call wait for a person (`approval: always` in
        the tools file). Built-in tools never do; a session may still ask for approval of any tool."""
        return False

    def schemas(self, names: Sequence[str]) -> list[dict[str, Any]]:
        """Schemas of the named tools, in the given order (duplicates dropped: providers reject them).

        Raises UnknownToolError listing every name the registry does not hold.
        """
        unknown = [n for n in dict.fromkeys(names) if n not in self._tools]
        if unknown:
            raise UnknownToolError(unknown)
        return [self._tools[n].schema() for n in dict.fromkeys(names)]

    async def execute(
        self,
        name: str,
        arguments: str,
        ctx: ToolContext,
        *,
        default_timeout: float,
        allowed: Collection[str] | None = None,
    ) -> ToolOutcome:
        """Run one tool call issued by the model.

        Never raises for a tool problem: those become `is_error` outcomes worded for the model.
        `allowed` restricts the call to a session's tools; others are reported as unknown.
        Cancellation (`asyncio.CancelledError`) propagates into the tool and back out.
        """
        tool = self._tools.get(name)
        if tool is None or (allowed is not None and name not in allowed):
            visible = [n for n in self.names() if allowed is None or n in allowed]
            return _error(f"Unknown tool '{name}'. Available tools: {', '.join(visible) or '(none)'}")

        parsed = _parse_arguments(tool, arguments)
        if isinstance(parsed, ToolOutcome):
            return parsed
        kwargs = {field_name: getattr(parsed, field_name) for field_name in type(parsed).model_fields}
        if tool.context_param is not None:
            kwargs[tool.context_param] = ctx

        timeout = tool.timeout if tool.timeout is not None else default_timeout
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                result = await tool.func(**kwargs)
        except TimeoutError as exc:
            # A TimeoutError raised by the tool itself (e.g. its own HTTP timeout) is a failure,
            # not our deadline expiring.
            if not deadline.expired():
                return self._failure(tool, exc, ctx)
            logger.warning("Tool %r timed out after %s s (call %s)", name, timeout, ctx.tool_call_id)
            return _error(f"Tool '{name}' timed out after {float(timeout)} s")
        except Exception as exc:  # CancelledError is a BaseException: it propagates, as intended.
            return self._failure(tool, exc, ctx)

        if isinstance(result, str):
            return ToolOutcome(content=result, is_error=False)
        try:
            return ToolOutcome(json.dumps(result, ensure_ascii=False, default=_json_default), is_error=False)
        except (TypeError, ValueError) as exc:  # e.g. non-string dict keys, circular references
            logger.warning("Tool %r returned an unserializable result", name, exc_info=True)
            return _error(f"Tool '{name}' returned a result that cannot be serialized: {_truncate(str(exc))}")

    @staticmethod
    def _failure(tool: Tool, exc: Exception, ctx: ToolContext) -> ToolOutcome:
        logger.warning("Tool %r failed (call %s)", tool.name, ctx.tool_call_id, exc_info=exc)
        detail = type(exc).__name__
        if str(exc):
            detail += f": {exc}"
        return _error(f"Tool '{tool.name}' failed: {_truncate(detail)}")


def build_default_registry() -> ToolRegistry:
    """A new registry holding the built-in tools."""
    registry = ToolRegistry()
    for func in BUILTINS:
        registry.register(func)
    return registry
