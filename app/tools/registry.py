"""Tool registry: turns `async def` functions into LLM-callable tools and runs them safely.

This module owns the tool contract shared by the agent loop and the API layer:

* how a Python function becomes a tool (`Tool.from_function`): its argument schema comes from its type
  hints and defaults, its description from its docstring;
* the OpenAI "tools" schema sent to the model (`Tool.schema`, `ToolRegistry.schemas`);
* executing a model-issued tool call (`ToolRegistry.execute`), where every failure the model caused or
  can react to (unknown tool, bad arguments, a raising or slow tool) becomes an error `ToolOutcome` the
  model reads, instead of an exception that would abort the turn;
* the approval rule (`ToolRegistry.requires_approval`): decided from the tool a call resolves to (the
  tools file's rule for it, and the session's own approval names matched against it), never from how the
  session spelled its selection, and held where the call executes: `execute` runs no such call unless it
  is told a person approved it;
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
from app.tools.context import ToolContext, ToolOutcome, ToolRefused
from app.tools.external import ExternalTool, ToolProvider, ToolSource, run_external

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
        self._providers: list[ToolProvider] = []

    def add_provider(self, provider: ToolProvider) -> None:
        """Offer a provider's tools (MCP servers, HTTP tools) beside the built-in ones."""
        self._providers.append(provider)

    def _external(self) -> dict[str, ExternalTool]:
        found: dict[str, ExternalTool] = {}
        for provider in self._providers:
            for tool in provider.tools():
                # A built-in keeps its name; the first provider to offer a name keeps it.
                if tool.name not in self._tools:
                    found.setdefault(tool.name, tool)
        return found

    def _groups(self) -> set[str]:
        return {group for provider in self._providers for group in provider.groups()}

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
        """A built-in tool."""
        return self._tools.get(name)

    def lookup(self, name: str) -> Tool | ExternalTool | None:
        """Any tool available now: built-in, MCP or HTTP."""
        return self._tools.get(name) or self._external().get(name)

    def resolve(self, name: str, allowed: Collection[str] | None = None) -> Tool | ExternalTool | None:
        """The tool a call of `name` runs now, within a session's selection `allowed` (tool and server
        names, `server/*`; None: any tool): None for no tool, or one the selection does not hold."""
        if allowed is not None and name not in self.expand(list(allowed)):
            return None
        return self.lookup(name)

    def names(self) -> list[str]:
        """Every tool available now: the built-ins, then what the providers offer."""
        return sorted(self._tools) + sorted(self._external())

    def builtin_names(self) -> list[str]:
        """The built-in tools: what a session gets when it names none."""
        return sorted(self._tools)

    def source(self, name: str) -> str:
        """Where a tool comes from, for metrics and spans (a bounded label): `unknown` for no tool."""
        return self.source_of(name) if self.lookup(name) is not None else "unknown"

    def expand(self, names: Sequence[str]) -> list[str]:
        """The tools `names` stand for now, in order: a server's name (`github`, `github/*`) is its tools."""
        groups = self._groups()
        external = self._external()
        out: list[str] = []
        for name in names:
            group = name.removesuffix("/*")
            if group in groups and group not in self._tools:
                out.extend(t.name for t in external.values() if t.group == group)
            else:
                out.append(name)
        return list(dict.fromkeys(out))

    def covers(self, selection: Sequence[str], name: str) -> bool:
        """Whether `name` (a tool, a server, `server/*`) stands for tools the selection holds, now or once
        a selected server lists them: what a session's approval names may name."""
        if name in selection:
            return True
        groups = self._groups() - set(self._tools)
        selected = {s.removesuffix("/*") for s in selection} & groups
        if name.removesuffix("/*") in selected:
            return True
        return name in self.expand(list(selection)) or any(name.startswith(f"{g}__") for g in selected)

    def unknown(self, names: Sequence[str]) -> list[str]:
        """Names that are no tool, no server and no tool of a configured server (`server__...`)."""
        groups = self._groups()
        external = self._external()

        def known(name: str) -> bool:
            if name in self._tools or name in external or name.removesuffix("/*") in groups:
                return True
            return any(name.startswith(f"{group}__") for group in groups)

        return [name for name in dict.fromkeys(names) if not known(name)]

    def schemas(self, names: Sequence[str]) -> list[dict[str, Any]]:
        """Schemas of the named tools available now, in the given order (duplicates dropped).

        Raises UnknownToolError listing every name that is no tool and no server; the tools of a
        server that is down are left out.
        """
        unknown = self.unknown(names)
        if unknown:
            raise UnknownToolError(unknown)
        external = self._external()
        schemas: list[dict[str, Any]] = []
        for name in self.expand(names):
            tool = self._tools.get(name) or external.get(name)
            if tool is not None:
                schemas.append(tool.schema())
        return schemas

    def source_of(self, name: str) -> ToolSource:
        """Who runs the tool: `builtin` also for a call the service answers itself (an unknown tool)."""
        tool = self._external().get(name) if name not in self._tools else None
        return tool.source if tool is not None else "builtin"

    def requires_approval(
        self, name: str, *, allowed: Collection[str] | None = None, session_rule: Collection[str] = ()
    ) -> bool:
        """Whether a person approves a call of `name` before it runs, decided from the tool the call
        resolves to within the selection `allowed` (see `resolve`), however the session named it.

        The tools file's rule for that tool (`approval: always` on an HTTP tool, or on an MCP server, or
        its list of tool names and globs), or the session's own approval names (`session_rule`): "*", the
        tool's name, or its server's (`server`, `server/*`). A call that resolves to no tool runs nothing
        (its error result needs nobody's approval).
        """
        tool = self.resolve(name, allowed)
        return tool is not None and _needs_approval(tool, session_rule)

    async def execute(
        self,
        name: str,
        arguments: str,
        ctx: ToolContext,
        *,
        default_timeout: float,
        allowed: Collection[str] | None = None,
        session_rule: Collection[str] = (),
        approved: bool = False,
    ) -> ToolOutcome:
        """Run one tool call issued by the model.

        Never raises for a tool problem: those become `is_error` outcomes worded for the model.
        `allowed` restricts the call to a session's tools; others are reported as unknown.
        A call that needs approval (`requires_approval`, with `session_rule`) runs only when `approved`
        says a person approved it: whoever calls this, the rule holds here, where the tool runs.
        Cancellation (`asyncio.CancelledError`) propagates into the tool and back out.
        """
        tool = self.resolve(name, allowed)
        if tool is None:
            selected = None if allowed is None else set(self.expand(list(allowed)))
            visible = [n for n in self.names() if selected is None or n in selected]
            return _error(f"Unknown tool '{name}'. Available tools: {', '.join(visible) or '(none)'}")
        if not approved and _needs_approval(tool, session_rule):
            # The round decides the same way and waits first; a call that gets here unapproved came by a
            # path that did not ask (or its tool changed meanwhile): it is refused, never run.
            logger.warning("Tool %r needs approval and was not approved (call %s)", name, ctx.tool_call_id)
            return _error(f"Tool '{name}' needs a person's approval before it runs; it was not run.")
        if isinstance(tool, ExternalTool):
            return await run_external(tool, arguments, ctx)

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
        if isinstance(exc, ToolRefused):
            logger.info("Tool %r refused call %s: %s", tool.name, ctx.tool_call_id, _truncate(str(exc)))
            return _error(f"Tool '{tool.name}' refused the call: {_truncate(str(exc))}")
        logger.warning("Tool %r failed (call %s)", tool.name, ctx.tool_call_id, exc_info=exc)
        detail = type(exc).__name__
        if str(exc):
            detail += f": {exc}"
        return _error(f"Tool '{tool.name}' failed: {_truncate(detail)}")


def _needs_approval(tool: Tool | ExternalTool, session_rule: Collection[str]) -> bool:
    """The tools file's rule for the tool, or the session's approval names matched against it."""
    if isinstance(tool, ExternalTool) and tool.requires_approval:
        return True
    if "*" in session_rule or tool.name in session_rule:
        return True
    group = tool.group if isinstance(tool, ExternalTool) else None
    return group is not None and (group in session_rule or f"{group}/*" in session_rule)


def build_default_registry() -> ToolRegistry:
    """A new registry holding the built-in tools."""
    registry = ToolRegistry()
    for func in BUILTINS:
        registry.register(func)
    return registry
