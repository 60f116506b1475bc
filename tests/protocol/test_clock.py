"""Timestamps (app.protocol.clock): UTC, millisecond precision, and text that sorts in time order."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from app.protocol.clock import now_iso


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
