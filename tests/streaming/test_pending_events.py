"""The write-behind's pending events kept by session (app.streaming.log.pending_events): each session's order
kept, a commit taking and removing only its sessions' events, by identity, whatever was published or
dropped meanwhile."""

from __future__ import annotations

from app.streaming.frames import Draft
from app.streaming.log.pending_events import PendingEvents


def draft(session_id: str, n: int) -> Draft:
    return Draft(session_id, "text_delta", f',"n":{n}}}')


def test_each_sessions_events_keep_their_order_and_only_asked_sessions_are_taken() -> None:
    pending = PendingEvents()
    published = [draft(sid, n) for n in range(3) for sid in ("s_a", "s_b", "s_c")]
    for d in published:
        pending.add(d)
    assert pending
    assert set(pending.sessions()) == {"s_a", "s_b", "s_c"}
    taken = pending.of({"s_c", "s_a", "s_x"})
    assert [d for d in taken if d.session_id == "s_a"] == [d for d in published if d.session_id == "s_a"]
    assert [d for d in taken if d.session_id == "s_c"] == [d for d in published if d.session_id == "s_c"]
    # Sessions in the order their first pending event came, whatever the order asked.
    assert [d.session_id for d in taken] == ["s_a"] * 3 + ["s_c"] * 3
    assert sorted(map(id, pending.of(pending.sessions()))) == sorted(map(id, published))


def test_removing_a_commits_events_keeps_those_published_meanwhile() -> None:
    pending = PendingEvents()
    first = [draft("s_a", n) for n in range(3)]
    for d in first:
        pending.add(d)
    taken = pending.of(["s_a"])
    later = draft("s_a", 3)
    pending.add(later)
    pending.remove(taken)
    assert pending.session("s_a") == [later]
    pending.remove([later])
    assert not pending and not pending.has("s_a") and pending.of({"s_a"}) == []


def test_removal_is_by_identity_not_position() -> None:
    """A draft equal to a taken one but another object stays; a taken one no longer at the front (the
    session's events were cut meanwhile) still goes."""
    pending = PendingEvents()
    a0, a1, twin = draft("s_a", 0), draft("s_a", 1), draft("s_a", 0)
    for d in (a0, a1, twin):
        pending.add(d)
    pending.drop_session("s_a", keep={id(a1), id(twin)})
    pending.remove([a0, a1])  # a0 was dropped already, a1 is the first
    assert [id(d) for d in pending.session("s_a")] == [id(twin)]


def test_dropping_a_session_keeps_only_what_is_asked() -> None:
    pending = PendingEvents()
    kept = draft("s_a", 0)
    for d in (kept, draft("s_a", 1), draft("s_b", 0)):
        pending.add(d)
    pending.drop_session("s_a", keep={id(kept)})
    assert pending.session("s_a") == [kept]
    pending.drop_session("s_a", keep=set())
    pending.drop_session("s_x")
    assert list(pending.sessions()) == ["s_b"]


def test_a_renamed_draft_replaced_in_a_sessions_list_is_the_one_taken() -> None:
    """texts.rename replaces drafts in the list `session` returns: the next commit takes the new ones."""
    pending = PendingEvents()
    old = draft("s_a", 0)
    pending.add(old)
    events = pending.session("s_a")
    events[0] = old._replace(rest=',"n":9}')
    assert pending.of(["s_a"]) == [events[0]] and pending.of(["s_a"])[0] is not old
    assert pending.session("s_b") == []
