"""Fixtures of the end-to-end stream tests: a server whose demo model is paced, and one with small queues.

Their helpers (sessions, posts, a client that stalls) are in tests/support/client.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.settings import Settings
from tests.support.client import QUEUE, SOCKET_BUFFER
from tests.support.server import LiveServer, live_server


@pytest.fixture
def paced(settings: Settings) -> Iterator[LiveServer]:
    with live_server(settings.model_copy(update={"demo_token_delay": 0.005})) as running:
        yield running


@pytest.fixture
def small_queues(settings: Settings) -> Iterator[LiveServer]:
    """Small send buffers and subscriber queues: a client that reads nothing soon fills them."""
    tuned = settings.model_copy(update={"demo_token_delay": 0.002, "subscriber_queue_size": QUEUE})
    with live_server(tuned, send_buffer=SOCKET_BUFFER) as running:
        yield running
