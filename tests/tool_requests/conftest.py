"""Client tools and approvals end to end: a live server whose model is the strict fake upstream.

Every history the server sends the upstream is checked as Anthropic's Messages API would check it (the
upstream answers 400 to one it would refuse, and the turn would fail visibly), so each test that ends
with a completed turn after a suspension proves that the suspended round left a valid history.
The `slow` tool (tests/support/slow_tool.py) is there for rounds that mix a waiting call with a server
tool that runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.settings import Settings
from tests.fakes.upstream import FakeUpstream
from tests.interrupt.conftest import MODEL, write_models_file
from tests.support.server import LiveServer, live_server
from tests.support.slow_tool import SlowTool, build_registry


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(strict=True) as running:
        yield running


@pytest.fixture
def wait_settings(settings: Settings, upstream: FakeUpstream, tmp_path: Path) -> Settings:
    return settings.model_copy(
        update={
            "models_file": write_models_file(tmp_path, upstream.base_url),
            "default_model": MODEL,
            "tool_timeout": 20.0,
        }
    )


@pytest.fixture
def server(wait_settings: Settings, slow_tool: SlowTool) -> Iterator[LiveServer]:
    with live_server(wait_settings, tools=build_registry(slow_tool)) as running:
        yield running


@pytest.fixture
def short_expiry(wait_settings: Settings, slow_tool: SlowTool) -> Iterator[LiveServer]:
    tuned = wait_settings.model_copy(update={"approval_timeout": 1.0, "client_tool_timeout": 1.0})
    with live_server(tuned, tools=build_registry(slow_tool)) as running:
        yield running
