"""Identifiers, made once by the server and stored as text (seed 000 §2.1: `m_` + uuid4().hex[:12]).

48 random bits are not unique by themselves (about one collision in 350 by a million messages), so no
caller relies on that: whoever stores a new id takes another when a row holds it already
(storage.repository: insert_messages, enqueue, insert_session), before any client sees it, so a
collision never surfaces as an error.
"""

from __future__ import annotations

from uuid import uuid4


def new_message_id() -> str:
    return "m_" + uuid4().hex[:12]


def new_turn_id() -> str:
    return "t_" + uuid4().hex[:12]


def new_session_id() -> str:
    return "s_" + uuid4().hex[:16]
