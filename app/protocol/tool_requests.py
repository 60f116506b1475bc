"""The wire contract of calls that wait outside the service: client tools (the browser runs them) and
human approval. Request bodies of POST .../tool_results and .../approvals, and GET .../pending."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from app.protocol.events import Decision

# What providers accept as a function name (OpenAI's rule, the strictest common one).
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_CLIENT_TOOLS = 64


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _empty_object() -> dict[str, JsonValue]:
    return {"type": "object", "properties": {}}


class ClientTool(_Strict):
    """A tool the client (a browser) runs itself: the model may call it, the service never runs it."""

    name: str = Field(
        description="1-64 letters, digits, '_' or '-'; not the name of a server tool; unique in its list.",
        json_schema_extra={"pattern": _NAME.pattern},
    )
    description: str = Field("", max_length=10_000)
    parameters: dict[str, JsonValue] = Field(
        default_factory=_empty_object,
        description="The arguments' JSON schema (an object schema, valid against JSON Schema 2020-12's "
        "metaschema; 422 otherwise), as the model sees it.",
        json_schema_extra={"properties": {"type": {"const": "object"}}},
    )

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError("use 1-64 letters, digits, '_' or '-'")
        return value

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        if value.get("type", "object") != "object":
            raise ValueError("the parameters must be a JSON schema of type object")
        return value


def unique_client_tools(tools: list[ClientTool] | None) -> list[ClientTool] | None:
    """A request's client tools: unique names, and each `parameters` a valid JSON Schema (checked against
    the 2020-12 metaschema), so a provider that validates schemas never fails every turn on one.
    Checked where a request sets them, not in `ClientTool` itself: a stored session's tools still load."""
    if tools is None:
        return None
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise ValueError("client tool names must be unique")
    from jsonschema import Draft202012Validator  # only when a request declares client tools
    from jsonschema.exceptions import SchemaError

    for n, tool in enumerate(tools):
        try:
            Draft202012Validator.check_schema(tool.parameters)
        except SchemaError as exc:
            at = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.absolute_path)
            raise ValueError(
                f"client_tools[{n}].parameters{at} is not a valid JSON Schema: {exc.message}"
            ) from None
    return tools


ApprovalRule = list[str] | dict[str, Literal["always", "never"]]


def approval_names(rule: ApprovalRule | None) -> list[str]:
    """The tool names a rule makes wait for approval: a list, or {name: "always" | "never"}."""
    if rule is None:
        return []
    if isinstance(rule, list):
        return list(dict.fromkeys(rule))
    return [name for name, when in rule.items() if when == "always"]


# "Exactly one of" as the spec states it (the validators below enforce the same; 422 otherwise).
_OUTPUT_OR_ERROR: dict[str, JsonValue] = {
    "oneOf": [
        {
            "required": ["output"],
            "properties": {"output": {"not": {"type": "null"}}, "error": {"type": "null"}},
        },
        {"required": ["error"], "properties": {"error": {"type": "string"}, "output": {"type": "null"}}},
    ]
}
_ARGUMENTS_WITH_EDIT: dict[str, JsonValue] = {
    "oneOf": [
        {
            "required": ["arguments"],
            "properties": {"decision": {"const": "edit"}, "arguments": {"type": "object"}},
        },
        {"properties": {"decision": {"enum": ["approve", "reject"]}, "arguments": {"type": "null"}}},
    ]
}


class ToolResultItem(_Strict):
    """Exactly one of `output` and `error` (null counts as absent)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_OUTPUT_OR_ERROR)

    tool_call_id: str = Field(min_length=1, max_length=200)
    output: JsonValue = Field(None, description="The result: text, or any JSON (sent to the model as JSON).")
    error: str | None = Field(None, max_length=100_000, description="An error the model reads instead.")

    @model_validator(mode="after")
    def _one_of(self) -> ToolResultItem:
        if (self.output is None) == (self.error is None):
            raise ValueError("give exactly one of output and error")
        return self


class ToolResultsIn(_Strict):
    results: list[ToolResultItem] = Field(min_length=1, max_length=MAX_CLIENT_TOOLS)


class DecisionItem(_Strict):
    """`arguments` with an `edit` decision, and only with it."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_ARGUMENTS_WITH_EDIT)

    tool_call_id: str = Field(min_length=1, max_length=200)
    decision: Decision
    arguments: dict[str, JsonValue] | None = Field(
        None, description="With edit only: the arguments to run the call with, checked against its schema."
    )
    reason: str | None = Field(None, max_length=10_000, description="Read by the model after a reject.")

    @model_validator(mode="after")
    def _arguments_with_edit(self) -> DecisionItem:
        if (self.decision == "edit") != (self.arguments is not None):
            raise ValueError("arguments are given with an edit decision, and only with it")
        return self


class ApprovalsIn(_Strict):
    decisions: list[DecisionItem] = Field(min_length=1, max_length=MAX_CLIENT_TOOLS)


class PendingRequest(BaseModel):
    tool_call_id: str
    kind: Literal["client_tool", "approval"]
    id: str = Field(description="The tool_group chat message id.")
    turn_id: str
    name: str
    arguments: Any
    requested_at: str
    expires_at: str
    decisions: list[Decision] | None = Field(description="For an approval: the decisions allowed.")


class PendingList(BaseModel):
    pending: list[PendingRequest] = Field(description="What waits for an answer, in call order.")


class Resolution(BaseModel):
    tool_call_id: str
    resolution: Literal["approve", "edit", "reject", "answered", "expired", "interrupted"]
    replayed: bool = Field(description="True when this answer had been given before (the repeat is ignored).")


class ResolutionResult(BaseModel):
    turn_id: str
    resolved: list[Resolution]
