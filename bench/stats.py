"""Summaries of samples: the percentiles every stage reports, with the server's own interpolation."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from app.observability.monitor import percentile


def dist(values: Iterable[float | None], scale: float = 1.0, digits: int = 3) -> dict[str, Any]:
    """n, p50, p99, max and mean of the values that are not None, each multiplied by `scale`.

    With fewer than 100 samples p99 is interpolated between the two largest, so it is close to the max:
    `n` is there to say how much a p99 is worth."""
    kept = [v * scale for v in values if v is not None]
    if not kept:
        return {"n": 0, "p50": None, "p99": None, "max": None, "mean": None}
    return {
        "n": len(kept),
        "p50": _round(percentile(kept, 50), digits),
        "p99": _round(percentile(kept, 99), digits),
        "max": _round(max(kept), digits),
        "mean": _round(sum(kept) / len(kept), digits),
    }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def ratio(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or theirs is None or theirs == 0:
        return None
    return round(ours / theirs, 3)


def median(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return percentile(kept, 50) if kept else None
