"""Database tables. Timestamps are stored as the ISO text clients get, so reads never reformat them."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, ForeignKey, Index, LargeBinary, String, text
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import configure_mappers
from sqlmodel import Field, SQLModel


class ChatSessionRow(SQLModel, table=True):
    __tablename__ = "chat_sessions"
    __table_args__ = (Index("ix_chat_sessions_principal_created", "principal", "created_at", "id"),)

    id: str = Field(primary_key=True, max_length=40)
    # The owner: the principal of the API key that created it ("" when the server runs without keys).
    principal: str = Field(default="", max_length=100, sa_column_kwargs={"server_default": text("''")})
    title: str | None = None
    model: str
    system_prompt: str | None = None
    tools: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    status: str = "active"
    created_at: str
    updated_at: str
    total_tokens: int = 0
    context_used: int = 0
    context_window: int | None = None
    # Tools the browser runs ({name, description, parameters} each): the model may call them, the
    # service never runs them (app.turns.pending).
    client_tools: list[dict[str, Any]] = Field(
        default_factory=list, sa_column=Column(JSON, nullable=False, server_default=text("'[]'"))
    )
    # Tool names that wait for a person's approval before they run ("*": every tool).
    approval: list[str] = Field(
        default_factory=list, sa_column=Column(JSON, nullable=False, server_default=text("'[]'"))
    )
    # The last event number taken (streaming.log.sequencing.CounterSequencer, multi-replica mode): the row
    # lock of its UPDATE serializes the logging transactions of every replica.
    last_seq: int = Field(default=0, sa_column_kwargs={"server_default": text("0")})
    # The active path's last turn (docs/protocol.md, Branches): the history, the turn view and the prompt
    # follow the path from it up its parents. NULL (no turn yet, or a row from before): the latest turn.
    head_turn_id: str | None = Field(default=None, max_length=40)
    # The context policy ({strategy, keep_turns, reserve_tokens}; NULL: the settings' defaults) and the
    # provider's count of a prompt over the estimate of it (docs/context.md; NULL: none reported yet).
    context: Any = Field(default=None, sa_column=Column(JSON, nullable=True))
    context_scale: float | None = None
    # The product's own labels of the session (`metadata` in the API: the name is SQLAlchemy's own), a
    # JSON object of strings, numbers and booleans; session_metadata holds the same for the list's filter.
    session_metadata: dict[str, Any] = Field(
        default_factory=dict, sa_column=Column(JSON, nullable=False, server_default=text("'{}'"))
    )


class SessionMetadataRow(SQLModel, table=True):
    """One top-level entry of a session's metadata, its value as the text a list filter compares
    (`GET /v1/sessions?metadata.<key>=<value>`): a string as is, a number or boolean as JSON writes it.
    Rows, not a JSON path, so that the filter is the same indexed comparison on SQLite and PostgreSQL."""

    __tablename__ = "session_metadata"
    __table_args__ = (Index("ix_session_metadata_key_value", "key", "value"),)

    session_id: str = Field(
        sa_column=Column(
            String, ForeignKey("chat_sessions.id", ondelete="CASCADE"), primary_key=True, nullable=False
        )
    )
    key: str = Field(primary_key=True, max_length=64)
    value: str


class ServiceSecretRow(SQLModel, table=True):
    """A secret the service made for itself and every replica shares (the stream tokens' key)."""

    __tablename__ = "service_secrets"

    name: str = Field(primary_key=True, max_length=50)
    value: str = Field(max_length=200)


class ChatMessageRow(SQLModel, table=True):
    """One entry of a session's chat_messages (docs/protocol.md); `position` orders the session's history."""

    __tablename__ = "chat_messages"
    __table_args__ = (
        Index("ix_chat_messages_session_position", "session_id", "position"),
        Index("ix_chat_messages_turn", "turn_id"),
    )

    position: int | None = Field(default=None, primary_key=True)
    id: str = Field(unique=True, max_length=20)
    session_id: str = Field(
        sa_column=Column(String, ForeignKey("chat_sessions.id", ondelete="CASCADE"), nullable=False)
    )
    turn_id: str
    type: str
    # A turn_start's parent: the turn it follows (NULL for a session's first turn; NULL on every other
    # row). A session's turns form a tree through it (docs/protocol.md, Branches).
    parent_turn_id: str | None = Field(default=None, max_length=40)
    role: str | None = None
    content: str | None = None
    sender: str | None = None
    # The sender's own id of a user message, echoed so the tab that sent it can match its optimistic copy.
    client_message_id: str | None = Field(default=None, max_length=100)
    model: str | None = None
    timestamp: str
    duration_ms: int | None = None
    # An assistant text's wait for its response's first token (duration_ms includes it).
    first_token_ms: int | None = None
    # The model response a text or tool_group belongs to: rebuilding the LLM history joins them by it.
    response_id: str | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    # Who ran the tool (builtin, mcp, http, client), and whether its result was cut to its cap.
    source: str | None = Field(default=None, max_length=20)
    truncated: bool | None = None
    arguments: Any = Field(default=None, sa_column=Column(JSON, nullable=True))
    result: str | None = None
    is_error: bool | None = None
    duration_seconds: float | None = None
    status: str | None = None
    interrupted: bool | None = None
    code: str | None = None
    # A tool_group's runner: "server" or "client" (the browser); the person's decision when the call
    # waited for approval (approve, edit, reject, expired, interrupted) and how long it waited, in ms,
    # kept apart from duration_ms, the execution.
    executed_by: str | None = Field(default=None, max_length=10)
    decision: str | None = Field(default=None, max_length=20)
    wait_ms: int | None = None
    # A user message's own client tools, offered to the model for the turn that takes it.
    client_tools: Any = Field(default=None, sa_column=Column(JSON, nullable=True))
    # A user message's files, as its events show them ({file_id, name, media_type, size, width?,
    # height?} each); the bytes stay in file_chunks, and message_files links them for their lifetime.
    attachments: Any = Field(default=None, sa_column=Column(JSON, nullable=True))
    # What the frontend told the model for the turn this user message starts (AG-UI's context), joined to
    # that turn's system prompt; never shown in the history.
    note: str | None = None


def new_message(**fields: Any) -> ChatMessageRow:
    """A message row to insert: what ChatMessageRow(**fields) makes, for a tenth of the cost. SQLModel's
    constructor sets each of the 28 columns through SQLAlchemy's attribute events (110 us a row,
    measured; a turn makes four or five, one of them on the path of its first token), and pydantic's
    model_construct, which a table model's constructor amounts to (it validates nothing either), still
    walks every field (17 us). Here the values are the defaults with `fields` over them, set as the
    instance's dict at once, and SQLAlchemy gives the instance the state its constructor would: the ORM
    takes it as any other."""
    defaults, columns, manager = _message_defaults()
    if not fields.keys() <= columns:
        raise TypeError(f"not columns of chat_messages: {sorted(fields.keys() - columns)}")
    row: ChatMessageRow = ChatMessageRow.__new__(ChatMessageRow)
    values = defaults.copy()
    values.update(fields)
    object.__setattr__(row, "__dict__", values)
    object.__setattr__(row, "__pydantic_fields_set__", set(fields))
    manager.setup_instance(row)
    return row


@lru_cache(maxsize=1)
def _message_defaults() -> tuple[dict[str, Any], frozenset[str], Any]:
    """The columns' defaults (a required column has none: missing, it is left out, as model_construct
    does, and the insert fails on NOT NULL), the columns' names, and the class's SQLAlchemy
    instrumentation, which exists once the mappers are configured (the ORM does that at its first
    query)."""
    configure_mappers()
    defaults = {}
    for name, field in ChatMessageRow.model_fields.items():
        if field.is_required():
            continue
        if field.default_factory is not None or not isinstance(field.default, str | int | float | None):
            raise TypeError(f"chat_messages.{name}: new_message shares defaults, so only immutable ones")
        defaults[name] = field.default
    return defaults, frozenset(ChatMessageRow.model_fields), sa_inspect(ChatMessageRow).class_manager


class QueuedMessageRow(SQLModel, table=True):
    """A user message acknowledged while a turn runs; it moves into chat_messages when a turn takes it."""

    __tablename__ = "queued_messages"
    __table_args__ = (Index("ix_queued_messages_session_position", "session_id", "position"),)

    position: int | None = Field(default=None, primary_key=True)
    id: str = Field(unique=True, max_length=20)
    session_id: str = Field(
        sa_column=Column(String, ForeignKey("chat_sessions.id", ondelete="CASCADE"), nullable=False)
    )
    content: str
    sender: str
    client_message_id: str | None = Field(default=None, max_length=100)
    timestamp: str
    # steer: taken at the running turn's next breakpoint; queue: after it ends; interrupt: it was stopped.
    delivery: str = Field(default="steer", sa_column_kwargs={"server_default": "steer"})
    client_tools: Any = Field(default=None, sa_column=Column(JSON, nullable=True))
    attachments: Any = Field(default=None, sa_column=Column(JSON, nullable=True))
    note: str | None = None


class EventRow(SQLModel, table=True):
    """The persisted event log: the exact JSON each client received, keyed by the session's sequence."""

    __tablename__ = "events"

    # No foreign key: the log is written behind, and a batch must never fail because its session was
    # deleted meanwhile; deleting a session deletes its events explicitly.
    session_id: str = Field(primary_key=True, max_length=40)
    seq: int = Field(primary_key=True)
    type: str
    data: str


class IdempotencyKeyRow(SQLModel, table=True):
    """A client's Idempotency-Key: the request it named, the resource id reserved for it, and the answer.

    The resource id is reserved before the work starts, so a retry after a crash in between finds the
    message (or session) by that id instead of creating a second one.
    """

    __tablename__ = "idempotency_keys"

    principal: str = Field(primary_key=True, max_length=100)
    key: str = Field(primary_key=True, max_length=255)
    fingerprint: str = Field(max_length=64)
    resource_id: str = Field(max_length=40)
    status_code: int | None = None
    response: str | None = None
    created_at: float = Field(index=True, description="Unix time; keys expire after the configured TTL.")


class PendingToolRequestRow(SQLModel, table=True):
    """A tool call that waits for someone outside the service: a client tool's result, or a person's
    approval. It outlives the process: after a restart the turn resumes from these rows."""

    __tablename__ = "pending_tool_requests"
    __table_args__ = (
        Index("ux_pending_turn_call", "turn_id", "tool_call_id", unique=True),
        Index("ix_pending_session_state", "session_id", "state"),
    )

    position: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(
        sa_column=Column(String, ForeignKey("chat_sessions.id", ondelete="CASCADE"), nullable=False)
    )
    turn_id: str = Field(max_length=40)
    tool_call_id: str = Field(max_length=200)
    # The tool_group chat message of the call.
    message_id: str = Field(max_length=20)
    # "client" (a client tool's result) or "approval" (a person's decision).
    kind: str = Field(max_length=10)
    tool_name: str
    arguments: Any = Field(default=None, sa_column=Column(JSON, nullable=True))
    requested_at: str
    expires_at: str
    # pending → answered (client result or decision taken) | expired | interrupted; an approved call
    # becomes "running" before it runs, so a crash never runs it twice.
    state: str = Field(default="pending", max_length=12)
    decision: str | None = Field(default=None, max_length=12)
    # The answer as given: {output | error} or {decision, arguments?, reason?}.
    answer: Any = Field(default=None, sa_column=Column(JSON, nullable=True))
    answered_at: str | None = None


class TurnLeaseRow(SQLModel, table=True):
    """Multi-replica mode: which replica runs a turn, until when, and with which fencing token.

    Inserted in the transaction that writes the turn's turn_start, released (state `done`) in the one that
    writes its turn_done. Every write of the turn checks, in its own transaction, that the token is still
    its owner's and the lease alive: a replica that lost it (paused, cut off, slow) writes nothing. A
    replica that takes over an expired lease gives it a new token. At most one running turn per session
    is the unique partial index, not a convention.
    """

    __tablename__ = "turn_leases"
    __table_args__ = (
        Index(
            "ux_turn_leases_running",
            "session_id",
            unique=True,
            sqlite_where=text("state = 'running'"),
            postgresql_where=text("state = 'running'"),
        ),
        Index("ix_turn_leases_state_expires", "state", "expires_at"),
    )

    turn_id: str = Field(primary_key=True, max_length=40)
    session_id: str = Field(
        sa_column=Column(String, ForeignKey("chat_sessions.id", ondelete="CASCADE"), nullable=False)
    )
    owner: str = Field(max_length=100)
    token: int = Field(sa_column=Column(BigInteger, nullable=False))
    # Unix seconds on the database's clock (replicas' clocks may differ; the database has one).
    expires_at: float
    state: str = Field(default="running", max_length=10)
    # A cancel posted on another replica: the owner reads it at its next heartbeat.
    cancel_requested: bool = Field(default=False, sa_column_kwargs={"server_default": text("false")})


class ContextSummaryRow(SQLModel, table=True):
    """A running summary of a session's oldest turns (docs/context.md), keyed by the last turn it covers:
    a path through the history applies the summary of its own last summarised turn. Written whole, once,
    by the turn that asked for it, and never changed: a longer one is a new row."""

    __tablename__ = "context_summaries"
    __table_args__ = (Index("ix_context_summaries_session_through", "session_id", "through_turn_id"),)

    position: int | None = Field(default=None, primary_key=True)
    id: str = Field(unique=True, max_length=40)
    session_id: str = Field(
        sa_column=Column(String, ForeignKey("chat_sessions.id", ondelete="CASCADE"), nullable=False)
    )
    through_turn_id: str = Field(max_length=40)
    # Every turn it covers, oldest first (through_turn_id last).
    turn_ids: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    # The summary it extends, if any.
    previous_id: str | None = Field(default=None, max_length=40)
    content: str
    # The turn whose model call it was written for, and the model that wrote it.
    turn_id: str = Field(max_length=40)
    model: str
    created_at: str


class ContextViewRow(SQLModel, table=True):
    """What one model call of a turn sent instead of the whole history: with the history and the summary,
    the prompt is rebuilt exactly (docs/context.md). A call sending the whole history has none."""

    __tablename__ = "context_views"
    __table_args__ = (Index("ix_context_views_turn", "turn_id"),)

    position: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(
        sa_column=Column(String, ForeignKey("chat_sessions.id", ondelete="CASCADE"), nullable=False)
    )
    turn_id: str = Field(max_length=40)
    summary_id: str | None = Field(default=None, max_length=40)
    summarized_turn_ids: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    elided_tool_call_ids: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    # The attached files it sent as a placeholder (their ids).
    elided_file_ids: list[str] = Field(
        default_factory=list, sa_column=Column(JSON, nullable=False, server_default=text("'[]'"))
    )
    tokens_before: int
    tokens_after: int
    created_at: str


class FileRow(SQLModel, table=True):
    """An uploaded file of one principal (docs/files.md); its bytes are the blob of its sha256. The same
    bytes uploaded again by the same principal are this row (the unique index), not a second one."""

    __tablename__ = "files"
    __table_args__ = (
        Index("ux_files_principal_sha256", "principal", "sha256", unique=True),
        Index("ix_files_principal_created", "principal", "created_at", "id"),
        Index("ix_files_sha256", "sha256"),
    )

    id: str = Field(primary_key=True, max_length=40)
    principal: str = Field(max_length=100)
    name: str = Field(max_length=255)
    media_type: str = Field(max_length=100)
    size: int = Field(sa_column=Column(BigInteger, nullable=False))
    sha256: str = Field(max_length=64)
    created_at: str
    width: int | None = None
    height: int | None = None


class FileChunkRow(SQLModel, table=True):
    """Content-addressed blobs, in parts: a file is written and served a part at a time, never loaded whole.
    Shared by every file row with the same sha256 (of any principal); deleted with the last of them."""

    __tablename__ = "file_chunks"

    sha256: str = Field(primary_key=True, max_length=64)
    part: int = Field(primary_key=True)
    data: bytes = Field(sa_column=Column(LargeBinary, nullable=False))


class MessageFileRow(SQLModel, table=True):
    """A message (waiting or in the history) that uses a file: while one does, the file cannot be deleted;
    the links go with their session, and a deleted session's files with them unless another links them."""

    __tablename__ = "message_files"
    __table_args__ = (
        Index("ix_message_files_file", "file_id"),
        Index("ix_message_files_session", "session_id"),
    )

    message_id: str = Field(primary_key=True, max_length=20)
    file_id: str = Field(sa_column=Column(String(40), ForeignKey("files.id"), primary_key=True))
    session_id: str = Field(
        sa_column=Column(String, ForeignKey("chat_sessions.id", ondelete="CASCADE"), nullable=False)
    )


class ChatBindingRow(SQLModel, table=True):
    """A frontend kit's own chat id (the AI SDK's chat `id`, AG-UI's `threadId`), per principal and kit,
    bound to the session it names (app.chat.kit_chats). `chat_key` is the id's SHA-256 in hex, so any id a
    kit makes fits the key; the first request with a new id inserts the binding, and a racing one keeps
    the row that won (INSERT ... ON CONFLICT DO NOTHING)."""

    __tablename__ = "chat_bindings"
    __table_args__ = (Index("ix_chat_bindings_session", "session_id"),)

    principal: str = Field(primary_key=True, max_length=100)
    # "ai-sdk" or "ag-ui".
    kit: str = Field(primary_key=True, max_length=10)
    chat_key: str = Field(primary_key=True, max_length=64)
    session_id: str = Field(
        sa_column=Column(String, ForeignKey("chat_sessions.id", ondelete="CASCADE"), nullable=False)
    )
    created_at: str
