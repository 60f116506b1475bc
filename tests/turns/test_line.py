"""The session state the runner keeps per session (turns/runtime/session_state.py): who waits for a message's
turn, and
whether a waiting message asks the running turn to stop at its next breakpoint."""

from __future__ import annotations

import asyncio

import pytest

from app.protocol.schemas import QueuedMessage
from app.turns.runtime.session_state import SessionState

pytestmark = pytest.mark.anyio

T0 = "2026-11-23T00:00:00.000Z"


def waiting(message_id: str, delivery: str) -> QueuedMessage:
    return QueuedMessage(id=message_id, content="x", sender="User", timestamp=T0, delivery=delivery)


async def test_takers_learn_the_turn_once_and_are_forgotten() -> None:
    state = SessionState()
    future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
    state.takers["m_1"] = future
    state.resolve_takers(["m_1", "m_unknown"], "t_1")
    assert future.result() == "t_1"
    assert state.takers == {}
    state.resolve_takers(["m_1"], "t_2")  # nobody waits any more: nothing happens
    assert future.result() == "t_1"


def test_only_steer_and_interrupt_ask_for_a_breakpoint() -> None:
    state = SessionState()
    assert not state.wants_breakpoint()
    state.waiting["m_q"] = waiting("m_q", "queue")
    assert not state.wants_breakpoint()
    state.waiting["m_s"] = waiting("m_s", "steer")
    assert state.wants_breakpoint()
