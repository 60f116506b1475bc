"""From raw turns (client marks joined with the upstream's own records by tag) to a stage's figures.

The join: every request the server (or a baseline) sends upstream carries the `[bench tag=...]` of the
turn that caused it, and the upstream records when it received the request (`start`), wrote the first
text chunk (`first`) and the last byte (`end`), or saw the client leave (`disconnected`). All times are
`time.monotonic()` seconds, one clock for every process on Linux.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from bench.load import Turn
from bench.stats import dist

MS = 1000.0


def _own(record: dict[str, Any] | None) -> float | None:
    """The upstream's own duration of a completed request: request received to last byte written."""
    if record is None or record.get("end") is None:
        return None
    own: float = record["end"] - record["start"]
    return own if own > 0 else None


def _at(record: dict[str, Any] | None, key: str) -> float | None:
    value = None if record is None else record.get(key)
    return float(value) if isinstance(value, int | float) else None


def _ended_before(record: dict[str, Any] | None, at: float | None) -> bool:
    end = _at(record, "end")
    return end is not None and at is not None and end <= at


def _delta(later: float | None, earlier: float | None) -> float | None:
    return None if later is None or earlier is None else later - earlier


def _div(value: float | None, by: float | None) -> float | None:
    return None if value is None or not by else value / by


def _errors(turns: Sequence[Turn]) -> dict[str, Any]:
    failed = [t for t in turns if t.error is not None]
    return {"count": len(failed), "first": failed[0].error if failed else None}


def _outcomes(turns: Sequence[Turn]) -> dict[str, Any]:
    return {
        "turns": len(turns),
        "statuses": dict(Counter(t.status or "none" for t in turns)),
        "errors": _errors(turns),
    }


def _us_per(seconds: float, count: int) -> float | None:
    """CPU seconds per unit (chunk, token) in microseconds."""
    return round(seconds / count * 1e6, 1) if count else None


def _net_cpu(window: dict[str, Any], idle_rate: float) -> float:
    """The window's server CPU less what the server spends idle over as long."""
    net: float = window["server_cpu_s"] - idle_rate * window["wall_s"]
    return max(0.0, net)


def _sent(joined: Sequence[tuple[Any, dict[str, Any] | None]]) -> int:
    """Text chunks the upstream sent for these requests."""
    return sum(int(u.get("sent", 0)) for _, u in joined if u is not None)


def _user_agents(joined: Sequence[tuple[Any, dict[str, Any] | None]]) -> list[str]:
    return sorted({str(u.get("user_agent", "")) for _, u in joined if u is not None})


def streaming(
    turns: Sequence[Turn], upstream: dict[str, dict[str, Any]], window: dict[str, Any], idle_rate: float
) -> dict[str, Any]:
    """A sweep level: CPU per chunk, duration ratio, first-token times, and the window's server figures."""
    joined = [(t, upstream.get(t.tag)) for t in turns]
    chunks = _sent(joined)
    return {
        **_outcomes(turns),
        "chunks": chunks,
        "text_deltas": sum(t.text_deltas for t in turns),
        "cpu_per_chunk_us": _us_per(window["server_cpu_s"], chunks),
        "cpu_per_chunk_net_us": _us_per(_net_cpu(window, idle_rate), chunks),
        "idle_cpu_rate": round(idle_rate, 4),
        # Post written -> turn_done read, over the upstream's own duration for that turn's request.
        "duration_ratio": dist(_div(_delta(t.done, t.posted), _own(u)) for t, u in joined),
        # The server's own turn_done.duration_seconds over the same upstream duration.
        "server_duration_ratio": dist(_div(t.server_seconds, _own(u)) for t, u in joined),
        "upstream_duration_s": dist(_own(u) for _, u in joined),
        "first_event_ms": dist((_delta(t.first_event, t.posted) for t, _ in joined), MS),
        "first_text_ms": dist((_delta(t.first_text, t.posted) for t, _ in joined), MS),
        "upstream_first_text_ms": dist((_delta(_at(u, "first"), _at(u, "start")) for _, u in joined), MS),
        # What the server adds to the first token: upstream wrote it -> the client read its text_delta.
        "first_text_added_ms": dist((_delta(t.first_text, _at(u, "first")) for t, u in joined), MS),
        # Post written -> its 202 read (the POST's handling: the message stored, the turn opened).
        "post_to_accepted_ms": dist((_delta(t.accepted, t.posted) for t, _ in joined), MS),
        # Post written -> the upstream received the model request (POST handling, turn start, the call).
        "post_to_request_ms": dist((_delta(_at(u, "start"), t.posted) for t, u in joined), MS),
        # Upstream's last byte -> turn_done read (response end, persistence, delivery).
        "end_to_done_ms": dist((_delta(t.done, _at(u, "end")) for t, u in joined), MS),
        "user_agents": _user_agents(joined),
        "window": window,
    }


