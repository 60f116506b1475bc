"""Request and response bodies of the branch routes (docs/api.md, Branches): regenerate, edit, activate
and fork. The turn tree itself is in docs/protocol.md, Branches."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.protocol.files import MAX_ATTACHMENTS_SCHEMA, AttachmentRef
from app.protocol.ids import TURN_ID_PATTERN
from app.protocol.tool_requests import ClientTool, unique_client_tools

BranchDelivery = Literal["reject", "interrupt"]

_DELIVERY = (
    "What to do when a turn is running. reject (default): 409 `turn_in_progress` naming it; interrupt: "
    "stop it first (as POST .../cancel would), then do this."
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RegenerateRequest(_Strict):
    model: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="Answer with this model for the new turn only (one GET /v1/models lists; another: 422 "
        "`unknown_model`); the session's model by default.",
    )
    delivery: BranchDelivery = Field("reject", description=_DELIVERY)


class EditRequest(_Strict):
    """The edited user message: the fields of a message (POST .../messages)."""

    content: str = Field(
        min_length=1,
        json_schema_extra={"pattern": r"\S"},
        description="The edited message, with at least one character that is not whitespace; longer than "
        "PARLEY_MAX_MESSAGE_CHARS: 413.",
    )
    sender: str = Field("User", min_length=1, max_length=100)
    delivery: BranchDelivery = Field("reject", description=_DELIVERY)
    client_message_id: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        description="The sender's own id for the message, echoed on its user_message event and history.",
    )
    client_tools: list[ClientTool] | None = Field(
        None, max_length=64, description="Client tools offered for the new turn only."
    )
    attachments: list[AttachmentRef] | None = Field(
        None,
        max_length=MAX_ATTACHMENTS_SCHEMA,
        description="The edited message's files, as a posted message's (docs/files.md): `{file_id}` or "
        "`{url}` with a data URL. The original message's files are not carried over: name them again to keep "
        "them. More than PARLEY_FILES_MAX_ATTACHMENTS: 413; a file the session's model cannot take: 422 "
        "`unsupported_attachment`, before anything is stored.",
    )

    _unique = field_validator("client_tools")(unique_client_tools)

    @field_validator("content")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the message is empty")
        return value


class ActivateRequest(_Strict):
    delivery: BranchDelivery = Field("reject", description=_DELIVERY)


class ForkRequest(_Strict):
    turn_id: str = Field(
        pattern=TURN_ID_PATTERN,
        description="The new session's history is the active path up to and including this turn, which must "
        "have ended (409 while it runs); a turn the session does not hold: 404.",
    )


class BranchTurn(BaseModel):
    """A turn opened beside another (regenerate, edit): it runs now and heads the active path."""

    session_id: str
    turn_id: str = Field(
        description="The new turn: follow it on the event stream or GET .../turns/{turn_id}."
    )
    parent_turn_id: str | None = Field(description="The turn it follows (null for a first turn).")
    sibling_of: str = Field(description="The turn it was made beside.")
    user_message_ids: list[str] = Field(description="The user messages the new turn answers, in order.")


class ActivePath(BaseModel):
    session_id: str
    head_turn_id: str = Field(description="The active path's last turn.")
    path_turn_ids: list[str] = Field(description="The active path's turn ids, first turn first.")
