"""What a response's times measure (issue 31): `duration_ms` runs from the model
request to the response's end, the wait for the first token included; `first_token_ms` from the same
request to the first token (text or tool call). The upstream waits before its headers and paces its
chunks, so both parts are known from below; the event and the history entry carry the same values, on
SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.settings import Settings
from tests.fakes.upstream import FakeUpstream, Script
from tests.interrupt.conftest import MODEL, write_models_file
from tests.interrupt.session import open_session
from tests.support.server import LiveServer, live_server

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

# The upstream's wait before its headers, and the pace of its chunks after them.
WAIT, PACE, CHUNKS = 0.4, 0.1, 4


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(strict=True) as running:
        yield running


@pytest.fixture
def server(settings: Settings, upstream: FakeUpstream, tmp_path: Path) -> Iterator[LiveServer]:
    tuned = settings.model_copy(
        update={"models_file": write_models_file(tmp_path, upstream.base_url), "default_model": MODEL}
    )
    with live_server(tuned) as running:
        yield running


async def test_a_texts_first_token_ms_is_the_wait_part_of_its_duration(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(
        Script.tool_calls([("c1", "calculate", '{"expression": "1+1"}')], hang_before_headers=WAIT),
        Script.text("One and one make two.", chunks=CHUNKS, delay=PACE, hang_before_headers=WAIT),
    )
    async with open_session(server, tools=["calculate"]) as session:
        posted = await session.accepted("1+1?")
        await session.turn_done(posted["turn_id"], timeout=30.0)
        calls, text = session.events("response_done")
        history = await session.history()
        turns = (await session.client.get(f"{session.base}/turns")).json()["turns"]
    # A response of tool calls only: its first token is the first call's fragment.
    assert calls["id"] is None
    assert calls["first_token_ms"] >= WAIT * 1000 and calls["duration_ms"] >= calls["first_token_ms"]
    # The text: the wait, then the chunks paced after the first one (half their schedule: a bound for a
    # busy machine, where the first chunk can be read late).
    assert text["first_token_ms"] >= WAIT * 1000
    assert text["duration_ms"] - text["first_token_ms"] >= (CHUNKS - 1) * PACE * 1000 / 2
    [entry] = [m for m in history if m["type"] == "text" and m["role"] == "assistant"]
    assert (entry["id"], entry["duration_ms"], entry["first_token_ms"]) == (
        text["id"],
        text["duration_ms"],
        text["first_token_ms"],
    )
    [node] = [n for n in turns[0]["nodes"] if n["kind"] == "llm"]
    assert (node["duration_ms"], node["first_token_ms"]) == (text["duration_ms"], text["first_token_ms"])
