"""A write the database refuses for its data (not storage refusing work: a constraint, a value it cannot
hold), in the middle of a streamed answer. The turn ends with an `error` and a `turn_done` on the stream and
in the history, `?wait=true` answers its end, and the other sessions' events keep committing.

How the refusal is made: a trigger on `events` (SQLite's RAISE, PostgreSQL's RAISE EXCEPTION with a
check violation) refuses the event whose data holds a marker, on both databases the same way.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from app.storage.engine import is_postgres, sync_url
from tests.fakes.upstream import FakeUpstream, Script
from tests.interrupt.session import open_session
from tests.support.server import LiveServer

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

MARK = "REFUSED-BY-THE-DATABASE"
_SQLITE = [
    f"""CREATE TRIGGER refuse_mark BEFORE INSERT ON events WHEN NEW.data LIKE '%{MARK}%'
        BEGIN SELECT RAISE(ABORT, 'refused'); END"""
]
_POSTGRES = [
    f"""CREATE OR REPLACE FUNCTION refuse_mark() RETURNS trigger AS $$ BEGIN
        IF NEW.data LIKE '%{MARK}%' THEN RAISE EXCEPTION 'refused' USING ERRCODE = 'check_violation'; END IF;
        RETURN NEW; END $$ LANGUAGE plpgsql""",
    "CREATE TRIGGER refuse_mark BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION refuse_mark()",
]
# The run's PostgreSQL database is emptied between tests, not dropped: the trigger must go with the test.
_POSTGRES_UNDO = ["DROP TRIGGER IF EXISTS refuse_mark ON events", "DROP FUNCTION IF EXISTS refuse_mark()"]


def _run(database_url: str, statements: list[str]) -> None:
    engine = create_engine(sync_url(database_url))
    try:
        with engine.begin() as connection:
            for statement in statements:
                connection.execute(text(statement))
    finally:
        engine.dispose()


@pytest.fixture
def refused_mark(database_url: str) -> Iterator[None]:
    postgres = is_postgres(database_url)
    _run(database_url, [*_POSTGRES_UNDO, *_POSTGRES] if postgres else _SQLITE)
    yield
    if postgres:
        _run(database_url, _POSTGRES_UNDO)


async def test_a_refused_event_ends_the_turn_failed_and_the_others_go_on(
    refused_mark: None, server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(Script(text_pieces=["fine ", MARK, " and more"] + [" words"] * 40, delay=0.02))
    async with open_session(server) as session, open_session(server) as other:
        posted = await session.post("go")
        assert posted.status_code == 202, posted.text
        turn_id = posted.json()["turn_id"]
        done = await session.turn_done(turn_id, timeout=30)
        assert done["status"] == "failed"
        [error] = session.events("error")
        assert error["code"] == "storage_error"
        history = await session.history()
        # Another session is not held up by the refused write: its turn streams and completes.
        upstream.enqueue(Script.text("all good here"))
        answered = await other.post("and you?")
        assert answered.status_code == 202, answered.text
        other_done = await other.turn_done(answered.json()["turn_id"], timeout=30)
        assert other_done["status"] == "completed"
        info = await session.info()
    assert [m["type"] for m in history][-2:] == ["error", "turn_done"]
    assert info["running_turn_id"] is None and info["agent_status"] == "idle"


async def test_wait_true_answers_the_end_of_a_turn_a_refused_write_ended(
    refused_mark: None, server: LiveServer, upstream: FakeUpstream
) -> None:
    upstream.enqueue(Script(text_pieces=["fine ", MARK, " and more"], delay=0.02))
    async with open_session(server) as session:
        response = await session.client.post(
            f"{session.base}/messages", params={"wait": "true"}, json={"content": "go"}
        )
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "failed"
