"""Ids (app.protocol.ids): their shapes, their uniqueness, and that the kinds never collide."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from app.protocol.ids import new_message_id, new_session_id, new_turn_id

DRAWS = 10_000


@pytest.mark.parametrize(
    ("make", "pattern"),
    [
        (new_message_id, r"m_[0-9a-f]{12}"),
        (new_turn_id, r"t_[0-9a-f]+"),
        (new_session_id, r"s_[0-9a-f]+"),
    ],
    ids=["message", "turn", "session"],
)
def test_id_shape_and_uniqueness(make: Callable[[], str], pattern: str) -> None:
    ids = [make() for _ in range(DRAWS)]
    bad = [value for value in ids if re.fullmatch(pattern, value) is None]
    assert bad == []
    assert len(set(ids)) == DRAWS


def test_message_ids_fit_their_column() -> None:
    # chat_messages.id and queued_messages.id are VARCHAR(20).
    assert len(new_message_id()) == 14


def test_id_kinds_never_collide() -> None:
    prefixes = {new_message_id()[:2], new_turn_id()[:2], new_session_id()[:2]}
    assert prefixes == {"m_", "t_", "s_"}
