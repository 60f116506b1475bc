"""AG-UI's wire contract as Parley takes it (docs/adapters.md): the official `ag-ui-protocol` package's
`RunAgentInput`, with the frontend tools Parley can offer a model stated in the schema (a provider's
function name, an object schema), and the frame schema of the SSE answer for the spec."""

from __future__ import annotations

from typing import Any

from ag_ui.core import (
    ActivityMessage,
    AssistantMessage,
    Context,
    DeveloperMessage,
    ReasoningMessage,
    RunAgentInput,
    SystemMessage,
    Tool,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.protocol.schemas import Delivery
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


MAX_CONTEXT_ENTRIES = 100
CONTEXT_HEADING = "The application the user is in tells you this for their message (not the user's words):"


class ParleyProps(BaseModel):
    """Parley's extras for a run, as `forwardedProps.parley` (CopilotKit's `properties`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="The session's model from this run on, as `PATCH /v1/sessions/{id}` sets it (a "
        "model `GET /v1/models` does not list: 422 `unknown_model`, and nothing is stored).",
    )
    delivery: Delivery | None = Field(
        None,
        description="What the run's user message does when a turn is running, as `delivery` of "
        "`POST /v1/sessions/{id}/messages` (default `steer`).",
    )


class ForwardedProps(BaseModel):
    """`forwardedProps`: the frontend framework's own properties, kept as they are, and Parley's under
    `parley`."""

    model_config = ConfigDict(extra="allow")

    parley: ParleyProps | None = Field(None, description="Parley's extras for this run.")


class RunInput(RunAgentInput):
    """AG-UI's RunAgentInput. `threadId` names the session (bound per caller on first use, as the AI
    SDK's chat id), the trailing user message is new input, trailing `tool` messages answer waiting
    frontend tool calls, and `resume` answers approval interrupts. `context` (CopilotKit's readables)
    reaches the model with the system prompt of the turn the run's user message starts, and is not
    stored; `state` is echoed as a `STATE_SNAPSHOT`; `forwardedProps.parley` carries Parley's extras
    (`model`, `delivery`), the rest of `forwardedProps` is ignored."""

    messages: list[AgUiMessage]  # type: ignore[assignment]
    # Narrower than the base's list[Tool]: the names and schemas a model can be offered.
    tools: list[FrontendTool] | None = Field(  # type: ignore[assignment]
        None, max_length=MAX_CLIENT_TOOLS, description="Frontend tools offered for this run."
    )
    context: list[Context] | None = Field(
        None,
        max_length=MAX_CONTEXT_ENTRIES,
        description="What the frontend tells the agent for this run (CopilotKit's `useCopilotReadable`): "
        "joined to the system prompt of the turn the run's user message starts, never stored. Its text "
        "counts against PARLEY_MAX_MESSAGE_CHARS (413).",
    )
    forwarded_props: ForwardedProps | None = Field(
        None,
        alias="forwardedProps",
        description="An object: the frontend framework's own properties, ignored, and Parley's extras "
        "under `parley` (422 for anything else there).",
    )

    @field_validator("tools")
    @classmethod
    def _unique(cls, tools: list[FrontendTool] | None) -> list[FrontendTool] | None:
        unique_client_tools(client_tools(tools))
        return tools

    def parley(self) -> ParleyProps:
        """Parley's extras of `forwardedProps`."""
        props = self.forwarded_props
        return props.parley if props is not None and props.parley is not None else ParleyProps()


def context_note(context: list[Context] | None) -> str | None:
    """The run's context as a note for the model's system prompt: one entry a line (a multi-line value
    indented under its description)."""
    if not context:
        return None
    lines = [CONTEXT_HEADING]
    for entry in context:
        value = entry.value.strip().replace("\n", "\n  ")
        lines.append(f"- {entry.description.strip() or 'context'}: {value}")
    return "\n".join(lines)


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
