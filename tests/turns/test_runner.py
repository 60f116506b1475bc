"""The runner on a real migrated SQLite file (tests/support/runtime.py: the lifespan's components, the
model layer never loaded, so a turn waits in its preparation until it is stopped)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from app.settings import Settings
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
