"""Ids (app.protocol.ids): their shapes, their uniqueness, and that the kinds never collide."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from app.protocol.ids import (
    MESSAGE_ID_PATTERN,
    SESSION_ID_PATTERN,
    TURN_ID_PATTERN,
    new_message_id,
    new_session_id,
    new_turn_id,
)

DRAWS = 10_000


@pytest.mark.parametrize(
    ("make", "pattern"),
    [
        (new_message_id, MESSAGE_ID_PATTERN),
        (new_turn_id, TURN_ID_PATTERN),
        (new_session_id, SESSION_ID_PATTERN),
    ],
    ids=["message", "turn", "session"],
)
def test_id_shape_and_uniqueness(make: Callable[[], str], pattern: str) -> None:
    ids = [make() for _ in range(DRAWS)]
    bad = [value for value in ids if re.fullmatch(pattern, value) is None]
    assert bad == []
    assert len(set(ids)) == DRAWS
    # Every digit is random: each position takes all 16 values over the draws (none is fixed).
    assert all(len({value[i] for value in ids}) == 16 for i in range(2, len(ids[0])))


def test_message_ids_fit_their_column() -> None:
    # chat_messages.id and queued_messages.id are VARCHAR(20).
    assert len(new_message_id()) == 14


def test_id_kinds_never_collide() -> None:
    prefixes = {new_message_id()[:2], new_turn_id()[:2], new_session_id()[:2]}
    assert prefixes == {"m_", "t_", "s_"}
