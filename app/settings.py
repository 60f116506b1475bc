"""Service configuration: every knob is an environment variable with the PARLEY_ prefix."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEMO_MODEL = "parley/demo"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PARLEY_", extra="ignore")

    database_url: str = "sqlite+aiosqlite:///./data/parley.db"
    default_model: str = DEMO_MODEL
    models_file: Path | None = None

    demo_token_delay: float = Field(0.02, ge=0, description="Seconds the demo model waits before each token.")
    max_tool_rounds: int = Field(25, ge=1, description="Model calls allowed in one turn before it fails.")
    tool_timeout: float = Field(
        30.0, gt=0, description="Seconds a tool may run before it gives an error result."
    )
    provider_timeout: float = Field(120.0, gt=0, description="Seconds without a byte from the provider.")
    provider_retries: int = Field(
        2, ge=0, description="Retries of a model call that failed before any output."
    )
    provider_retry_backoff: float = Field(0.5, ge=0, description="First retry delay in seconds; doubles.")
    flush_interval: float = Field(1.0, gt=0, le=1.0, description="Max seconds streamed text stays unflushed.")
    sse_ping_interval: float = Field(15.0, gt=0, description="Seconds between SSE heartbeat comments.")
    subscriber_queue_size: int = Field(10_000, ge=16, description="Events buffered per slow SSE client.")
    page_size_max: int = Field(1000, ge=1)

    @cached_property
    def sync_database_url(self) -> str:
        """The same database for tools that need a synchronous driver (alembic)."""
        return self.database_url.replace("+aiosqlite", "")
