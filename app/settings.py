"""Service configuration: every knob is an environment variable with the PARLEY_ prefix."""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEMO_MODEL = "parley/demo"
# The media types a file may have unless PARLEY_FILES_ALLOWED_TYPES says otherwise (docs/files.md).
FILE_TYPES = (
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
    "application/pdf",
    "text/plain",
    "text/markdown",
    "text/csv",
    "application/json",
)
# With several replicas, PostgreSQL ends a transaction left idle this long (ms), unless the lease asks
# for less.
IDLE_IN_TRANSACTION_TIMEOUT_MS = 5_000


class Settings(BaseSettings):
    # A .env file in the working directory is read too (the environment wins over it); `python -m app`
    # also loads it into the environment, for the provider keys and OTEL_* variables it holds.
    model_config = SettingsConfigDict(env_prefix="PARLEY_", extra="ignore", env_file=".env")

    database_url: str = Field(
        "sqlite+aiosqlite:///./data/parley.db",
        description="sqlite+aiosqlite:///<file> (the default) or postgresql+psycopg://user@host/db.",
    )
    database_busy_timeout_ms: int = Field(
        10_000,
        ge=1,
        description="Milliseconds a write waits for SQLite's write lock before it gives up: the request "
        "then gets 503 storage_busy.",
    )
    # PostgreSQL only: the connection pool, statement timeout and PgBouncer mode.
    database_pool_size: int = Field(10, ge=1, description="Connections the PostgreSQL pool keeps open.")
    database_max_overflow: int = Field(
        10, ge=0, description="Connections the PostgreSQL pool may open beyond its size under load."
    )
    database_pool_timeout: float = Field(
        10.0, gt=0, description="Seconds a request waits for a free connection; then 503 storage_unavailable."
    )
    database_statement_timeout_ms: int = Field(
        30_000, ge=0, description="PostgreSQL's statement_timeout for every connection (0: none)."
    )
    database_idle_in_transaction_timeout_ms: int | None = Field(
        None,
        ge=0,
        description="PostgreSQL's idle_in_transaction_session_timeout for every connection: a transaction "
        "left idle this long (its process paused, frozen or cut off) is ended by the server, with its locks "
        "(0: never). Unset: with several replicas 5000, or less so that it ends before PARLEY_LEASE_SECONDS "
        "minus the heartbeat (a paused replica's locks are gone before its leases expire); else 0.",
    )
    database_pgbouncer: bool = Field(
        False,
        description="PostgreSQL behind PgBouncer in transaction mode: no server-side prepared statements.",
    )
    migrate: bool = Field(
        True,
        description="`python -m app` migrates the database to the latest schema before it serves (replicas "
        "on PostgreSQL take turns). `0`: it only checks, and stops with one line when a migration is due.",
    )
    default_model: str = DEMO_MODEL
    models_file: Path | None = None
    tools_file: Path | None = Field(
        None, description="YAML or JSON file of MCP servers and HTTP tools (docs/tools.md)."
    )
    mcp_retry_max: float = Field(
        30.0, gt=0, description="Longest wait in seconds between reconnects to an MCP server that is down."
    )
    mcp_connect_timeout: float = Field(
        10.0,
        gt=0,
        description="Seconds an MCP server has to finish the handshake and list its tools; then it is "
        "`error` in GET /v1/tools (a stdio server's process group is ended) and retried later.",
    )

    demo_token_delay: float = Field(0.02, ge=0, description="Seconds the demo model waits before each token.")
    max_tool_rounds: int = Field(25, ge=1, description="Model calls allowed in one turn before it fails.")
    tool_timeout: float = Field(
        30.0, gt=0, description="Seconds a tool may run before it gives an error result."
    )
    approval_timeout: float = Field(
        900.0, gt=0, description="Seconds a tool call waits for a person's approval; then it is rejected."
    )
    client_tool_timeout: float = Field(
        900.0, gt=0, description="Seconds a client tool's call waits for the client's result."
    )
    provider_timeout: float = Field(120.0, gt=0, description="Seconds without a byte from the provider.")
    provider_retries: int = Field(
        2, ge=0, description="Retries of a model call that failed before any output."
    )
    provider_retry_backoff: float = Field(0.5, ge=0, description="First retry delay in seconds; doubles.")
    provider_retry_max_wait: float = Field(
        10.0,
        ge=0,
        description="Longest Retry-After of a rate limited or unavailable provider that a retry waits out; "
        "a longer one fails the turn at once with `retry_after` in its error event (0: never wait).",
    )
    context_strategy: Literal["auto", "off"] = Field(
        "auto",
        description="The default context policy of new sessions (docs/context.md): `auto` compacts what a "
        "turn sends when the history outgrows the model's window; `off` sends it whole (a turn that does not "
        "fit fails with `context_window_exceeded`).",
    )
    context_keep_turns: int = Field(
        4, ge=1, le=100, description="The default number of last turns always sent verbatim."
    )
    context_reserve_tokens: int = Field(
        1024,
        ge=0,
        le=1_000_000,
        description="The default room, in tokens, kept free in the window for the model's answer.",
    )
    context_summary_model: str | None = Field(
        None,
        description="The model that writes the summaries of compacted turns; unset: the session's model.",
    )
    stream_adapter: Literal["auto", "litellm"] = Field(
        "auto",
        description="How model streams are read: `auto` (the lean reader for OpenAI-compatible providers, "
        "the demo in-process, LiteLLM for the rest) or `litellm` (LiteLLM's stream for every model).",
    )
    flush_interval: float = Field(1.0, gt=0, le=1.0, description="Max seconds streamed text stays unflushed.")
    sse_ping_interval: float = Field(15.0, gt=0, description="Seconds between SSE heartbeat comments.")
    sse_retry_ms: int = Field(
        2000, ge=0, description="The `retry:` hint: milliseconds a client waits before it reconnects."
    )
    event_retention: int = Field(
        10_000, ge=1, description="Events kept per session for resuming; older positions get a resync."
    )
    stream_channel_seconds: float = Field(
        60.0,
        ge=0,
        description="Seconds a session's stream channel (its recent events, for quick resumes) is kept "
        "after its last stream left; then resumes read the event log.",
    )
    idle_session_seconds: float = Field(
        300.0,
        ge=0,
        description="Seconds a session's runtime state is kept once it is idle (no turn, nothing waiting).",
    )
    event_flush_interval: float = Field(
        0.1,
        gt=0,
        le=1.0,
        description="Least seconds between the event-log commits that text deltas alone cause (a "
        "response's first text and lone events commit at once): events reach clients once logged.",
    )
    shutdown_timeout: float = Field(
        5.0, gt=0, description="Seconds turns get at SIGTERM to commit their state before the streams close."
    )
    wait_timeout: float = Field(
        300.0,
        gt=0,
        description="Longest `?wait=true` wait, in seconds (a request's `timeout` is capped by it): then 504 "
        "with the turn id, and the turn goes on. Keep it below any proxy's idle timeout.",
    )
    # --- replicas ----------------------------------------------------------------------------------------
    redis_prefix: str = Field(
        "parley",
        description="With PARLEY_REDIS_URL: the prefix of every Redis key and channel the replicas share "
        "(replicas of one deployment must use the same one).",
    )
    subscriber_queue_size: int = Field(10_000, ge=16, description="Events buffered per slow SSE client.")
    page_size_max: int = Field(1000, ge=1)
    idempotency_ttl_hours: float = Field(24.0, gt=0, description="Hours an Idempotency-Key is remembered.")
    max_message_chars: int = Field(
        100_000, ge=1, description="Longest accepted message; longer ones get 413."
    )
    max_body_bytes: int = Field(
        1_000_000, ge=1024, description="Largest accepted request body; larger get 413."
    )
    max_header_bytes: int = Field(
        32_768, ge=1024, description="Largest accepted request headers (names and values); larger get 431."
    )

    # --- files (docs/files.md) ---------------------------------------------------------------------------
    files_max_bytes: int = Field(
        20_000_000, ge=1, description="Largest accepted file (POST /v1/files, or a data URL); larger get 413."
    )
    files_allowed_types: str = Field(
        ",".join(FILE_TYPES),
        description="Media types a file may have (comma-separated), as its bytes show them; others get 415.",
    )
    files_max_attachments: int = Field(
        10, ge=0, le=20, description="Attachments one message may carry (at most 20); more get 413."
    )
    files_url: str | None = Field(
        None,
        pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$",
        description="s3://bucket/prefix: files' bytes in that S3-compatible object store, with the AWS "
        "variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL). Unset: in the "
        "database.",
    )
    files_pdf_text: bool = Field(
        False,
        description="A PDF attached for a model that does not read documents is sent as its text (extracted "
        "with pypdf, at most max_message_chars characters) instead of being refused with 422.",
    )
    files_chunk_bytes: int = Field(
        262_144,
        ge=4096,
        description="Bytes of a file stored per database row, and sent per write when served.",
    )

    # --- several replicas --------------------------------------------------------------------------------
    redis_url: str | None = Field(
        None,
        description="redis://host:port/db: turns on multi-replica mode (several processes on one PostgreSQL "
        "database). Unset: one process owns every session, as on SQLite.",
    )
    lease_seconds: float = Field(
        30.0,
        gt=0,
        description="Multi-replica mode: seconds a replica's claim on a running turn lasts without renewal; "
        "a turn whose owner stopped renewing is closed by another replica after it, and its event streams "
        "stop counting against their principal's limit.",
    )
    heartbeat_interval: float | None = Field(
        None,
        gt=0,
        description="Multi-replica mode: seconds between lease renewals (and cancel-flag checks); a third "
        "of PARLEY_LEASE_SECONDS when unset.",
    )

    # --- access ------------------------------------------------------------------------------------------
    api_keys: str = Field(
        "",
        repr=False,
        description="Comma-separated `principal:key` pairs; each bearer key acts as its principal.",
    )
    api_keys_file: Path | None = Field(
        None, description='A JSON file of keys: {"principal": "key"} or {"principal": ["key", ...]}.'
    )
    allow_open: bool = Field(
        False, description="Serve without keys on a non-loopback address (everyone is one anonymous caller)."
    )
    # --- bearer tokens (docs/auth.md) ---------------------------------------------------------------------
    jwt_secret: str = Field(
        "",
        repr=False,
        description="The shared secret of HS256/HS384/HS512 bearer tokens (at least 32 bytes); with it, JWTs "
        "are accepted beside the API keys.",
    )
    jwt_jwks_url: str | None = Field(
        None,
        description="The identity provider's JWKS URL: RS256/ES256/EdDSA bearer tokens are checked against "
        "its keys (fetched with a timeout, cached, fetched again for a key id it does not hold).",
    )
    jwt_audience: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="The `aud` a token must name (comma-separated: any of them); none: a token that names "
        "an audience is refused.",
    )
    jwt_issuer: str | None = Field(None, description="The `iss` a token must carry; none: not checked.")
    jwt_algorithms: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="The algorithms accepted (comma-separated), never the token's choice: HS* need "
        "PARLEY_JWT_SECRET, the others PARLEY_JWT_JWKS_URL. Unset: HS256 with a secret, RS256, ES256 "
        "and EdDSA with a JWKS URL.",
    )
    jwt_tenant_claim: str | None = Field(
        None,
        description="A claim naming the user's tenant (e.g. `org_id`): the principal is then tenant and "
        "`sub`, and a token without the claim is refused.",
    )
    jwt_leeway_seconds: float = Field(
        30.0, ge=0, le=300, description="Clock skew allowed on `exp`, `nbf` and `iat`, in seconds."
    )
    jwt_jwks_timeout: float = Field(5.0, gt=0, description="Seconds a JWKS fetch may take.")
    jwt_jwks_refresh_seconds: float = Field(
        30.0,
        ge=0,
        description="Least seconds between two JWKS fetches that a token with an unknown key id causes.",
    )
    jwt_jwks_cache_seconds: float = Field(
        3600.0, gt=0, description="Seconds fetched JWKS keys are used before they are fetched again."
    )
    stream_token_secret: str = Field(
        "",
        repr=False,
        description="The secret stream tokens are signed with (every replica must have the same one). "
        "Unset: a random secret kept in the database, which every replica shares.",
    )
    title_model: str | None = Field(
        None,
        min_length=1,
        description="A model that writes a session's title from its first message, replacing the first line "
        "it was given at once (unless a title was set meanwhile); unset: the first line stays.",
    )
    stream_token_seconds: float = Field(
        300.0, gt=0, le=86_400, description="Seconds a stream token opens its session's event stream."
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Origins allowed to call the API from a browser (comma-separated or a JSON list); "
        "none by default, which sends no CORS headers.",
    )
    max_streams_per_principal: int = Field(
        20, ge=0, description="Event streams one principal may hold open at once (0: no limit)."
    )
    messages_per_minute: int = Field(
        60, ge=0, description="Messages a principal may post a minute, in bursts of as many (0: no limit)."
    )
    ui: bool = Field(
        True,
        description="Serve the reference chat page at /ui (static files that call the API with the key "
        "its user enters; 0 turns it off).",
    )

    # --- operations --------------------------------------------------------------------------------------
    missing_key: Literal["warn", "error"] = Field(
        "warn",
        description="What the launcher does when a models file entry's api_key_env variable is unset: "
        "`warn` (a warning line; its calls go without a configured key) or `error` (refuse to start).",
    )
    log_format: Literal["human", "json"] = Field(
        "human",
        description="`human`: uvicorn's lines; `json`: one JSON object per line with request, session, "
        "turn and trace ids (`python -m app`).",
    )
    metrics: bool = Field(False, description="Serve GET /metrics in the Prometheus text format.")
    metrics_token: str = Field(
        "",
        repr=False,
        description="When set, /metrics needs `Authorization: Bearer <token>` (outside the API keys).",
    )
    trace_content: bool = Field(
        False,
        description="Put prompts and completions into the model call spans (off: only sizes and names).",
    )

    # --- benchmarking ------------------------------------------------------------------------------------
    debug_stats: bool = Field(
        False,
        description="Serve GET /debug/stats (event-loop lag, commits per 100 ms; not in the OpenAPI) for "
        "the benchmark (bench/).",
    )
    debug_stall_ms: float = Field(
        0,
        ge=0,
        description="With debug_stats: when the event loop has not ticked for this many milliseconds, a "
        "sampler thread notes where it is (0: off; it takes the GIL every half of it).",
    )

    @field_validator("cors_origins", "jwt_audience", "jwt_algorithms", mode="before")
    @classmethod
    def _split_origins(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [origin.strip() for origin in text.split(",") if origin.strip()]
        return value

    @property
    def allowed_file_types(self) -> list[str]:
        return [kind.strip().lower() for kind in self.files_allowed_types.split(",") if kind.strip()]

    @property
    def multi_replica(self) -> bool:
        """Several replicas share the database: turns are leased (turns.replicas.lease), not owned by a
        process."""
        return self.redis_url is not None

    @property
    def heartbeat_seconds(self) -> float:
        return self.heartbeat_interval or self.lease_seconds / 3

    @property
    def idle_in_transaction_timeout_ms(self) -> int:
        """PostgreSQL ends a transaction idle this long. With several replicas, before the leases of a
        replica paused in it expire: a survivor then finds none of the rows it must take over locked. One
        process has nobody to hold up (and a pause mid-batch would only cost it that batch's retry)."""
        if self.database_idle_in_transaction_timeout_ms is not None:
            return self.database_idle_in_transaction_timeout_ms
        if not self.multi_replica:
            return 0
        before_expiry = int((self.lease_seconds - self.heartbeat_seconds) * 1000)
        return max(1, min(IDLE_IN_TRANSACTION_TIMEOUT_MS, before_expiry))

    def replica_problem(self) -> str | None:
        """Why this configuration cannot run as one of several replicas; None when it can (or is single)."""
        if not self.multi_replica:
            return None
        if not self.database_url.startswith(("postgresql", "postgres")):
            return (
                "PARLEY_REDIS_URL turns on multi-replica mode, which needs PostgreSQL: SQLite is one "
                "process's file (set PARLEY_DATABASE_URL=postgresql://..., or unset PARLEY_REDIS_URL)"
            )
        if self.heartbeat_seconds >= self.lease_seconds:
            return "PARLEY_HEARTBEAT_INTERVAL must be shorter than PARLEY_LEASE_SECONDS"
        if not 0 < self.idle_in_transaction_timeout_ms < self.lease_seconds * 1000:
            return (
                "PARLEY_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_MS must be above 0 and below "
                "PARLEY_LEASE_SECONDS (in ms): a paused replica's open transaction must end before its "
                "leases do"
            )
        return None

    @cached_property
    def sync_database_url(self) -> str:
        """The same database for tools that need a synchronous driver (alembic)."""
        url = self.database_url.replace("+aiosqlite", "")
        for bare in ("postgresql://", "postgres://"):
            if url.startswith(bare):
                return "postgresql+psycopg://" + url.removeprefix(bare)
        return url
