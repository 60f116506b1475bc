"""AG-UI's wire contract as Parley takes it (docs/adapters.md): the official `ag-ui-protocol` package's
`RunAgentInput`, with the frontend tools Parley can offer a model stated in the schema (a provider's
function name, an object schema), and the frame schema of the SSE answer for the spec."""

from __future__ import annotations

from typing import Any

from ag_ui.core import (
    ActivityMessage,
    AssistantMessage,
    DeveloperMessage,
    ReasoningMessage,
    RunAgentInput,
    SystemMessage,
    Tool,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from pydantic import Field, field_validator

from app.protocol.tool_requests import MAX_CLIENT_TOOLS, ClientTool, unique_client_tools

_NAME = r"^[A-Za-z0-9_-]{1,64}$"


class FrontendTool(Tool):
    """A tool the frontend runs: offered to the model for this run as a Parley client tool."""

    name: str = Field(
        pattern=_NAME,
        description="1-64 letters, digits, '_' or '-' (what providers take as a function name); not the "
        "name of a server tool of the session (400 `tool_name_clash`).",
    )
    parameters: dict[str, Any] | None = Field(
        None,
        description="The arguments' JSON schema: an object schema, valid against JSON Schema 2020-12 "
        "(422 otherwise). Absent: no arguments.",
        json_schema_extra={"properties": {"type": {"const": "object"}}},
    )


# The package's models, under names of their own in the spec: Parley's events already name a `ToolCall` and
# a `UserMessage` schema (app.protocol.events).
class AgUiToolCall(ToolCall):
    """A tool call of an assistant message (AG-UI's ToolCall)."""


class AgUiUserMessage(UserMessage):
    """A message from the person (AG-UI's UserMessage)."""


class AgUiAssistantMessage(AssistantMessage):
    """A message from the agent (AG-UI's AssistantMessage)."""

    tool_calls: list[AgUiToolCall] | None = Field(default=None)  # type: ignore[assignment]


# Not discriminated on `role`, as the package's own union is: its message models give `role` a default, so
# their schemas do not require it, and a discriminated union refuses a message without it. Each model's
# `role` is a literal, so a message that has one still matches its own model only.
AgUiMessage = (
    DeveloperMessage
    | SystemMessage
    | AgUiAssistantMessage
    | AgUiUserMessage
    | ToolMessage
    | ActivityMessage
    | ReasoningMessage
)


class RunInput(RunAgentInput):
    """AG-UI's RunAgentInput. `threadId` names the session (bound per caller on first use, as the AI
    SDK's chat id), the trailing user message is new input, trailing `tool` messages answer waiting
    frontend tool calls, and `resume` answers approval interrupts. `state`, `context` and
    `forwardedProps` are accepted and not used."""

    messages: list[AgUiMessage]  # type: ignore[assignment]
    # Narrower than the base's list[Tool]: the names and schemas a model can be offered.
    tools: list[FrontendTool] | None = Field(  # type: ignore[assignment]
        None, max_length=MAX_CLIENT_TOOLS, description="Frontend tools offered for this run."
    )

    @field_validator("tools")
    @classmethod
    def _unique(cls, tools: list[FrontendTool] | None) -> list[FrontendTool] | None:
        unique_client_tools(client_tools(tools))
        return tools


def client_tools(tools: list[FrontendTool] | None) -> list[ClientTool] | None:
    if not tools:
        return None
    return [
        ClientTool(
            name=t.name, description=t.description[:10_000], parameters=t.parameters or {"type": "object"}
        )
        for t in tools
    ]


FRAME_SCHEMA: dict[str, Any] = {
    "title": "AgUiEventFrame",
    "description": "One frame of the AG-UI event stream, as an SSE parser yields it: its `data` is one "
    "AG-UI event's JSON (an object with a `type` such as `RUN_STARTED`, `TEXT_MESSAGE_CONTENT`, "
    "`TOOL_CALL_START`, `RUN_FINISHED`; the `ag-ui-protocol` package's `Event`). `: ping` comments carry "
    "nothing.",
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string", "contentMediaType": "application/json"}},
}

STREAM_DOC = """The run as AG-UI events over SSE (`data: <event JSON>` per event): `RUN_STARTED`, then
`MESSAGES_SNAPSHOT` (Parley's history) when the run brings no new input, `STEP_STARTED`/`STEP_FINISHED`
per model call, `TEXT_MESSAGE_*`, `REASONING_*`, `TOOL_CALL_START`/`ARGS`/`END`, `TOOL_CALL_RESULT`,
`CUSTOM` (`parley.*`: agent status, usage, queue, the session), and `RUN_FINISHED` (an `interrupt` outcome
when an approval waits, answered by the next run's `resume`) or `RUN_ERROR`. Not Parley's event stream."""
