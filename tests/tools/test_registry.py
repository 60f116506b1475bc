"""Tests for app.tools.registry: schema generation, registration rules and every execute() outcome."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Coroutine
from typing import Annotated, Any, TypeVar

import pytest
from pydantic import BaseModel, Field

from app.tools import ToolContext, ToolOutcome, ToolRegistry, UnknownToolError, build_default_registry
from tests.support.guarded_tools import guarded_registry

T = TypeVar("T")
CTX = ToolContext(session_id="s1", turn_id="t1", tool_call_id="call-1")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def execute(
    registry: ToolRegistry,
    name: str,
    arguments: str,
    *,
    default_timeout: float = 5.0,
    allowed: list[str] | None = None,
) -> ToolOutcome:
    return run(registry.execute(name, arguments, CTX, default_timeout=default_timeout, allowed=allowed))


def make_registry() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.register
    async def alpha() -> str:
        return "a"

    @registry.register(name="beta", timeout=3)
    async def _beta(n: int) -> int:
        return n * 2

    return registry


# --- schema -------------------------------------------------------------------------------------


def test_schema_has_types_defaults_required_and_hides_context() -> None:
    registry = ToolRegistry()

    @registry.register
    async def search(
        ctx: ToolContext,
        query: Annotated[str, Field(description="What to look for.")],
        limit: int = 10,
        *,
        exact: bool = False,
        tags: list[str] | None = None,
    ) -> str:
        """Search the notes.

        Longer explanation that is not part of the description.
        """
        return ""

    tool = registry.get("search")
    assert tool is not None
    assert tool.context_param == "ctx"
    assert tool.schema() == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the notes.",
            "parameters": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "query": {"type": "string", "description": "What to look for."},
                    "limit": {"type": "integer", "default": 10},
                    "exact": {"type": "boolean", "default": False},
                    "tags": {
                        "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                        "default": None,
                    },
                },
                "required": ["query"],
            },
        },
    }


def test_schema_of_tool_without_parameters() -> None:
    registry = make_registry()
    parameters = registry.schemas(["alpha"])[0]["function"]["parameters"]
    assert parameters == {"type": "object", "properties": {}, "additionalProperties": False}


def test_description_first_paragraph_joined_explicit_overrides_and_missing_is_empty() -> None:
    registry = ToolRegistry()

    @registry.register
    async def wrapped() -> str:
        """First line
        continues here.

        Second paragraph.
        """
        return ""

    @registry.register(description="Given text.")
    async def documented() -> str:
        """Docstring text."""
        return ""

    @registry.register
    async def bare() -> str:
        return ""

    descriptions = {
        s["function"]["name"]: s["function"]["description"] for s in registry.schemas(registry.names())
    }
    assert descriptions == {"wrapped": "First line continues here.", "documented": "Given text.", "bare": ""}


def test_schema_is_cached_and_returned_as_a_copy() -> None:
    tool = make_registry().get("beta")
    assert tool is not None
    first = tool.schema()
    first["function"]["name"] = "mutated"
    first["function"]["parameters"]["properties"].clear()
    assert tool.schema()["function"]["name"] == "beta"
    assert tool.schema()["function"]["parameters"]["properties"] == {"n": {"type": "integer"}}


# --- registration -------------------------------------------------------------------------------


def test_register_returns_function_unchanged_and_records_options() -> None:
    registry = ToolRegistry()

    async def double(n: int) -> int:
        return n * 2

    assert registry.register(double, name="twice", timeout=1.5) is double
    assert run(double(4)) == 8
    tool = registry.get("twice")
    assert tool is not None
    assert (tool.name, tool.func, tool.timeout) == ("twice", double, 1.5)
    assert registry.get("double") is None


async def _ok(n: int) -> int:
    return n


def _sync(n: int) -> int:
    return n


async def _varargs(*args: int) -> int:
    return 0


async def _varkw(**kwargs: int) -> int:
    return 0


async def _posonly(n: int, /) -> int:
    return n


async def _unannotated(n) -> int:  # type: ignore[no-untyped-def]
    return 0


async def _two_contexts(a: ToolContext, b: ToolContext) -> int:
    return 0


async def _shadows_basemodel(json: str) -> int:
    return 0


async def _protected_prefix(model_dump: str) -> int:
    return 0


@pytest.mark.parametrize(
    ("func", "options", "message"),
    [
        (_sync, {}, "must be an 'async def'"),
        (_ok, {"name": "has space"}, "Invalid tool name"),
        (_ok, {"name": ""}, "Invalid tool name"),
        (_ok, {"name": "x" * 65}, "Invalid tool name"),
        (_ok, {"timeout": 0}, "timeout must be positive"),
        (_ok, {"timeout": -1.0}, "timeout must be positive"),
        (_varargs, {}, r"\*args, \*\*kwargs and positional-only"),
        (_varkw, {}, r"\*args, \*\*kwargs and positional-only"),
        (_posonly, {}, r"\*args, \*\*kwargs and positional-only"),
        (_unannotated, {}, "needs a type annotation"),
        (_two_contexts, {}, "only one parameter may be annotated ToolContext"),
        (_shadows_basemodel, {}, "clashes with pydantic"),
        (_protected_prefix, {}, "clashes with pydantic"),
    ],
)
def test_register_rejects_unusable_functions(func: Any, options: dict[str, Any], message: str) -> None:
    registry = ToolRegistry()
    with pytest.raises(ValueError, match=message):
        registry.register(func, **options)
    assert registry.names() == []


def test_register_rejects_duplicate_names() -> None:
    registry = ToolRegistry()
    registry.register(_ok, name="same")
    with pytest.raises(ValueError, match="'same' is already registered"):
        registry.register(name="same")(_ok)


def test_names_are_sorted_and_get_unknown_is_none() -> None:
    registry = make_registry()
    assert registry.names() == ["alpha", "beta"]
    assert registry.get("gamma") is None


def test_schemas_keep_order_drop_duplicates_and_report_all_unknown_names() -> None:
    registry = make_registry()
    names = [s["function"]["name"] for s in registry.schemas(["beta", "alpha", "beta"])]
    assert names == ["beta", "alpha"]
    assert registry.schemas([]) == []
    with pytest.raises(UnknownToolError) as info:
        registry.schemas(["alpha", "nope", "gone", "nope"])
    assert info.value.names == ("nope", "gone")
    assert "'nope', 'gone'" in str(info.value)
    assert not isinstance(info.value, KeyError)


def test_build_default_registry_gives_independent_registries() -> None:
    first, second = build_default_registry(), build_default_registry()
    assert first.names() == ["calculate", "current_time"]
    first.register(_ok)
    assert second.names() == ["calculate", "current_time"]


# --- execute: success paths ---------------------------------------------------------------------


def test_execute_passes_validated_arguments_and_injects_context() -> None:
    registry = ToolRegistry()
    seen: list[tuple[ToolContext, int, str]] = []

    @registry.register
    async def record(count: int, context: ToolContext, label: str = "x") -> str:
        seen.append((context, count, label))
        return "done"

    # Lax validation: models often quote numbers.
    assert execute(registry, "record", '{"count": "3"}') == ToolOutcome("done", is_error=False)
    assert seen == [(CTX, 3, "x")]


def test_model_cannot_supply_the_context() -> None:
    registry = ToolRegistry()

    @registry.register
    async def whoami(ctx: ToolContext) -> str:
        return ctx.session_id

    outcome = execute(registry, "whoami", '{"ctx": {"session_id": "evil"}}')
    assert outcome.is_error
    assert "ctx: Extra inputs are not permitted" in outcome.content
    assert execute(registry, "whoami", "{}") == ToolOutcome("s1", is_error=False)


@pytest.mark.parametrize("arguments", ["", "  \n", "{}"])
def test_empty_arguments_count_as_an_empty_object(arguments: str) -> None:
    assert execute(make_registry(), "alpha", arguments) == ToolOutcome("a", is_error=False)


class _Point(BaseModel):
    x: int
    y: int


@pytest.mark.parametrize(
    ("result", "content"),
    [
        ("plain text, not JSON-quoted", "plain text, not JSON-quoted"),
        ({"city": "Zürich", "n": 1}, '{"city": "Zürich", "n": 1}'),
        ([1, 2.5, None], "[1, 2.5, null]"),
        (None, "null"),
        (42, "42"),
        ({"when": dt.date(2024, 2, 29)}, '{"when": "2024-02-29"}'),
        (_Point(x=1, y=2), '{"x": 1, "y": 2}'),
    ],
)
def test_non_string_results_are_json_encoded(result: object, content: str) -> None:
    registry = ToolRegistry()

    @registry.register
    async def give() -> object:
        return result

    assert execute(registry, "give", "") == ToolOutcome(content, is_error=False)


def test_unserializable_result_is_an_error() -> None:
    registry = ToolRegistry()

    @registry.register
    async def give() -> object:
        return {(1, 2): "tuple keys are not JSON"}

    outcome = execute(registry, "give", "")
    assert outcome.is_error
    assert outcome.content.startswith("Tool 'give' returned a result that cannot be serialized: ")


# --- execute: error outcomes --------------------------------------------------------------------


def test_unknown_tool_lists_available_tools() -> None:
    outcome = execute(make_registry(), "gamma", "{}")
    assert outcome == ToolOutcome("Unknown tool 'gamma'. Available tools: alpha, beta", is_error=True)


def test_tool_outside_allowed_is_unknown_and_only_allowed_tools_are_listed() -> None:
    registry = make_registry()
    outcome = execute(registry, "beta", '{"n": 1}', allowed=["alpha", "not-registered"])
    assert outcome == ToolOutcome("Unknown tool 'beta'. Available tools: alpha", is_error=True)
    outcome = execute(registry, "alpha", "{}", allowed=[])
    assert outcome == ToolOutcome("Unknown tool 'alpha'. Available tools: (none)", is_error=True)
    assert execute(registry, "beta", '{"n": 4}', allowed=["beta"]) == ToolOutcome("8", is_error=False)


@pytest.mark.parametrize("arguments", ["{", "not json", '{"n": 1,}', "{'n': 1}"])
def test_invalid_json_arguments(arguments: str) -> None:
    outcome = execute(make_registry(), "beta", arguments)
    assert outcome.is_error
    assert outcome.content.startswith("Arguments for tool 'beta' are not valid JSON: ")


@pytest.mark.parametrize(
    ("arguments", "kind"),
    [("[1, 2]", "array"), ('"n"', "string"), ("3", "number"), ("null", "null"), ("true", "boolean")],
)
def test_arguments_must_be_a_json_object(arguments: str, kind: str) -> None:
    outcome = execute(make_registry(), "beta", arguments)
    expected = f"Arguments for tool 'beta' must be a JSON object, got {kind} instead"
    assert outcome == ToolOutcome(expected, is_error=True)


def test_schema_mismatch_lists_each_field_error() -> None:
    registry = ToolRegistry()

    @registry.register
    async def book(room: str, nights: int, breakfast: bool = False) -> str:
        return "booked"

    outcome = execute(registry, "book", json.dumps({"nights": "many", "breakfast": "maybe", "pets": 2}))
    assert outcome.is_error
    lines = outcome.content.splitlines()
    assert lines[0] == "Invalid arguments for tool 'book':"
    assert sorted(lines[1:]) == [
        "- breakfast: Input should be a valid boolean, unable to interpret input",
        "- nights: Input should be a valid integer, unable to parse string as an integer",
        "- pets: Extra inputs are not permitted",
        "- room: Field required",
    ]


def _raising_registry(exc: Exception) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.register
    async def boom() -> str:
        raise exc

    return registry


def test_raising_tool_reports_exception_type_and_message() -> None:
    outcome = execute(_raising_registry(ValueError("bad things")), "boom", "")
    assert outcome == ToolOutcome("Tool 'boom' failed: ValueError: bad things", is_error=True)
    outcome = execute(_raising_registry(RuntimeError()), "boom", "")
    assert outcome == ToolOutcome("Tool 'boom' failed: RuntimeError", is_error=True)


def test_long_exception_messages_are_truncated() -> None:
    outcome = execute(_raising_registry(ValueError("x" * 5000)), "boom", "")
    assert outcome.is_error
    assert outcome.content.startswith("Tool 'boom' failed: ValueError: xxx")
    assert outcome.content.endswith("...")
    assert len(outcome.content) < 600


def test_timeout_error_raised_by_the_tool_itself_is_a_failure_not_a_timeout() -> None:
    outcome = execute(_raising_registry(TimeoutError("upstream API")), "boom", "", default_timeout=5)
    assert outcome == ToolOutcome("Tool 'boom' failed: TimeoutError: upstream API", is_error=True)


def _sleeping_registry(timeout: float | None) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.register(timeout=timeout)
    async def slow(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "finished"

    return registry


def test_tool_timeout_takes_precedence_over_default() -> None:
    outcome = execute(_sleeping_registry(0.05), "slow", '{"seconds": 5}', default_timeout=10)
    assert outcome == ToolOutcome("Tool 'slow' timed out after 0.05 s", is_error=True)


def test_default_timeout_applies_when_tool_has_none() -> None:
    registry = _sleeping_registry(None)
    outcome = execute(registry, "slow", '{"seconds": 5}', default_timeout=0.05)
    assert outcome == ToolOutcome("Tool 'slow' timed out after 0.05 s", is_error=True)
    assert execute(registry, "slow", '{"seconds": 0}', default_timeout=0.05) == ToolOutcome("finished", False)


def test_cancellation_propagates_into_the_tool_and_out_of_execute() -> None:
    registry = ToolRegistry()
    started = asyncio.Event()
    tool_saw_cancel: list[bool] = []

    @registry.register
    async def wait_forever() -> str:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            tool_saw_cancel.append(True)
            raise
        return "unreachable"

    async def scenario() -> None:
        task = asyncio.create_task(registry.execute("wait_forever", "", CTX, default_timeout=30))
        await asyncio.wait_for(started.wait(), timeout=1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()

    run(scenario())
    assert tool_saw_cancel == [True]


# --- approval: decided from the tool a call resolves to, held where it runs ---------------------

SELECTIONS = [["shop__slow"], ["shop"], ["shop/*"], ["calculate", "shop"]]


@pytest.mark.parametrize("selection", SELECTIONS)
def test_a_guarded_call_is_refused_unless_approved_whichever_way_it_was_selected(
    selection: list[str],
) -> None:
    registry, provider = guarded_registry()
    assert registry.requires_approval("shop__slow", allowed=selection)
    refused = execute(registry, "shop__slow", "{}", allowed=selection)
    assert refused.is_error and "needs a person's approval" in refused.content
    assert provider.ran == []
    approved = run(
        registry.execute("shop__slow", "{}", CTX, default_timeout=5, allowed=selection, approved=True)
    )
    assert approved == ToolOutcome("shop__slow ran", is_error=False)
    assert provider.ran == ["shop__slow"]


def test_a_tool_the_server_lists_later_and_an_http_tool_are_guarded_too() -> None:
    registry, provider = guarded_registry()
    assert not registry.requires_approval("shop__late", allowed=["shop"])  # no such tool yet: runs nothing
    provider.grow("late")
    assert registry.requires_approval("shop__late", allowed=["shop"])
    assert registry.requires_approval("order", allowed=["order"])
    for name, selection in [("shop__late", ["shop"]), ("order", ["order"])]:
        outcome = execute(registry, name, "{}", allowed=selection)
        assert outcome.is_error and "needs a person's approval" in outcome.content
    assert provider.ran == []


@pytest.mark.parametrize("rule", [["*"], ["shop"], ["shop/*"], ["shop__add"]])
def test_the_sessions_own_approval_names_match_the_resolved_tool(rule: list[str]) -> None:
    registry, provider = guarded_registry()
    assert not registry.requires_approval("shop__add", allowed=["shop"])
    assert registry.requires_approval("shop__add", allowed=["shop"], session_rule=rule)
    outcome = run(
        registry.execute("shop__add", "{}", CTX, default_timeout=5, allowed=["shop"], session_rule=rule)
    )
    assert outcome.is_error and provider.ran == []
    # A built-in only when the rule names it (or "*"); a tool outside the selection runs nothing.
    assert registry.requires_approval("calculate", session_rule=rule) == (rule == ["*"])
    assert not registry.requires_approval("shop__add", allowed=["calculate"], session_rule=rule)


def test_covers_what_a_sessions_approval_may_name() -> None:
    registry, _ = guarded_registry()
    for name in ("shop", "shop/*", "shop__add", "shop__not_listed_yet"):
        assert registry.covers(["shop"], name) and registry.covers(["shop/*"], name)
    assert registry.covers(["shop__add"], "shop__add")
    assert not registry.covers(["shop__add"], "shop") and not registry.covers(["shop__add"], "shop__slow")
    assert not registry.covers(["calculate"], "order") and registry.covers(["order"], "order")
