"""Identifiers, made once by the server and stored as text (docs/protocol.md: `m_` + uuid4().hex[:12]).

The same random hex digits come from os.urandom, without building a UUID object (a fifth of the cost; a
turn makes several, one on the path of its first token).

48 random bits are not unique by themselves (about one collision in 350 by a million messages), so no
caller relies on that: whoever stores a new id takes another when a row holds it already
(storage.repository: insert_messages, enqueue, insert_session), before any client sees it, so a
collision never surfaces as an error.
"""

from __future__ import annotations

from os import urandom

# The ids' formats, as the spec states them for parameters that take one.
MESSAGE_ID_PATTERN = r"^m_[0-9a-f]{12}$"
TURN_ID_PATTERN = r"^t_[0-9a-f]{12}$"
SESSION_ID_PATTERN = r"^s_[0-9a-f]{16}$"


def new_message_id() -> str:
    return "m_" + urandom(6).hex()


def new_turn_id() -> str:
    return "t_" + urandom(6).hex()


def new_session_id() -> str:
    return "s_" + urandom(8).hex()


FILE_ID_PATTERN = r"^f_[0-9a-f]{16}$"


def new_file_id() -> str:
    return "f_" + urandom(8).hex()
