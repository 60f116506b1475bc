"""Live status: what each session's agent is doing right now (GET /v1/sessions/{session_id} shows it).

It is not stored: a session that runs no turn here is idle, and every change is also announced on the
stream as an agent_status event, which is what clients follow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from app.protocol.events import AgentState


@dataclass(frozen=True, slots=True)
class LiveStatus:
    agent_status: AgentState = "idle"
    turn_id: str | None = None


IDLE = LiveStatus()


class LiveStatusBoard(Protocol):
    """Each session's live status, written by the code that runs its turn.

    A multi-process implementation must make a status readable from every process (a shared store), and
    must not let a process that no longer owns the session's turn overwrite it: a status carries its turn
    id and expires with the turn's lease, so a session whose owner died reads idle once the lease has.
    """

    def get(self, session_id: str) -> LiveStatus: ...

    def set(self, session_id: str, status: LiveStatus) -> None: ...

    def forget(self, session_id: str) -> None: ...


class LocalLiveStatus:
    """This process's turns' statuses: every turn runs in this process."""

    def __init__(self) -> None:
        self._statuses: dict[str, LiveStatus] = {}

    def get(self, session_id: str) -> LiveStatus:
        return self._statuses.get(session_id, IDLE)

    def set(self, session_id: str, status: LiveStatus) -> None:
        if status.agent_status == "idle":
            self._statuses.pop(session_id, None)
        else:
            self._statuses[session_id] = status

    def forget(self, session_id: str) -> None:
        self._statuses.pop(session_id, None)
