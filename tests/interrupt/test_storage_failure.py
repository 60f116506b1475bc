"""Storage that refuses writes in the middle of a turn (issue 13, point 2): the disk fills while the model
streams. The turn stops, stays this process's while nothing can be written (a cancel says so with a 503
of storage's code, a new message is refused and stores nothing), and once space is freed it is closed in
order: its streamed text kept and marked, an `error` with the code, a `turn_done` failed, all on the
stream and in the history, before any later turn. The next turn then runs and a strict provider accepts
the history.

How a full disk is made: every connection the server checks out gets `PRAGMA max_page_count` at its
current size while the test says the disk is full, and the largest count again once it says it is not,
so SQLite answers SQLITE_FULL exactly as on a full disk (the same trick as tests/api/test_server_errors.py).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from typing import Any

import pytest

from app.storage import repository
from tests.fakes.script import Script
from tests.fakes.upstream import FakeUpstream
from tests.interrupt.session import assert_strictly_valid, open_session, request_number
from tests.support.server import LiveServer

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def _eventually(check: Any, timeout: float = 20.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = await check()
        if result:
            return result
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in r.getMessage() for r in caplog.records)


async def test_a_disk_that_fills_mid_turn_leaves_an_ordered_closed_history(
    server: LiveServer, upstream: FakeUpstream, full_disk: list[bool], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    # A long answer: 400 chunks 10 ms apart, each a word of several characters.
    upstream.enqueue(Script.words(400, delay=0.01), Script.text("After the disk was freed."))
    async with open_session(server) as session:
        first = await session.accepted("Tell me a long story.")
        turn_id = first["turn_id"]
        await request_number(upstream, 1)
        await session.wait_type("text_delta", count=20)
        full_disk[0] = True

        # The turn notices (the write-behind's batches fail once a write needs a new page), stops the model
        # and cannot write its end. Then a cancel says exactly that, with storage's code, and claims no stop.
        await _eventually(lambda: _logged(caplog, "its end cannot be written"))

        async def cancel_refused() -> Any:
            response = await session.cancel()
            return response if response.status_code == 503 else None

        refused = await _eventually(cancel_refused, timeout=5)
        error = refused.json()["error"]
        assert error["code"] == "storage_full", refused.text
        assert "cannot be stored yet" in error["message"]
        assert int(refused.headers["retry-after"]) > 1
        # The turn is still the session's: it is not idle, and a new message cannot be stored.
        info = await session.info()
        assert (info["running_turn_id"], info["agent_status"]) == (turn_id, "thinking")
        posted = await session.post("A message while the disk is full.")
        assert posted.status_code == 503 and posted.json()["error"]["code"] == "storage_full", posted.text
        seen_before_freed = len(session.reader.events)

        full_disk[0] = False
        done = await session.turn_done(turn_id, timeout=20)
        assert done["status"] == "failed"
        # Nothing of the turn reached clients while storage refused it: every event was committed first.
        assert len(session.reader.events) > seen_before_freed

        second = await session.accepted("And now?")
        # The next turn streams: storage works again, whatever the batch loop last saw.
        assert (await session.turn_done(second["turn_id"], timeout=20))["status"] == "completed"
        await session.wait_idle()
        history = await session.history()

    # The history's rows name their turn on turn_start and turn_done; the first turn is the first five.
    turn = history[:5]
    assert [m["type"] for m in turn] == ["turn_start", "text", "text", "error", "turn_done"]
    assert (turn[0]["turn_id"], turn[4]["turn_id"]) == (turn_id, turn_id)
    answer, failure = turn[2], turn[3]
    assert answer["interrupted"] is True
    # The history holds exactly the text the clients saw.
    streamed = "".join(e["text"] for e in session.events("text_delta") if e["id"] == answer["id"])
    assert answer["content"] == streamed and len(streamed) > 20
    assert failure["code"] == "storage_full"
    # In order: the failed turn's end comes before the next turn's start, in the history and the stream.
    assert [m["type"] for m in history].count("turn_done") == 2
    ends = [m for m in history if m["type"] in ("turn_start", "turn_done")]
    assert [(m["type"], m.get("turn_id")) for m in ends] == [
        ("turn_start", turn_id),
        ("turn_done", turn_id),
        ("turn_start", second["turn_id"]),
        ("turn_done", second["turn_id"]),
    ]
    errors = session.events("error")
    # The end is written once however many times it was tried: one error, the history's.
    assert [(e["code"], e["id"]) for e in errors] == [("storage_full", failure["id"])], errors
    # The message refused while full was never stored; the next turn's request was valid for a strict
    # provider (the interrupted answer included).
    assert "A message while the disk is full." not in [m.get("content") for m in history]
    assert_strictly_valid(upstream)


async def test_messages_whose_take_storage_refused_go_before_a_later_message(
    server: LiveServer, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn ends with a message waiting, and storage refuses the write that takes it (once). The
    message stays first in line: a message posted next is taken after it, never before it, and nothing
    is left waiting."""
    upstream.enqueue(Script.words(60, delay=0.01), Script.text("Second."), Script.text("Third."))
    original = repository.dequeue
    refused: list[bool] = []

    async def dequeue_once_refused(*args: Any, **kwargs: Any) -> Any:
        if not refused:
            refused.append(True)
            raise sqlite3.OperationalError("database or disk is full")
        return await original(*args, **kwargs)

    monkeypatch.setattr(repository, "dequeue", dequeue_once_refused)
    async with open_session(server) as session:
        first = await session.accepted("first")
        queued = await session.accepted("queued", "queue")
        assert queued["turn_id"] is None
        await session.turn_done(first["turn_id"], timeout=20)
        await _eventually(lambda: _true(bool(refused)))
        await session.accepted("third", "queue")
        await session.wait_idle(timeout=20)
        assert await session.user_texts() == ["first", "queued", "third"]
        assert await session.queue() == []
    assert_strictly_valid(upstream)


async def _true(value: bool) -> bool:
    return value
