"""The runner on a real migrated SQLite file (tests/support/runtime.py: the lifespan's components, the
model layer never loaded, so a turn waits in its preparation until it is stopped)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator

import pytest

from app.settings import Settings
from app.turns.runtime.session_state import SessionState
from tests.support.runtime import Runtime, runtime

pytestmark = pytest.mark.anyio


@pytest.fixture
async def rt(settings: Settings) -> AsyncIterator[Runtime]:
    async with runtime(settings) as running:
        yield running


async def test_a_stop_before_the_turns_task_has_begun_still_closes_the_turn(rt: Runtime) -> None:
    """A cancel in the same loop iteration as the post: the task has not taken its first step, so
    cancelling it would skip its body and leave the turn open and the session busy for good. The stop is
    noted and the task closes the turn when it begins."""
    session = await rt.add_session("s_a")
    posted = await rt.runner.post(session, "hi", "User", "steer")  # no await between: the task never ran
    result = await rt.runner.cancel("s_a")
    assert (result.cancelled, result.turn_id) == (True, posted.turn_id)
    assert await rt.history("s_a") == [("turn_start", None), ("text", None), ("turn_done", "cancelled")]
    assert (await rt.runner.statuses(["s_a"]))["s_a"].agent_status == "idle"
    # The session is free: the next message starts a turn.
    again = await rt.runner.post(session, "again", "User", "steer")
    assert again.queued is False and again.turn_id not in (None, posted.turn_id)


async def test_an_idle_session_keeps_nothing_of_its_last_turn(rt: Runtime) -> None:
    """Once a turn ended and nothing waits, the session's state lets its recorder, inbox and task go: a
    replica keeps a state for every session it ever ran, and each finished turn kept ~9 KB alive with
    them (a task, its coroutine and context, the recorder, its publisher, the inbox and its queue;
    measured with 3,000 sessions of one turn each: 10.4 KB of RSS a session before, 1.3 after). How it
    proves it: a weak reference to the turn's recorder dies once the turn ended and a collection ran."""
    session = await rt.add_session("s_idle")
    turn_id = await rt.start_turn(session)
    state = rt.runner.state("s_idle")
    assert state.recorder is not None and state.recorder.turn_id == turn_id
    recorder, task = weakref.ref(state.recorder), state.task
    assert task is not None
    assert (await rt.runner.cancel("s_idle")).cancelled
    await task
    del task
    await asyncio.sleep(0)  # the cancel's watch of the turn's stall ends its task
    gc.collect()
    assert _turn_of(state) == (None, None, None)
    assert recorder() is None
    # The next post starts a turn as before.
    again = await rt.runner.post(session, "again", "User", "steer")
    assert again.turn_id not in (None, turn_id) and state.recorder is not None


def _turn_of(state: SessionState) -> tuple[object, object, object]:
    """What a state holds of a turn (typed loosely: mypy keeps the recorder narrowed from above)."""
    return (state.task, state.recorder, state.inbox)
