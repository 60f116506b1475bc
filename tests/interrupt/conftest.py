"""Interrupting a running agent: a strict upstream, a slow tool the test controls, and a live server.

Every test in this folder runs the real model path (LiteLLM resolving the model, the stream read by the
adapter `stream_adapter` picks; test_stop_points.py runs with both) against a `FakeUpstream(strict=True)`,
which answers 400 to any history Anthropic's Messages API would refuse; a turn that sends an invalid
history therefore fails visibly (error code `provider_bad_request`). The `slow` tool
(tests/support/slow_tool.py) waits for a number of seconds or for a gate the test opens from its own
thread, and records whether it finished or was cancelled.

The helpers the test modules use (a `Session` over a real socket, the checks of what the upstream saw)
are in tests/interrupt/session.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.pool import Pool

from app.settings import Settings
from tests.fakes.upstream import FakeUpstream
from tests.support.server import LiveServer, live_server
from tests.support.slow_tool import SlowTool, build_registry

MODEL = "openai/strict-model"


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(strict=True) as running:
        yield running


def write_models_file(tmp_path: Path, api_base: str) -> Path:
    path = tmp_path / "models.json"
    path.write_text(
        json.dumps(
            {
                "providers": {
                    "strict": {"api_base": api_base, "models": {MODEL: {"context_window": 100_000}}},
                }
            }
        )
    )
    return path


@pytest.fixture
def stream_adapter() -> str:
    """The lean OpenAI-compatible reader; a module overrides this to run its tests with LiteLLM's too."""
    return "auto"


@pytest.fixture
def strict_settings(
    settings: Settings, upstream: FakeUpstream, tmp_path: Path, stream_adapter: str
) -> Settings:
    return settings.model_copy(
        update={
            "models_file": write_models_file(tmp_path, upstream.base_url),
            "default_model": MODEL,
            "tool_timeout": 20.0,
            "stream_adapter": stream_adapter,
        }
    )


@pytest.fixture
def server(strict_settings: Settings, slow_tool: SlowTool) -> Iterator[LiveServer]:
    with live_server(strict_settings, tools=build_registry(slow_tool)) as running:
        yield running


# SQLite's own default and largest page count: what a connection gets back once the disk has room.
UNCAPPED = 4294967294


@pytest.fixture
def full_disk() -> Iterator[list[bool]]:
    """A disk that fills on demand: while `full[0]`, every connection the pool hands out gets
    `PRAGMA max_page_count` of 1 (never below the file's size, so it cannot grow by a page), and SQLite
    answers SQLITE_FULL exactly as on a full disk; cleared, connections get SQLite's default back."""
    full = [False]

    def cap(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA max_page_count = {1 if full[0] else UNCAPPED}")
        cursor.close()

    event.listen(Pool, "checkout", cap)
    try:
        yield full
    finally:
        event.remove(Pool, "checkout", cap)