def stopping(
    turns: Sequence[Turn], upstream: dict[str, dict[str, Any]], window: dict[str, Any]
) -> dict[str, Any]:
    """The stop stage: cancel request written -> agent_cancelled read, and -> the upstream saw the close."""
    stopped = [t for t in turns if t.cancel_sent is not None]
    accepted = [t for t in stopped if t.cancel_status == 202]
    # A stop that reached the server after the upstream had sent its last byte has no disconnect to see.
    live = [t for t in accepted if not _ended_before(upstream.get(t.tag), t.cancel_sent)]
    disconnects = [_delta(_at(upstream.get(t.tag), "disconnected"), t.cancel_sent) for t in live]
    return {
        "turns": len(turns),
        "cancels": len(stopped),
        "cancel_statuses": dict(Counter(str(t.cancel_status) for t in stopped)),
        "errors": _errors(turns),
        "cancel_to_event_ms": dist((_delta(t.cancelled, t.cancel_sent) for t in accepted), MS),
        "cancel_to_disconnect_ms": dist(disconnects, MS),
        "disconnect_not_seen": sum(1 for d in disconnects if d is None),
        "upstream_done_before_stop": len(accepted) - len(live),
        "cancel_answer_ms": dist((_delta(t.cancel_answered, t.cancel_sent) for t in accepted), MS),
        "cancelled_statuses": dict(Counter(t.status or "none" for t in accepted)),
        "window": window,
    }


def demo(
    turns: Sequence[Turn], window: dict[str, Any], token_delay: float, idle_rate: float
) -> dict[str, Any]:
    """The in-process demo model: CPU per text_delta, and turn time over the paced model time."""
    deltas = sum(t.text_deltas for t in turns)
    return {
        **_outcomes(turns),
        "text_deltas": deltas,
        "token_delay_s": token_delay,
        "cpu_per_token_us": _us_per(window["server_cpu_s"], deltas),
        "cpu_per_token_net_us": _us_per(_net_cpu(window, idle_rate), deltas),
        # Post written -> turn_done read, over (tokens x the demo's delay per token).
        "duration_ratio": dist(_div(_delta(t.done, t.posted), t.text_deltas * token_delay) for t in turns),
        "first_text_ms": dist((_delta(t.first_text, t.posted) for t in turns), MS),
        "window": window,
    }


def baseline_level(level: dict[str, Any], upstream: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One level of a raw-SDK baseline, in the same terms as `streaming`."""
    streams: list[dict[str, Any]] = level["streams"]
    joined = [(s, upstream.get(s["tag"])) for s in streams]
    chunks = _sent(joined)
    wall = level["wall_seconds"]
    return {
        "turns": len(streams),
        "chunks": chunks,
        "chunks_read": level["chunks"],
        "cpu_per_chunk_us": _us_per(level["cpu_seconds"], chunks),
        "duration_ratio": dist(_div(_delta(s["end"], s["start"]), _own(u)) for s, u in joined),
        "first_text_ms": dist((_delta(s["first"], s["start"]) for s, _ in joined), MS),
        "first_text_added_ms": dist((_delta(s["first"], _at(u, "first")) for s, u in joined), MS),
        "user_agents": _user_agents(joined),
        "window": {
            "wall_s": round(wall, 3),
            "cpu_s": round(level["cpu_seconds"], 3),
            "util": round(level["cpu_seconds"] / wall, 3) if wall else None,
            "others_share": round(level["others_seconds"] / wall, 3)
            if wall and level.get("others_seconds") is not None
            else None,
            "wait_share": round(level["wait_seconds"] / wall, 3)
            if wall and level.get("wait_seconds")
            else None,
            "loop_lag": level["loop_lag"],
            "peak_rss_mb": level.get("peak_rss_mb"),
        },
        "errors": {"count": level.get("errors", 0), "first": level.get("first_error")},
    }
