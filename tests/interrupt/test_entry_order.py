"""A turn's history entries are stamped in their order (issue 31): in history order
the timestamps of the entries a turn writes never go back, however the turn ends (completed, failed,
cancelled), its last entries included: a failure's `error` entry, the results a stop gives the round's
calls, and `turn_done` last. A user message keeps the time it was accepted. On SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import datetime
from itertools import pairwise
from typing import Any

import pytest

from tests.fakes.upstream import FakeUpstream, Script
from tests.interrupt.session import open_session
from tests.support.server import LiveServer

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

SLOW = ["slow", "calculate"]


def assert_stamped_in_order(history: list[dict[str, Any]], turn_id: str) -> list[str]:
    """The turn's entry types, after checking that the timestamps of those the turn stamps follow their
    order. A user message keeps the time it was accepted (set once, as its 202 gave it): no later than
    its turn's start, earlier when it waited in the line."""
    start = next(n for n, m in enumerate(history) if m["type"] == "turn_start" and m["turn_id"] == turn_id)
    end = next(n for n, m in enumerate(history) if n > start and m["type"] == "turn_done")
    entries = history[start : end + 1]
    users = [m for m in entries if m["type"] == "text" and m["role"] == "user"]
    assert users and all(_at(m) <= _at(entries[0]) for m in users), users
    stamped = [(m["type"], _at(m)) for m in entries if m not in users]
    late = [(a, b) for a, b in pairwise(stamped) if b[1] < a[1]]
    assert late == [], f"entries stamped before the one they follow: {late}"
    return [m["type"] for m in entries]


def _at(entry: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(entry["timestamp"])


async def test_a_completed_turns_entries_are_stamped_in_order(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(
        Script.tool_calls([("c1", "calculate", '{"expression": "1+1"}')], text_before="Let me add."),
        Script.text("It is 2."),
    )
    async with open_session(server, tools=SLOW) as session:
        posted = await session.accepted("1+1?")
        await session.turn_done(posted["turn_id"])
        types = assert_stamped_in_order(await session.history(), posted["turn_id"])
    assert types == ["turn_start", "text", "text", "tool_group", "text", "turn_done"]


async def test_a_failed_turns_error_is_stamped_before_its_turn_done(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    """The model fails mid-stream after a tool round: its text is kept, then the error, then turn_done."""
    upstream.enqueue(
        Script.tool_calls([("c1", "calculate", '{"expression": "1+1"}')]),
        Script.text("It is two, or", chunks=4, error_after=3),
    )
    async with open_session(server, tools=SLOW) as session:
        posted = await session.accepted("1+1?")
        done = await session.turn_done(posted["turn_id"])
        assert done["status"] == "failed"
        types = assert_stamped_in_order(await session.history(), posted["turn_id"])
    assert types[-2:] == ["error", "turn_done"]


async def test_a_cancelled_turns_interrupted_calls_are_stamped_before_its_turn_done(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    """Stopped while three calls run: each gets its interrupted result before turn_done."""
    upstream.enqueue(
        Script.tool_calls(
            [(f"s{n}", "slow", f'{{"gate": "g{n}"}}') for n in range(3)], text_before="Working."
        )
    )
    async with open_session(server, tools=SLOW) as session:
        posted = await session.accepted("go")
        await session.wait_type("tool_exec_start", count=3, timeout=30.0)
        assert (await session.cancel()).status_code == 202
        done = await session.turn_done(posted["turn_id"])
        assert done["status"] == "cancelled"
        types = assert_stamped_in_order(await session.history(), posted["turn_id"])
    assert types.count("tool_group") == 3
