"""Retention of the event log: which events of each session a commit trims (streaming.log.write_behind)."""

from __future__ import annotations

from collections.abc import Sequence

from app.streaming.frames import Frame


class Retention:
    """Keeps each session's last `keep` events. A turn's own writes trim exactly; a batch trims a
    session's log only once it holds a tenth more than that: trimming every batch would cost a DELETE
    per session per batch."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._slack = max(1, keep // 10)
        self._pruned_at: dict[str, int] = {}

    def cutoffs(self, events: Sequence[tuple[str, Frame]], *, exact: bool) -> list[tuple[str, int]]:
        """(session_id, keep_after) of the sessions whose log the commit that logs `events` trims: their
        events with seq <= keep_after go. Noted at once: should that commit fail, the next trim, which deletes
        everything up to its own cutoff, comes a little later."""
        heads: dict[str, int] = {}
        for session_id, frame in events:
            heads[session_id] = frame.seq
        keep, pruned_at = self._keep, self._pruned_at
        least = 1 if exact else self._slack
        found = [
            (sid, head - keep) for sid, head in heads.items() if head - keep - pruned_at.get(sid, 0) >= least
        ]
        for sid, keep_after in found:
            pruned_at[sid] = keep_after
        return found

    def forget(self, session_id: str) -> None:
        self._pruned_at.pop(session_id, None)
