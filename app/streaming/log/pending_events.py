"""The write-behind's published events not committed yet, kept by session.

Every commit takes some sessions' events: an urgent batch (a response's first delta) one session's, a
turn's write its own session's. With one list of every session's events, each of those commits scanned
all of them three times (to find its sessions, to take their events, to remove them once committed): at
50 streaming sessions some hundreds of drafts, on the path of every first token. Kept by session, a
commit touches only its sessions' events. Only each session's order matters (its events are numbered in
it, streaming.log.sequencing); sessions' events need no order between them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from app.streaming.frames import Draft


class PendingEvents:
    __slots__ = ("_by_session",)

    def __init__(self) -> None:
        # Each session's events in publication order; a session with none has no entry.
        self._by_session: dict[str, list[Draft]] = {}

    def add(self, draft: Draft) -> None:
        events = self._by_session.get(draft.session_id)
        if events is None:
            self._by_session[draft.session_id] = [draft]
        else:
            events.append(draft)

    def __bool__(self) -> bool:
        return bool(self._by_session)

    def sessions(self) -> Collection[str]:
        """The sessions with pending events."""
        return self._by_session.keys()

    def has(self, session_id: str) -> bool:
        return session_id in self._by_session

    def of(self, sessions: Collection[str]) -> list[Draft]:
        """These sessions' events (a copy), each session's in publication order, sessions in the order
        their first pending event came."""
        found = self._by_session
        if len(sessions) == 1:  # an urgent batch, a turn's write: no scan
            return list(found.get(next(iter(sessions)), ()))
        return [d for sid, events in found.items() if sid in sessions for d in events]

    def session(self, session_id: str) -> list[Draft]:
        """The session's events, the list itself (empty and detached when it has none): texts.rename
        replaces drafts in it."""
        return self._by_session.get(session_id, [])

    def remove(self, drafts: Iterable[Draft]) -> None:
        """These events were committed (or dropped): they leave, by identity. Their sessions' events
        published meanwhile stay."""
        gone: dict[str, set[int]] = {}
        for d in drafts:
            gone.setdefault(d.session_id, set()).add(id(d))
        for sid, ids in gone.items():
            events = self._by_session.get(sid)
            if events is None:
                continue
            # The ones taken are normally the first: checked by identity, since a write may drop some.
            if len(events) >= len(ids) and all(id(d) in ids for d in events[: len(ids)]):
                del events[: len(ids)]
            else:
                events[:] = [d for d in events if id(d) not in ids]
            if not events:
                del self._by_session[sid]

    def drop_session(self, session_id: str, *, keep: set[int] | None = None) -> None:
        """The session's events go, but those whose id() is in `keep`."""
        events = self._by_session.get(session_id)
        if events is None:
            return
        if keep:
            events[:] = [d for d in events if id(d) in keep]
        if not keep or not events:
            del self._by_session[session_id]
