"""Live servers of the app as published: the turn routes included and the OpenAPI customizer installed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from app.settings import Settings
from tests.support.server import LiveServer


@contextmanager
def published_server(settings: Settings) -> Iterator[LiveServer]:
    running = LiveServer(settings)
    running.start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def contract_server(settings: Settings) -> Iterator[LiveServer]:
    with published_server(settings) as running:
        yield running


@pytest.fixture
def paced_server(settings: Settings) -> Iterator[LiveServer]:
    """The demo model at 5 ms a token: a `[long]` answer takes about two seconds."""
    with published_server(settings.model_copy(update={"demo_token_delay": 0.005})) as running:
        yield running
