"""Ids and timestamps (app.protocol.clock): their shapes, their uniqueness, and the timestamp's precision."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from app.protocol.clock import now_iso
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


def test_now_iso_is_utc_with_millisecond_precision() -> None:
    before = datetime.now(UTC)
    text = now_iso()
    after = datetime.now(UTC)

    parsed = datetime.fromisoformat(text)
    assert parsed.tzinfo is not None
    assert parsed.utcoffset() == timedelta(0)
    assert text.endswith("+00:00")
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}\+00:00", text), text
    assert parsed.microsecond % 1000 == 0
    # Truncated to the millisecond, so it may be up to 1 ms before `before`.
    assert before - timedelta(milliseconds=1) <= parsed <= after
    assert abs(parsed - datetime.now(UTC)) < timedelta(seconds=1)


def test_now_iso_sorts_as_text_in_time_order() -> None:
    stamps = [now_iso() for _ in range(200)]
    assert stamps == sorted(stamps)
