"""Timestamps: made once by the server, stored as text, never regenerated on read (docs/protocol.md,
History)."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def now_iso() -> str:
    """UTC ISO 8601 with an explicit offset and millisecond precision, e.g. 2026-02-28T06:30:00.123+00:00."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def monotonic_ms() -> float:
    return time.monotonic() * 1000.0
